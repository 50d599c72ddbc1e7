"""The network check's all-reduce bandwidth next to the same all-reduce in plain processes,
and what the private network costs next to the host's.

    python -m bench.network [--workers 2] [--sizes 1 16 64] [--repeat 3] [--quick] [--json PATH]

(a) ``%tfdist_check network`` on a tfdist_nb cluster whose cell made a
MultiWorkerMirroredStrategy: its all-reduce of each size through that strategy; (b) the same
all-reduce, timed the same way (one warm-up, best of the rest), in plain ``python -c`` processes
given TF_CONFIG, which is what a user would write to measure it. The ratio of bus bandwidths
says whether the check reports what the cluster can do (goal: within 0.9x-1.1x).

(c) The tfdist_nb side runs once on the private network (``net="private"``, through
slirp4netns where installed) and once on the host's (``net="host"``), each a cold start
(``warm=False``, ``fork=False``: no spare or fork server carries a cost from one to the other):
the start's seconds and the all-reduce side by side, and the private network's own making
(namespace and slirp4netns, median of 5) in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tfdist_nb.cluster.tfconfig import build_tf_config
from tfdist_nb.launchers import ports
from tfdist_nb.topology import ClusterSpec

PLAIN = """
import json, time
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
n = strategy.num_replicas_in_sync
rows = []
for mb in {sizes}:
    value = tf.ones([int(mb * 2**20 / 4)], tf.float32)
    def reduce(v=value):
        return tf.distribute.get_replica_context().all_reduce("sum", v)
    best = None
    for _ in range({repeat} + 1):
        t0 = time.perf_counter()
        out = strategy.run(reduce)
        _ = strategy.experimental_local_results(out)[0].numpy()[:1]
        took = time.perf_counter() - t0
        best = took if best is None or took < best else best
    algbw = mb / 1024 / best
    rows.append({{"size_mb": mb, "busbw_gb_s": algbw * 2 * (n - 1) / n}})
print("BENCH", json.dumps(rows))
"""


NETS = ("private", "host")


def run_tfdist(n: int, sizes: list[float],
               net: str = "private") -> tuple[float, dict[float, float]]:
    """The cold start's seconds and the check's bus bandwidth per size, on network ``net``."""
    from tfdist_nb import Cluster
    from tfdist_nb.cluster import checks

    checks.BANDWIDTH_SIZES_MB = tuple(sizes)
    cluster = Cluster(workers=n, warm=False, launcher_options={"net": net, "fork": False})
    began = time.perf_counter()
    with cluster.start(announce=False):
        start_s = time.perf_counter() - began
        made = cluster.run("import tensorflow as tf\n"
                           "strategy = tf.distribute.MultiWorkerMirroredStrategy()")
        assert made.ok, made.summary()
        report = cluster.check("network")
        assert report.ok, report
        bw = report.bandwidth
        return start_s, dict(zip(bw["size_mb"], bw["busbw_gb_s"], strict=True))


def namespace_ms(repeat: int = 5) -> float | None:
    """The private network's own making (namespace, loopback, slirp4netns), median ms; None
    where this machine cannot make one."""
    from tfdist_nb.launchers import private_net

    took = []
    for _ in range(repeat):
        began = time.perf_counter()
        try:
            net = private_net.create()
        except private_net.PrivateNetUnavailable:
            return None
        took.append((time.perf_counter() - began) * 1000)
        net.close()
    return statistics.median(took)


def run_plain(n: int, sizes: list[float], repeat: int) -> dict[float, float]:
    spec = ClusterSpec(workers=n)
    chosen = ports.reserve(n)
    try:
        addresses = {t: f"localhost:{p}" for t, p in zip(spec.tasks, chosen, strict=True)}
        procs = []
        for task in spec.tasks:
            env = {**os.environ, "TF_CONFIG": build_tf_config(task, addresses)}
            procs.append(subprocess.Popen(
                [sys.executable, "-c", PLAIN.format(sizes=sizes, repeat=repeat)], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        outs = [p.communicate(timeout=600)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        line = next(x for x in outs[0].splitlines() if x.startswith("BENCH "))
        return {r["size_mb"]: r["busbw_gb_s"] for r in json.loads(line[6:])}
    finally:
        ports.release(chosen)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1.0, 16.0, 64.0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side, alternated")
    parser.add_argument("--quick", action="store_true", help="1 run, 1 and 4 MB (CI smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.sizes = 1, [1.0, 4.0]
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    runs: dict[str, list[dict[float, float]]] = {"tfdist_nb": [], "plain": [], "host": []}
    starts: dict[str, list[float]] = {"private": [], "host": []}
    for i in range(args.repeat):
        order = ["tfdist_nb", "host", "plain"] if i % 2 == 0 else ["plain", "host", "tfdist_nb"]
        for name in order:
            if name == "plain":
                runs[name].append(run_plain(args.workers, args.sizes, 3))
                continue
            net = "private" if name == "tfdist_nb" else "host"
            start_s, bw = run_tfdist(args.workers, args.sizes, net)
            starts[net].append(start_s)
            runs[name].append(bw)
    rows = []
    print(f"{args.workers} workers   size (MB)   check busbw (GB/s)   plain busbw   ratio   "
          "host-network busbw   private/host")
    for mb in args.sizes:
        ours = statistics.median(r[mb] for r in runs["tfdist_nb"])
        plain = statistics.median(r[mb] for r in runs["plain"])
        host = statistics.median(r[mb] for r in runs["host"])
        rows.append({"size_mb": mb, "tfdist_nb": ours, "plain": plain, "ratio": ours / plain,
                     "host": host, "private_vs_host": ours / host})
        print(f"{'':11} {mb:9g}   {ours:18.3f}   {plain:11.3f}   {ours / plain:5.2f}x   "
              f"{host:18.3f}   {ours / host:5.2f}x")
    start = {net: statistics.median(v) for net, v in starts.items()}
    made_ms = namespace_ms()
    print(f"cold start: private network {start['private']:.2f} s, host network "
          f"{start['host']:.2f} s ({start['private'] / start['host']:.2f}x); the private "
          f"network's making: {'not possible here' if made_ms is None else f'{made_ms:.1f} ms'}")
    results = {"workers": args.workers, "rows": rows, "start_s": start,
               "namespace_ms": made_ms}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
