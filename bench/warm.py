"""Restart and resize with spare kernels (issue 13) vs cold starts and ipyparallel, in one run.

    python -m bench.warm [--repeat 3] [--step-repeat 5] [--steps 300] [--quick] [--json PATH]

Every measure ends with a new MultiWorkerMirroredStrategy made on every task (``STRATEGY``):
that is what a restart is for (a second strategy needs fresh processes, and so does one after a
failed collective).

- *cold start*: ``Cluster(workers=2).start()`` + the strategy, with no fork server up (each is
  closed first): the cluster's own first start, its server importing TensorFlow.
- *warm restart*: that cluster, after it made its strategy and its spares are ready:
  ``restart()`` + a new strategy. Goal: <= 0.15x of the cold start, <= 0.1x of ipyparallel.
- *restart, no spares*: the same with ``warm=False``: the new tasks are forked from the fork
  server (docs/design.md, "Fork server"); *spawned*: also ``fork=False``, each new task imports
  TensorFlow itself (what a restart cost before spares and the fork server).
- *ipyparallel*: a running 2-engine cluster with TensorFlow imported: ``restart_engines`` (stop
  + start engines, the controller stays up) + ``import tensorflow`` on the new engines, as the
  issue measured it (no strategy: its engines have no TF_CONFIG).
- *warm resize 2 -> 1*: what ``%%tfcluster 1 worker`` does on a 2-worker cluster with ready
  spares (a new ``Cluster(workers=1)``, ``old.stop(keep_spares=True)``, ``new.start()``) + a new
  strategy. Goal: <= 0.2x of a cold start of the 1-worker cluster (+ strategy); the cold resize
  (the same with ``warm=False``) is reported too.
- *training after restart*: the median step of ``bench.training``'s MWMS loop on tasks adopted
  from spares vs tasks started cold, ``--step-repeat`` pairs in alternating order (step times
  on 2 cores move by 10-30% with anything else running; the 1-minute load is kept with each).
  Goal: <= 1.02x.

- *restart as users do it*: the same cluster 2 s after the cell that made its strategy ended,
  spares not waited for (``usual``), and right after the hang rules named a task that raised
  while the other waited in an all-reduce (``after_hang``): ``restart()`` + a new strategy,
  against the cold start. The same goal; whatever spares were ready by then were taken.

Except for those two, spares are waited for (untimed) before every timed warm operation, so no
spare is being warmed while the restart or resize itself is timed. Spares start as soon as a
cluster is up, so the cold start of a warm cluster (``cold_start``) includes its strategy cell
running beside the spares' first steps, as a user's does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.startup import machine, warm_up
from bench.tools import Ipyparallel
from bench.training import TRAIN, _medians

STRATEGY = ("import tensorflow as tf\n"
            "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
            "print('replicas', strategy.num_replicas_in_sync)")
RESTART_GOAL = 0.15
IPP_GOAL = 0.10
RESIZE_GOAL = 0.20
STEP_GOAL = 1.02
SPARES_TIMEOUT_S = 300.0


def _strategy(cluster: Any) -> None:
    result = cluster.run(STRATEGY, timeout=300)
    assert result.ok, result.summary()


def _wait_spares(cluster: Any, n: int) -> float:
    """Untimed: until ``n`` spares are ready (nothing warms while the next measure runs)."""
    t0 = time.perf_counter()
    while cluster.spares()["ready"] < n or cluster.spares()["warming"]:
        if time.perf_counter() - t0 > SPARES_TIMEOUT_S:
            raise TimeoutError(f"spares not ready after {SPARES_TIMEOUT_S:.0f}s: "
                               f"{cluster.spares()}")
        time.sleep(0.1)
    return time.perf_counter() - t0


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def cold_start(n: int, warm: bool, fork: bool = True) -> tuple[float, Any]:
    """A first start: no fork server is up, so its own (or, ``fork=False``, every task) imports
    TensorFlow inside the time."""
    from tfdist_nb import Cluster
    from tfdist_nb.launchers import forkserver

    forkserver.close_all()

    def go() -> Any:
        cluster = Cluster(workers=n, warm=None if warm else False,
                          launcher_options={"fork": fork}).start()
        _strategy(cluster)
        return cluster

    return _timed(go)


def warm_restart(cluster: Any) -> dict[str, float]:
    """``restart()`` + a new strategy on a cluster whose spares are ready."""
    pids = set(cluster.spares()["pids"])
    restart_s, _ = _timed(cluster.restart)
    strategy_s, _ = _timed(lambda: _strategy(cluster))
    adopted = {rt.pid for rt in cluster.tasks.values()} <= pids
    assert adopted, f"the restart did not take the spares: {cluster.warm_outcome}"
    return {"total_s": restart_s + strategy_s, "restart_s": restart_s, "strategy_s": strategy_s}


RAISES = ("if tw.task[1] == 1:\n    raise ValueError('bad batch on this task')\n"
          "strategy.reduce('SUM', tf.constant(1.0), axis=None)")


def usual_restart(cluster: Any, after_hang: bool) -> dict[str, Any]:
    """``restart()`` + a new strategy, as a user does it: 2 s after the strategy's cell ended,
    or (``after_hang``) at once after a cell whose hang was named; spares not waited for."""
    if after_hang:
        hung = cluster.run("import tfdist_nb.worker as tw\n" + RAISES, timeout=120)
        assert not hung.ok and hung.cause, hung.summary()
    else:
        time.sleep(2.0)  # the scenario: the user reads the output, then restarts
    ready = cluster.spares()["ready"]
    restart_s, _ = _timed(cluster.restart)
    strategy_s, _ = _timed(lambda: _strategy(cluster))
    return {"total_s": restart_s + strategy_s, "restart_s": restart_s, "strategy_s": strategy_s,
            "spares_ready": ready, "note": str(cluster.warm_outcome)}


def cold_restart(cluster: Any) -> dict[str, float]:
    restart_s, _ = _timed(cluster.restart)
    strategy_s, _ = _timed(lambda: _strategy(cluster))
    return {"total_s": restart_s + strategy_s, "restart_s": restart_s, "strategy_s": strategy_s}


def resize(old: Any, n: int, warm: bool) -> tuple[dict[str, float], Any]:
    """What ``%%tfcluster <n> workers`` does to a running cluster, + a new strategy."""
    from tfdist_nb import Cluster

    t0 = time.perf_counter()
    new = Cluster(workers=n, warm=None if warm else False)
    old.stop(keep_spares=warm)
    stopped = time.perf_counter()
    new.start()
    started = time.perf_counter()
    _strategy(new)
    done = time.perf_counter()
    if warm:
        assert "from spare" in str(new.warm_outcome), new.warm_outcome
    return ({"total_s": done - t0, "stop_s": stopped - t0, "start_s": started - stopped,
             "strategy_s": done - started}, new)


def ipyparallel_restart(n: int) -> dict[str, float]:
    """A running ipyparallel cluster with TF imported: restart its engines, import TF again."""
    tool = Ipyparallel()
    started = tool.start(n, tf=True)
    cluster, rc = started.handle
    try:
        old = set(rc.ids)
        t0 = time.perf_counter()
        cluster.restart_engines_sync()
        deadline = time.perf_counter() + 300
        while len(set(rc.ids) - old) < n:
            if time.perf_counter() > deadline:
                raise TimeoutError("ipyparallel engines did not come back")
            time.sleep(0.02)
        up = time.perf_counter()
        rc[sorted(set(rc.ids) - old)].execute("import tensorflow", block=True)
        done = time.perf_counter()
        return {"total_s": done - t0, "engines_s": up - t0, "import_s": done - up}
    finally:
        tool.stop(started.handle)


def step_after(n: int, steps: int, warm: bool) -> tuple[float, Any]:
    """The median MWMS step on tasks adopted from spares (``warm``) or started cold."""
    from tfdist_nb import Cluster

    cluster = Cluster(workers=n, warm=None if warm else False).start()
    try:
        if warm:
            _wait_spares(cluster, n)
            pids = set(cluster.spares()["pids"])
            cluster.restart()
            assert {rt.pid for rt in cluster.tasks.values()} <= pids, str(cluster.warm_outcome)
        result = cluster.run(TRAIN.format(steps=steps), timeout=600)
        assert result.ok, result.summary()
        return max(_medians([r.stdout for r in result.tasks.values()])), None
    finally:
        cluster.stop()


def measure(repeat: int, steps: int, cold_restarts: bool,
            step_repeat: int) -> dict[str, Any]:
    runs: dict[str, list[Any]] = {k: [] for k in (
        "cold_start_2_s", "warm_restart", "cold_restart", "ipyparallel", "warm_resize",
        "cold_resize", "cold_start_1_s", "step_warm_ms", "step_cold_ms", "step_load1",
        "spares_ready_s", "usual_restart", "after_hang_restart", "spawned_restart")}
    for _ in range(repeat):
        # a 2-worker cluster: its cold start, a warm restart, a warm resize to 1 worker
        took, cluster = cold_start(2, warm=True)
        runs["cold_start_2_s"].append(took)
        try:
            runs["usual_restart"].append(usual_restart(cluster, after_hang=False))
            runs["after_hang_restart"].append(usual_restart(cluster, after_hang=True))
            runs["spares_ready_s"].append(_wait_spares(cluster, 2))
            runs["warm_restart"].append(warm_restart(cluster))
            _wait_spares(cluster, 2)
            res, cluster = resize(cluster, 1, warm=True)
            runs["warm_resize"].append(res)
        finally:
            cluster.stop()
        took, one = cold_start(1, warm=False)
        runs["cold_start_1_s"].append(took)
        one.stop()
        if cold_restarts:  # the same operations without spares (forked), and spawned
            _, cluster = cold_start(2, warm=False)
            try:
                runs["cold_restart"].append(cold_restart(cluster))
                res, cluster = resize(cluster, 1, warm=False)
                runs["cold_resize"].append(res)
            finally:
                cluster.stop()
            _, cluster = cold_start(2, warm=False, fork=False)
            try:
                runs["spawned_restart"].append(cold_restart(cluster))
            finally:
                cluster.stop()
        runs["ipyparallel"].append(ipyparallel_restart(2))
    # a training step after a warm restart vs on cold tasks, order alternating
    for i in range(step_repeat):
        for warm in ((True, False) if i % 2 == 0 else (False, True)):
            ms, _ = step_after(2, steps, warm)
            runs["step_warm_ms" if warm else "step_cold_ms"].append(ms)
            runs["step_load1"].append(os.getloadavg()[0])
    return runs


def _med(values: list[Any], key: str | None = None) -> float | None:
    vals = [v[key] if key else v for v in values]
    return statistics.median(vals) if vals else None


def summarise(runs: dict[str, list[Any]]) -> dict[str, Any]:
    cold2, cold1 = _med(runs["cold_start_2_s"]), _med(runs["cold_start_1_s"])
    warm, ipp = _med(runs["warm_restart"], "total_s"), _med(runs["ipyparallel"], "total_s")
    resize_s = _med(runs["warm_resize"], "total_s")
    sw, sc = _med(runs["step_warm_ms"]), _med(runs["step_cold_ms"])
    med = {"cold_start_2_s": cold2, "warm_restart_s": warm,
           "warm_restart_only_s": _med(runs["warm_restart"], "restart_s"),
           "warm_strategy_s": _med(runs["warm_restart"], "strategy_s"),
           "cold_restart_s": _med(runs["cold_restart"], "total_s"),
           "spawned_restart_s": _med(runs["spawned_restart"], "total_s"),
           "ipyparallel_s": ipp, "warm_resize_s": resize_s,
           "warm_resize_start_s": _med(runs["warm_resize"], "start_s"),
           "warm_resize_stop_s": _med(runs["warm_resize"], "stop_s"),
           "cold_resize_s": _med(runs["cold_resize"], "total_s"), "cold_start_1_s": cold1,
           "step_warm_ms": sw, "step_cold_ms": sc, "spares_ready_s": _med(runs["spares_ready_s"]),
           "usual_restart_s": _med(runs["usual_restart"], "total_s"),
           "after_hang_restart_s": _med(runs["after_hang_restart"], "total_s")}
    assert cold2 and warm and ipp and resize_s and cold1 and sw and sc
    ratios = {"restart_vs_cold_start": warm / cold2, "restart_vs_ipyparallel": warm / ipp,
              "resize_vs_cold_start": resize_s / cold1, "step_warm_vs_cold": sw / sc}
    for key in ("usual_restart", "after_hang_restart"):
        if med[f"{key}_s"]:
            ratios[f"{key}_vs_cold_start"] = med[f"{key}_s"] / cold2
    if med["cold_resize_s"]:
        ratios["resize_vs_cold_resize"] = resize_s / med["cold_resize_s"]
    return {"median": med, "ratio": ratios,
            "met": {"restart_vs_cold_start": ratios["restart_vs_cold_start"] <= RESTART_GOAL,
                    "restart_vs_ipyparallel": ratios["restart_vs_ipyparallel"] <= IPP_GOAL,
                    "resize_vs_cold_start": ratios["resize_vs_cold_start"] <= RESIZE_GOAL,
                    "step_warm_vs_cold": ratios["step_warm_vs_cold"] <= STEP_GOAL}}


def _spares_said(runs: list[dict[str, Any]]) -> str:
    ready = [r["spares_ready"] for r in runs]
    return f"spares ready then: {', '.join(map(str, ready)) or '-'}"


def report(res: dict[str, Any]) -> str:
    m, r = res["median"], res["ratio"]

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines = [
        f"2 workers, to a new MWMS strategy (s)      median over {res['repeat']} run(s)",
        f"  cold start                                {s(m['cold_start_2_s'])}",
        f"  warm restart (restart + strategy)         {s(m['warm_restart_s'])}   "
        f"(restart {s(m['warm_restart_only_s'])}, strategy {s(m['warm_strategy_s'])})",
        f"  restart, no spares (warm=False, forked)   {s(m['cold_restart_s'])}",
        f"  restart, spawned (warm=False, fork=False) {s(m['spawned_restart_s'])}",
        f"  ipyparallel restart engines + import TF   {s(m['ipyparallel_s'])}",
        f"  ratio warm restart / cold start           {r['restart_vs_cold_start']:.3f}x "
        f"(goal <= {RESTART_GOAL}x)",
        f"  ratio warm restart / ipyparallel          {r['restart_vs_ipyparallel']:.3f}x "
        f"(goal <= {IPP_GOAL}x)",
        f"  restart 2 s after the strategy's cell     {s(m['usual_restart_s'])}   "
        f"{r.get('usual_restart_vs_cold_start', 0):.3f}x of the cold start "
        f"({_spares_said(res['runs']['usual_restart'])})",
        f"  restart right after a named hang          {s(m['after_hang_restart_s'])}   "
        f"{r.get('after_hang_restart_vs_cold_start', 0):.3f}x of the cold start "
        f"({_spares_said(res['runs']['after_hang_restart'])})",
        "resize 2 -> 1 worker, to a new strategy (s)",
        f"  warm resize                               {s(m['warm_resize_s'])}   "
        f"(stop {s(m['warm_resize_stop_s'])}, start {s(m['warm_resize_start_s'])})",
        f"  resize, no spares (warm=False, forked)    {s(m['cold_resize_s'])}",
        f"  cold start of 1 worker                    {s(m['cold_start_1_s'])}",
        f"  ratio warm resize / cold start            {r['resize_vs_cold_start']:.3f}x "
        f"(goal <= {RESIZE_GOAL}x)",
        f"MWMS step after restart (ms): warm {m['step_warm_ms']:.2f}, cold "
        f"{m['step_cold_ms']:.2f}: {r['step_warm_vs_cold']:.3f}x (goal <= {STEP_GOAL}x), "
        f"median of {len(res['runs']['step_warm_ms'])} each",
        f"spares ready {s(m['spares_ready_s'])} s after the restart before it (2 spares, "
        "started together, their import at low priority)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-repeat", type=int, default=5,
                        help="pairs of warm / cold training runs")
    parser.add_argument("--quick", action="store_true",
                        help="1 repeat, 60 steps, no cold restarts (CI smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.steps, args.step_repeat = 1, 60, 1
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    load0 = os.getloadavg()
    if not args.quick:
        warm_up()
    runs = measure(args.repeat, args.steps, cold_restarts=not args.quick,
                   step_repeat=args.step_repeat)
    results = {"machine": machine(), "repeat": args.repeat, "steps": args.steps, "runs": runs,
               **summarise(runs), "load_avg_before": load0, "load_avg_after": os.getloadavg()}
    print(report(results), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
