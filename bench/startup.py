"""Start-to-TF-ready time and broadcast round trip, tfdist_nb vs ipyparallel in the same run.

    python -m bench.startup [--workers 2] [--repeat 3] [--rtt 50] [--quick] [--json PATH]

"TF-ready" means every task has finished ``import tensorflow``: for tfdist_nb that is what
``Cluster.start()`` returns after; for ipyparallel it is ``Cluster.start_and_connect_sync()`` plus
``DirectView.execute("import tensorflow", block=True)``. The round trip is a trivial cell
(``x = 1``) sent to every task and waited for: ``Cluster.run`` vs
``DirectView.execute(block=True)``.
Runs alternate between the two tools so drift on the machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _tfdist_start(n: int) -> tuple[float, Any]:
    from tfdist_nb import Cluster

    t0 = time.perf_counter()
    cluster = Cluster(workers=n).start()
    return time.perf_counter() - t0, cluster


def _tfdist_rtt(cluster: Any) -> float:
    t0 = time.perf_counter()
    result = cluster.run("x = 1")
    took = time.perf_counter() - t0
    assert result.ok, result.summary()
    return took


def _ipp_start(n: int) -> tuple[float, Any]:
    import ipyparallel as ipp

    t0 = time.perf_counter()
    cluster = ipp.Cluster(n=n, log_level=40)
    rc = cluster.start_and_connect_sync()
    rc.wait_for_engines(n, timeout=120)
    rc[:].execute("import tensorflow", block=True)
    return time.perf_counter() - t0, (cluster, rc)


def _ipp_rtt(handle: Any, silent: bool = True) -> float:
    _, rc = handle
    view = rc[:]
    t0 = time.perf_counter()
    view.execute("x = 1", silent=silent, block=True)
    return time.perf_counter() - t0


def _ipp_rtt_loud(handle: Any) -> float:
    """ipyparallel doing what a notebook cell does (history, execute_result): silent=False."""
    return _ipp_rtt(handle, silent=False)


def _ipp_stop(handle: Any) -> None:
    cluster, rc = handle
    rc.close()
    cluster.stop_cluster_sync()


def measure(n: int, repeat: int, rtt: int) -> dict[str, Any]:
    tools: dict[str, tuple[Callable, Callable, Callable]] = {
        "tfdist_nb": (_tfdist_start, _tfdist_rtt, lambda c: c.stop()),
        "ipyparallel": (_ipp_start, _ipp_rtt, _ipp_stop),
    }
    extra_rtt = {"ipyparallel": ("ipyparallel_silent_false", _ipp_rtt_loud)}
    starts: dict[str, list[float]] = {k: [] for k in tools}
    rtts: dict[str, list[float]] = {k: [] for k in [*tools, "ipyparallel_silent_false"]}
    for i in range(repeat):
        order = list(tools) if i % 2 == 0 else list(reversed(tools))
        for name in order:
            start, roundtrip, stop = tools[name]
            took, handle = start(n)
            starts[name].append(took)
            try:
                roundtrip(handle)  # warm-up
                rtts[name].extend(roundtrip(handle) for _ in range(rtt))
                if name in extra_rtt:
                    key, loud = extra_rtt[name]
                    rtts[key].extend(loud(handle) for _ in range(rtt))
            finally:
                stop(handle)
    return {
        "workers": n,
        "start_s": {k: statistics.median(v) for k, v in starts.items()},
        "start_all_s": starts,
        "rtt_ms": {k: 1000 * statistics.median(v) for k, v in rtts.items()},
        "rtt_p90_ms": {k: 1000 * sorted(v)[int(0.9 * (len(v) - 1))] for k, v in rtts.items()},
    }


def report(res: dict[str, Any]) -> str:
    s, r = res["start_s"], res["rtt_ms"]
    return "\n".join([
        f"{res['workers']} workers            tfdist_nb   ipyparallel   ratio",
        f"start to TF-ready (s)  {s['tfdist_nb']:9.2f}   {s['ipyparallel']:11.2f}   "
        f"{s['tfdist_nb'] / s['ipyparallel']:5.2f}x",
        f"'x = 1' round trip (ms){r['tfdist_nb']:9.1f}   {r['ipyparallel']:11.1f}   "
        f"{r['tfdist_nb'] / r['ipyparallel']:5.2f}x   (ipyparallel default silent=True)",
        f"  same, ipyparallel silent=False  {r['ipyparallel_silent_false']:11.1f}   "
        f"{r['tfdist_nb'] / r['ipyparallel_silent_false']:5.2f}x   (history + execute_result, "
        "as a notebook cell)",
    ])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rtt", type=int, default=50, help="round trips per cluster")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 5 round trips (CI smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.rtt = 1, 5
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    results = {"machine": {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                           "platform": platform.platform()},
               "runs": [measure(n, args.repeat, args.rtt) for n in args.workers]}
    for res in results["runs"]:
        print(report(res))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
