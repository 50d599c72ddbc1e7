"""The controller at scale (issue 40): 2-32 real workers and 64-1,024 simulated tasks.

    python -m bench.scale [--sim 64 256 1024] [--real 2 4] [--idle-s 10] [--quick] [--json PATH]

Simulated tasks (``tests/support/simulated_task.py``, 64 to an OS process) speak the worker
kernel's protocol, the agent's RPC, heartbeats, telemetry and the collective ledger without
TensorFlow, so the controller does for them what it does for real tasks. For each size, one
cluster, in order:

- *start (s)*: ``Cluster(...).start()`` until every task is ready;
- *strategy (s)*: the cell that makes the strategy (real: ``MultiWorkerMirroredStrategy()``;
  simulated: the ``strategy`` command, its start-up ledger row);
- *hang named / cell end after the raise (s)*: the last task raises before an all-reduce the
  others wait in; from its error (the kernel's ``error_at``) to the hang's alert naming it (the
  ``hang`` note's time, culprit checked), and to the cell's end, every waiter released;
- *controller CPU while idle (cores)*: this process's CPU time over ``--idle-s`` with nothing
  running, divided by the wall time (the tasks' own processes are not counted);
- *memory per task (MB)*: this process's RSS growth from before the start to the idle
  measurement, divided by the tasks;
- *reads (ms)*: ``status()``, ``collectives()``, the dashboard's compact view built and
  refreshed, and the JupyterLab pane's state (its ``ClusterWatch`` reading the run directory
  from the start, as a pane opened now does).

Ratios are to the 2-task row of the same kind (real: 2 real workers; simulated: 64 tasks when 2
is not run). Goals (issue 40): the hang named <= 2 s after the fact at 1,024 tasks; idle
<= 0.5 core at 1,024 and <= 0.05 at 32; every read < 1 s at 1,024.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from tfdist_nb import Cluster
from tfdist_nb.events import HANG, TaskNote

HANG_GOAL_S = 2.0
READ_GOAL_S = 1.0
REAL = {"strategy": "import tensorflow as tf\n"
                    "strategy = tf.distribute.MultiWorkerMirroredStrategy()",
        "raise": "x = strategy.reduce('SUM', tf.constant(1.0), axis=None)\n"
                 "if tw.task == {culprit!r}:\n    raise ValueError('bad batch on this task')\n"
                 "y = strategy.reduce('SUM', tf.constant(2.0), axis=None)",
        "setup": "import tfdist_nb.worker as tw"}
SIM = {"strategy": "strategy", "raise": "steps 1 1\n{name}> raise ValueError: bad batch\nwait",
       "setup": "print ready"}


def _timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def measure(n: int, simulated: bool, idle_s: float) -> dict[str, Any]:
    proc = psutil.Process()
    gc.collect()
    rss0 = proc.memory_info().rss
    cells = SIM if simulated else REAL
    if simulated:
        from tests.support.sim_launcher import SimulatedLauncher

        cluster = Cluster(workers=n, launcher=SimulatedLauncher(), preload=(), warm=False,
                          start_timeout=600)
    else:
        cluster = Cluster(workers=n, warm=False)
    row: dict[str, Any] = {"tasks": n, "simulated": simulated}
    _, row["start_s"] = _timed(cluster.start)
    with cluster as c:
        assert c.run(cells["setup"], timeout=120).ok
        r, row["strategy_s"] = _timed(lambda: c.run(cells["strategy"], timeout=300))
        assert r.ok, r.summary()
        culprit = f"worker:{n - 1}"
        code = cells["raise"].format(name=culprit, culprit=("worker", n - 1))
        named: list[float] = []  # when the hang's alert was made (the note's own time)
        r = c.run(code, timeout=300, on_event=lambda e: named.append(e.time)
                  if isinstance(e, TaskNote) and e.topic == HANG else None)
        ended = time.time()
        said = r.tasks[culprit]
        assert r.hang is not None and r.hang.culprit == culprit, r.summary()
        row["raise_to_named_s"] = named[0] - (said.error_at or ended)
        row["raise_to_end_s"] = ended - (said.error_at or ended)
        row["hang_rule"] = str(r.hang.rule)
        time.sleep(2.0)  # what the cell left settles
        cpu0, t0 = proc.cpu_times(), time.perf_counter()
        time.sleep(idle_s)
        cpu1, wall = proc.cpu_times(), time.perf_counter() - t0
        row["idle_cores"] = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall
        row["mb_per_task"] = (proc.memory_info().rss - rss0) / 2**20 / n
        _, row["status_s"] = _timed(c.status)
        _, row["collectives_s"] = _timed(c.collectives)
        dash, row["dashboard_build_s"] = _timed(lambda: c.dashboard(start=False))
        _, row["dashboard_refresh_s"] = _timed(dash.refresh)
        row["dashboard_compact"] = bool(dash.compact)
        from tfdist_nb.lab.model import ClusterWatch

        def pane() -> dict[str, Any]:
            watch = ClusterWatch(c.id, Path(c.run_dir))
            watch.refresh_state()
            watch.poll()
            return watch.detail()

        _, row["pane_s"] = _timed(pane)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sim", type=int, nargs="*", default=[64, 256, 1024])
    parser.add_argument("--real", type=int, nargs="*", default=[])
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="8 simulated tasks (smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.sim, args.real, args.idle_s = [8], [], 2.0
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    rows: list[dict[str, Any]] = []
    for n, kind in [(n, False) for n in args.real] + [(n, True) for n in args.sim]:
        try:
            r = measure(n, kind, args.idle_s)
        except Exception as exc:  # a size that does not start is a result too
            print(f"{n:5d} {'simulated' if kind else 'real':9s}: FAILED {exc}", flush=True)
            rows.append({"tasks": n, "simulated": kind, "failed": str(exc)})
            continue
        rows.append(r)
        base = next(b for b in rows if b["simulated"] is kind and "failed" not in b)
        r["ratio"] = {k: r[k] / base[k] if base[k] else None
                      for k in ("start_s", "strategy_s", "raise_to_named_s", "raise_to_end_s",
                                "idle_cores")}
        print(f"{r['tasks']:5d} {'simulated' if kind else 'real':9s}: start "
              f"{r['start_s']:.2f} s, strategy {r['strategy_s']:.2f} s, raise to named "
              f"{r['raise_to_named_s']:.2f} s, to end {r['raise_to_end_s']:.2f} s "
              f"({r['hang_rule']}), idle {r['idle_cores']:.3f} "
              f"cores, {r['mb_per_task']:.2f} MB/task; status {r['status_s'] * 1e3:.0f} ms, "
              f"collectives {r['collectives_s'] * 1e3:.0f} ms, dashboard "
              f"{r['dashboard_build_s'] * 1e3:.0f}/{r['dashboard_refresh_s'] * 1e3:.0f} ms, "
              f"pane {r['pane_s'] * 1e3:.0f} ms", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return {"rows": rows}


if __name__ == "__main__":
    main()
