"""Broadcast round trip of a trivial cell (``x = 1``) at several cluster sizes, tfdist_nb vs
ipyparallel (vs hand-rolled jupyter_client kernels), in the same run.

    python -m bench.rtt [--tasks 2 8 16] [--repeat 3] [--rtt 50] [--quick] [--json PATH]

The kernels import no TensorFlow (``Cluster(workers=n, preload=())``, ipyparallel engines as
started, plain ipykernels), so 16 tasks fit on a small machine and the numbers are the cost of
the broadcast path alone. A round trip is the cell sent to every task and waited for until every
task replied and its output is complete: ``Cluster.run`` vs ``DirectView.execute(block=True)``
with ``silent=True`` (its default: no history, no ``execute_result``) and ``silent=False`` (what a
notebook cell does, the like-for-like one) vs ``execute`` + reply + idle on each
``AsyncKernelClient``. Each size starts a fresh cluster per tool per repeat, in rotating order.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.tools import TOOLS, percentile, rotated, start

ALT = "ipyparallel"
LOUD = "ipyparallel_silent_false"
WARMUP = 3
SETTLE_S = 1.0  # after a start, let the machine go quiet before timing


def measure(n: int, repeat: int, rtt: int, tools: list[str]) -> dict[str, Any]:
    keys = [*tools] + ([LOUD] if ALT in tools else [])
    samples: dict[str, list[float]] = {k: [] for k in keys}
    per_cluster: dict[str, list[float]] = {k: [] for k in keys}  # medians: cluster-to-cluster
    start_s: dict[str, list[float]] = {k: [] for k in tools}
    failures: list[str] = []
    for i in range(repeat):
        for name in rotated(tools, i):
            tool = TOOLS[name]
            started = start(name, n, False, failures)
            start_s[name].append(started.took_s)
            try:
                time.sleep(SETTLE_S)
                for _ in range(WARMUP):
                    tool.rtt(started.handle)
                got = {name: [tool.rtt(started.handle) for _ in range(rtt)]}
                if name == ALT:
                    for _ in range(WARMUP):
                        tool.rtt_loud(started.handle)
                    got[LOUD] = [tool.rtt_loud(started.handle) for _ in range(rtt)]
                for key, values in got.items():
                    samples[key].extend(values)
                    per_cluster[key].append(1000 * statistics.median(values))
            finally:
                tool.stop(started.handle)
    med = {k: 1000 * statistics.median(v) for k, v in samples.items()}
    p90 = {k: 1000 * percentile(v, 0.9) for k, v in samples.items()}
    out: dict[str, Any] = {"tasks": n, "rtt_ms": med, "rtt_p90_ms": p90,
                           "start_s": {k: statistics.median(v) for k, v in start_s.items()},
                           "cluster_medians_ms": per_cluster, "start_failures": failures,
                           "samples": len(next(iter(samples.values())))}
    if ALT in tools and "tfdist_nb" in tools:
        out["ratio"] = {"silent_true": med["tfdist_nb"] / med[ALT],
                        "silent_false": med["tfdist_nb"] / med[LOUD],
                        "p90_silent_true": p90["tfdist_nb"] / p90[ALT],
                        "p90_silent_false": p90["tfdist_nb"] / p90[LOUD]}
    return out


def report(runs: list[dict[str, Any]]) -> str:
    keys = list(runs[0]["rtt_ms"])
    head = "'x = 1' round trip (ms)  " + "".join(f"{k:>26}" for k in keys)
    lines = [head]
    for res in runs:
        lines.append(f"{res['tasks']:3d} tasks, median      "
                     + "".join(f"{res['rtt_ms'][k]:26.1f}" for k in keys))
        lines.append("           p90         "
                     + "".join(f"{res['rtt_p90_ms'][k]:26.1f}" for k in keys))
        if "ratio" in res:
            r = res["ratio"]
            lines.append(f"           ratio tfdist_nb / ipyparallel: {r['silent_true']:.2f}x "
                         f"(silent=True), {r['silent_false']:.2f}x (silent=False); p90 "
                         f"{r['p90_silent_true']:.2f}x / {r['p90_silent_false']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[2, 8, 16])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rtt", type=int, default=50, help="round trips per cluster")
    # tfdist_nb_next is a start measure: without TensorFlow (preload=()) nothing is forked
    parser.add_argument("--tools", nargs="+", choices=list(TOOLS),
                        default=[t for t in TOOLS if t != "tfdist_nb_next"])
    parser.add_argument("--quick", action="store_true", help="1 repeat, 10 round trips (smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.rtt = 1, 10
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    runs = []
    for n in args.tasks:
        runs.append(measure(n, args.repeat, args.rtt, args.tools))
        print(report(runs[-1:]), flush=True)
    results = {"runs": runs}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
