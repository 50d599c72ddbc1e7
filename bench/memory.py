"""What a default 2-worker cluster holds in memory, against two plain processes that import
TensorFlow (the least a user could run instead), in the same run.

    python -m bench.memory [--workers 2] [--quick] [--json PATH]

Memory is PSS (proportional set size: a page shared by k processes counts 1/k in each), summed
over every process the cluster runs: the fork server, the tasks forked from it, the spares and
the private network's helpers. Forked tasks share the fork server's TensorFlow pages, which RSS
would count once per process; PSS counts them once in all. The controller's own growth (the
notebook's process: tfdist_nb, jupyter_client, ZeroMQ) is measured apart, as RSS before and after.
Configurations: the default (spares on), ``warm=False`` (what the Binder configuration runs),
and ``TFDIST_FORK=off`` (each task imports TensorFlow itself, as on macOS).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import psutil

PLAIN = ("import tensorflow as tf, time; tf.constant(1.0) + 1; print('ok', flush=True); "
         "time.sleep(600)")


def tree_pss_mb(root: int) -> tuple[float, int]:
    """PSS of every descendant of ``root`` (not ``root`` itself), MB, and how many there are."""
    total, count = 0, 0
    for child in psutil.Process(root).children(recursive=True):
        try:
            total += child.memory_full_info().pss
            count += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / 2**20, count


def settle(cluster: Any, timeout: float = 180.0) -> dict[str, Any]:
    """Wait until every spare the pool wants is ready (the default keeps them; on a busy
    machine the pool waits for an idle core, so run this on a quiet one), then a second more;
    the pool's state."""
    deadline = time.monotonic() + timeout
    spares = cluster.snapshot().spares
    while (spares.get("note") != "off" and spares.get("ready", 0) < spares.get("count", 0)
           and time.monotonic() < deadline):
        time.sleep(0.5)
        spares = cluster.snapshot().spares
    time.sleep(1.0)
    return dict(spares)


def measure_cluster(workers: int, **options: Any) -> dict[str, Any]:
    from tfdist_nb import Cluster

    me = psutil.Process()
    rss0 = me.memory_info().rss
    with Cluster(workers=workers, **options) as c:
        r = c.run("import tensorflow as tf\nx = tf.constant(1.0) + 1")
        assert r.ok, r.summary()
        spares = settle(c)
        pss, processes = tree_pss_mb(os.getpid())
        rss1 = me.memory_info().rss
    return {"pss_mb": round(pss, 1), "processes": processes,
            "spares_ready": spares.get("ready", 0), "spares_note": spares.get("note"),
            "controller_growth_mb": round((rss1 - rss0) / 2**20, 1)}


def measure_plain(workers: int) -> dict[str, Any]:
    procs = [subprocess.Popen([sys.executable, "-c", PLAIN], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
             for _ in range(workers)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ok"
        pss = sum(psutil.Process(p.pid).memory_full_info().pss for p in procs) / 2**20
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return {"pss_mb": round(pss, 1), "processes": workers}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the default configuration only")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"workers": args.workers, "plain": measure_plain(args.workers)}
    out["default"] = measure_cluster(args.workers)
    if not args.quick:
        out["no_spares"] = measure_cluster(args.workers, warm=False)
        os.environ["TFDIST_FORK"] = "off"
        try:
            out["no_fork_no_spares"] = measure_cluster(args.workers, warm=False)
        finally:
            del os.environ["TFDIST_FORK"]
    plain = out["plain"]["pss_mb"]
    print(f"{'configuration':<22}{'PSS MB':>9}{'processes':>11}{'x plain':>9}  controller +MB")
    for name in ("plain", "default", "no_spares", "no_fork_no_spares"):
        if name in out:
            r = out[name]
            print(f"{name:<22}{r['pss_mb']:>9.0f}{r['processes']:>11}"
                  f"{r['pss_mb'] / plain:>9.2f}  {r.get('controller_growth_mb', '')}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
