"""An output flood: N lines per task, printed as fast as Python can.

    python -m bench.flood [--workers 2] [--lines 100000] [--quick] [--json PATH]

Measures for tfdist_nb (worker kernels -> run directory, live store and dashboard) and, in the
same run, for ipyparallel (``DirectView.execute(..., silent=False, block=True)``, which gathers
the output in memory): wall time, the controller's CPU seconds and peak RSS growth, and lines
lost (every line is checked by its number). A second tfdist_nb flood writes its lines in turn
through print, sys.stderr and os.write(1, ...) and counts lines out of order on disk (ipyparallel
does not capture file-descriptor writes, so it has no counterpart).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

CODE = "for i in range({n}): print(i)"
# The same count of lines written in turn through Python's stdout, its stderr and straight to
# file descriptor 1 (what tf.print and TensorFlow's C++ log do): each task's lines must arrive
# in the order it wrote them, on disk as live (docs/reference.md, "Output order and time")
MIXED = """
import os, sys
for i in range({n}):
    k = i % 3
    if k == 0:
        print(i)
    elif k == 1:
        sys.stderr.write(f"{{i}}\\n")
    else:
        os.write(1, f"{{i}}\\n".encode())
"""


class PeakRss:
    """Samples this process's RSS every 20 ms on a thread; ``growth_mb`` is peak minus start."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.start = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def _measure(flood: Callable[[], int], expected: int) -> dict[str, Any]:
    cpu0 = psutil.Process().cpu_times()
    t0 = time.perf_counter()
    with PeakRss() as rss:
        got = flood()
    wall = time.perf_counter() - t0
    cpu1 = psutil.Process().cpu_times()
    return {"wall_s": wall, "controller_cpu_s": (cpu1.user + cpu1.system)
            - (cpu0.user + cpu0.system), "peak_rss_growth_mb": rss.growth_mb,
            "lines_lost": expected - got}


def tfdist(n_workers: int, lines: int) -> dict[str, Any]:
    from tfdist_nb import Cluster

    with Cluster(workers=n_workers, preload=()) as cluster:
        dashboard = cluster.dashboard()

        def flood() -> int:
            assert cluster.run(CODE.format(n=lines), timeout=900).ok
            return _count_on_disk(cluster.run_dir / "events.jsonl", lines)

        out = _measure(flood, lines * n_workers)
        dashboard.stop()
        out["dashboard_updates"] = dashboard.updates
        return out


def tfdist_interleaved(n_workers: int, lines: int) -> dict[str, Any]:
    """The mixed flood: also counts, per task, lines that arrived after a line written later,
    and times that go backwards."""
    from tfdist_nb import Cluster

    with Cluster(workers=n_workers, preload=()) as cluster:
        order: dict[str, Any] = {}

        def flood() -> int:
            assert cluster.run(MIXED.format(n=lines), timeout=900).ok
            order.update(_order_on_disk(cluster.run_dir / "events.jsonl", lines))
            return order.pop("count")

        out = _measure(flood, lines * n_workers)
        return {**out, **order}


def _order_on_disk(path: Any, lines: int) -> dict[str, int]:
    """``count`` (distinct numbered lines), ``out_of_order`` (lines whose number is below one
    already seen from the same task) and ``time_back`` (lines stamped before the line before)."""
    seen: dict[str, set[int]] = {}
    top: dict[str, int] = {}
    last_t: dict[str, float] = {}
    late = back = 0
    with open(path) as f:
        for raw in f:
            rec = json.loads(raw)
            if rec.get("kind") != "output" or not str(rec.get("text", "")).isdigit():
                continue
            task, i = rec["task"], int(rec["text"])
            if i < top.get(task, -1):
                late += 1
            top[task] = max(top.get(task, -1), i)
            if rec["time"] < last_t.get(task, float("-inf")):
                back += 1
            last_t[task] = rec["time"]
            seen.setdefault(task, set()).add(i)
    count = sum(len(v & set(range(lines))) for v in seen.values())
    return {"count": count, "out_of_order": late, "time_back": back}


def _count_on_disk(path: Any, lines: int) -> int:
    seen: dict[str, list[int]] = {}
    with open(path) as f:
        for raw in f:
            rec = json.loads(raw)
            if rec.get("kind") == "output" and rec.get("stream") == "stdout":
                seen.setdefault(rec["task"], []).append(int(rec["text"]))
    return sum(len(set(v) & set(range(lines))) for v in seen.values())


def ipyparallel(n_workers: int, lines: int) -> dict[str, Any]:
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=n_workers, log_level=40)
    rc = cluster.start_and_connect_sync()
    try:
        rc.wait_for_engines(n_workers, timeout=120)

        def flood() -> int:
            ar = rc[:].execute(CODE.format(n=lines), silent=False, block=False)
            ar.get(timeout=900)
            return sum(len(set(out.split()) & {str(i) for i in range(lines)})
                       for out in ar.stdout)

        return _measure(flood, lines * n_workers)
    finally:
        rc.close()
        cluster.stop_cluster_sync()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="10k lines (CI smoke)")
    parser.add_argument("--no-ipyparallel", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.lines = 10_000
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    results = {"tfdist_nb": tfdist(args.workers, args.lines),
               "interleaved": tfdist_interleaved(args.workers, args.lines)}
    if not args.no_ipyparallel:
        results["ipyparallel"] = ipyparallel(args.workers, args.lines)
    print(f"{args.lines} lines x {args.workers} tasks   wall s   controller CPU s   "
          "peak RSS +MB   lines lost")
    for name, r in results.items():
        print(f"{name:22s} {r['wall_s']:7.2f}   {r['controller_cpu_s']:16.2f}   "
              f"{r['peak_rss_growth_mb']:12.1f}   {r['lines_lost']:10d}")
    mixed = results["interleaved"]
    print(f"interleaved print / stderr / os.write: {mixed['out_of_order']} line(s) out of "
          f"order, {mixed['time_back']} stamped before the line before")
    if args.json:
        args.json.write_text(json.dumps({"workers": args.workers, "lines": args.lines,
                                         **results}, indent=1))
    return results


if __name__ == "__main__":
    main()
