"""Many tasks (issue 14): 32 and 64 local tasks (no TF) started and round-tripped against
ipyparallel with the same engine count, and the controller keeping up with 64 tasks' telemetry.

    python -m bench.fleet [--tasks 32 64] [--repeat 2] [--rtt 20] [--telemetry-tasks 64]
                          [--seconds 20] [--quick] [--json PATH]

- *start and round trip*: ``bench.rtt``'s measure at each size (fresh cluster per tool per
  repeat, rotating order): ``Cluster(workers=n, preload=()).start()`` vs ipyparallel's
  ``start_and_connect_sync`` + ``wait_for_engines``; then ``x = 1`` to every task vs
  ``DirectView.execute(block=True)``. Goal: start and round trip at most ipyparallel's (1.0x).
- *telemetry*: one cluster of ``--telemetry-tasks`` tasks with its dashboard running (the compact
  view), every task in a ``tw.step()`` loop of 10 ms steps for ``--seconds``: 100 steps a
  second a task, each task's sample (CPU, RSS, network, its steps) once a second. Sampled every
  0.25 s on the controller: the age of each task's newest sample (``LiveStore``); at the end, the
  steps the store holds vs the steps the tasks made, the controller's CPU share and the
  dashboard's refresh time. Goals: newest sample never older than 2 intervals (2 s), 0 steps
  lost, controller under half a core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.rtt import measure
from bench.tools import percentile

LAG_GOAL_S = 2.0
CPU_GOAL = 0.5  # of one core
STEP_S = 0.01
CELL = ("import time\nimport tfdist_nb.worker as tw\n"
        "end = time.monotonic() + {seconds}\nn = 0\n"
        "while time.monotonic() < end:\n"
        "    with tw.step():\n"
        f"        time.sleep({STEP_S})\n"
        "    n += 1\n"
        "print('steps', n)")


def telemetry(n: int, seconds: float) -> dict[str, Any]:
    from tfdist_nb import Cluster

    with Cluster(workers=n, preload=()) as cluster:
        dashboard = cluster.dashboard()
        refresh_s: list[float] = []
        inner = dashboard._refresh

        def timed_refresh() -> bool:
            t0 = time.perf_counter()
            try:
                return inner()
            finally:
                refresh_s.append(time.perf_counter() - t0)

        dashboard._refresh = timed_refresh  # type: ignore[method-assign]
        names = [str(t) for t in cluster.tasks]
        lags: list[float] = []
        stop = threading.Event()
        busy = threading.Event()

        def sample() -> None:
            while not stop.wait(0.25):
                if not busy.is_set():
                    continue
                now = time.time()
                for name in names:
                    last = cluster.live.view(name).last_sample
                    if last is not None:
                        lags.append(now - last)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        proc = psutil.Process()
        cpu0 = proc.cpu_times()
        t0 = time.perf_counter()
        threading.Timer(2.0, busy.set).start()  # after every task's first sample of the cell
        result = cluster.run(CELL.format(seconds=seconds), timeout=seconds + 120)
        wall = time.perf_counter() - t0
        cpu1 = proc.cpu_times()
        stop.set()
        sampler.join()
        dashboard.stop()
        assert result.ok, result.summary()
        made = {str(t): int(r.stdout.split()[-1]) for t, r in result.tasks.items()}
        held = {name: cluster.live.view(name).step_count for name in names}
        lost = sum(max(0, made[name] - held[name]) for name in names)
        return {"tasks": n, "seconds": seconds, "wall_s": wall,
                "steps_made": sum(made.values()), "steps_lost": lost,
                "controller_cpu_share": ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system))
                / wall,
                "lag_median_s": statistics.median(lags), "lag_p99_s": percentile(lags, 0.99),
                "lag_max_s": max(lags), "lag_samples": len(lags),
                "dashboard_refresh_median_ms": 1000 * statistics.median(refresh_s),
                "dashboard_refresh_max_ms": 1000 * max(refresh_s),
                "dashboard_updates": dashboard.updates,
                "load_avg_end": os.getloadavg()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rtt", type=int, default=20, help="round trips per cluster")
    parser.add_argument("--telemetry-tasks", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="8 tasks, 1 repeat, 5 s (smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks, args.repeat, args.rtt, args.telemetry_tasks, args.seconds = [8], 1, 5, 8, 5
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    runs = []
    for n in args.tasks:
        res = measure(n, args.repeat, args.rtt, ["tfdist_nb", "ipyparallel"])
        res["start_ratio"] = res["start_s"]["tfdist_nb"] / res["start_s"]["ipyparallel"]
        runs.append(res)
        print(f"{n} tasks: start {res['start_s']['tfdist_nb']:.1f} s vs ipyparallel "
              f"{res['start_s']['ipyparallel']:.1f} s ({res['start_ratio']:.2f}x); round trip "
              f"{res['rtt_ms']['tfdist_nb']:.1f} ms vs {res['rtt_ms']['ipyparallel']:.1f} ms "
              f"({res['ratio']['silent_true']:.2f}x silent=True, "
              f"{res['ratio']['silent_false']:.2f}x silent=False)", flush=True)
    tel = telemetry(args.telemetry_tasks, args.seconds)
    print(f"telemetry, {tel['tasks']} tasks x {tel['seconds']:.0f} s of 10 ms steps: newest sample "
          f"age median {tel['lag_median_s']:.2f} s, p99 {tel['lag_p99_s']:.2f} s, max "
          f"{tel['lag_max_s']:.2f} s; {tel['steps_lost']} of {tel['steps_made']} steps lost; "
          f"controller {100 * tel['controller_cpu_share']:.0f}% of a core; dashboard refresh "
          f"median {tel['dashboard_refresh_median_ms']:.1f} ms (max "
          f"{tel['dashboard_refresh_max_ms']:.1f})", flush=True)
    results = {"runs": runs, "telemetry": tel}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
