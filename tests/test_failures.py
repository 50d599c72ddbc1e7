"""Stalls and stuck collectives on a real 2-worker cluster: detected, explained, released."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.events import Finding
from tfdist_nb.results import HangRule, LikelyCause

pytestmark = pytest.mark.cluster

HANG_BEFORE_ALL_REDUCE = """
import time, tensorflow as tf, tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy()
if tw.task[1] == 1:
    time.sleep(3600)   # worker:1 never reaches the all-reduce
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
"""


def test_a_task_that_never_joins_the_all_reduce_is_found_and_the_cell_ends(
        tmp_path: Path) -> None:
    # TMPDIR set, as on SLURM nodes: ipykernel's cell files are then below it, not in /tmp
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    with Cluster(workers=2, preload=(), env={"TMPDIR": str(node_tmp)}) as c:
        results: list[Any] = []
        started = time.monotonic()
        runner = threading.Thread(target=lambda: results.append(
            c.run(HANG_BEFORE_ALL_REDUCE, timeout=300, stall_timeout=8)))
        runner.start()
        # while worker:0 is blocked inside the collective, its stacks still come back
        def both_in_place() -> dict[str, str] | None:
            s = c.stacks()
            # (worker:0 passes through strategy.run, TensorFlow too, before its all-reduce)
            ready = (s["worker:0"].startswith("main thread: tensorflow at")
                     and ("cross_device_ops" in s["worker:0"] or "collective" in s["worker:0"])
                     and "time.sleep(3600)" in s["worker:1"])
            return s if ready else None

        stacks = wait_for(both_in_place, 30, "worker:0 in the all-reduce, worker:1 asleep")
        assert stacks["worker:1"].startswith("main thread: python at ")
        assert "time.sleep(3600)" in stacks["worker:1"]
        runner.join(60)
        took = time.monotonic() - started
        assert not runner.is_alive()
        assert took < 8 + 10 + 10  # stall_timeout + detection + TF start-up in this cell
        result = results[0]
        hung, waiting = result.tasks["worker:1"], result.tasks["worker:0"]
        assert hung.status == "stalled"
        assert "made no progress" in hung.explanation
        assert "elsewhere, likely the cause: worker:1" in hung.explanation
        # each task's place named by the user's line first, then the innermost frame
        assert re.search(r"likely the cause: worker:1 at cell \d+ line \d+ \(", hung.explanation)
        assert re.search(r"main thread inside a TensorFlow op .* at cell \d+ line \d+ \(.*",
                         waiting.explanation), waiting.explanation
        assert "time.sleep(3600)" in hung.stack
        assert waiting.status in ("stalled", "interrupted")
        assert "tensorflow" in waiting.stack  # its main-thread stack at detection
        assert "Collectives were aborted" in waiting.explanation
        assert any("aborted the collectives of worker:0" in a for a in c.alerts()), c.alerts()
        # released: both tasks answer again, and a restart gives working collectives back
        assert set(c.status()["state"]) == {"idle"}
        c.restart()
        again = c.run("import tensorflow as tf\n"
                      "s = tf.distribute.MultiWorkerMirroredStrategy()\n"
                      "print(float(s.reduce('SUM', s.run(lambda: tf.constant(1.0)), axis=None)))",
                      timeout=120)
        assert again.ok and all(r.stdout.strip().endswith("2.0") for r in again.tasks.values()), \
            {n: (r.stdout, r.duration_s) for n, r in again.tasks.items()}


def test_a_long_cpu_bound_computation_without_output_is_not_a_stall() -> None:
    code = ("import time, numpy as np\nt = time.time()\n"
            "while time.time() - t < 7:\n    np.linalg.svd(np.random.rand(150, 150))\n"
            "print('done')")
    with Cluster(workers=1, preload=()) as c:
        result = c.run(code, timeout=120, stall_timeout=3)
        assert result.ok, result.summary()
        assert result.tasks["worker:0"].stdout.strip() == "done"


CRASH_AT_STEP_20 = """
import os, signal, time, tensorflow as tf, tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy()
for step in range(1000):
    with tw.step():
        print("step", step, flush=True)
        time.sleep(0.05)
        if tw.task[1] == 1 and step == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
"""


def test_a_task_killed_mid_training_is_reported_and_the_others_released() -> None:
    with Cluster(workers=2, preload=()) as c:
        result = c.run(CRASH_AT_STEP_20, timeout=300)
        dead = result.tasks["worker:1"]
        assert dead.status == "crashed"
        assert dead.error.ename == "TaskCrashed" and "killed by SIGKILL" in dead.error.evalue
        assert "Last resource sample: RSS" in dead.explanation
        # its last output lines: all but what the kernel buffered in its last 0.05 s ("step 20"
        # came 0.05 s before the kill and may be lost with it; "step 19" came 0.1 s before)
        assert "Its last output lines:\nstep " in dead.explanation
        assert "step 19" in dead.explanation
        survivor = result.tasks["worker:0"]
        # it waited in the all-reduce worker:1 never entered: released, naming the dead task
        assert survivor.status == "aborted"
        hang = result.hang
        assert hang is not None
        assert (hang.rule, hang.culprit, hang.waiters) == (HangRule.FAILED, "worker:1",
                                                           ["worker:0"])
        assert hang.culprit_error == "killed by SIGKILL"
        assert (hang.waited_in["worker:0"].kind, hang.waited_in["worker:0"].tensor) == (
            "all_reduce", "float32[]")
        assert result.summary().startswith("worker:1 crashed (killed by SIGKILL) while worker:0 "
                                           "waited in a collective that worker:1 never entered")
        assert survivor.explanation.startswith(hang.cause)
        assert survivor.duration_s - dead.duration_s < 10  # released within seconds, not ~hang
        status = c.status().set_index("task")["state"]
        assert (status["worker:0"], status["worker:1"]) == ("idle", "dead")
        with pytest.raises(Exception, match="worker:1 is dead"):
            c.run("print(1)")
        c.restart()
        assert c.run("print('back')").ok


def test_interrupt_releases_a_task_stuck_inside_a_collective() -> None:
    with Cluster(workers=2, preload=(), stall_timeout=600) as c:
        results: list[Any] = []
        runner = threading.Thread(target=lambda: results.append(
            c.run(HANG_BEFORE_ALL_REDUCE, timeout=300)))
        runner.start()
        def in_place() -> bool:
            s = c.stacks()
            return (s["worker:0"].startswith("main thread: tensorflow at")
                    and "time.sleep(3600)" in s["worker:1"])

        wait_for(in_place, 60, "worker:0 in the all-reduce, worker:1 asleep")
        aborted = c.interrupt()  # SIGINT frees worker:1's sleep, not worker:0's collective
        assert aborted == ["worker:0"]
        runner.join(30)
        assert not runner.is_alive()
        r0, r1 = results[0].tasks["worker:0"], results[0].tasks["worker:1"]
        assert r1.error.ename == "KeyboardInterrupt"
        # worker:0's main thread waits in Python for the strategy's all-reduce thread: SIGINT
        # reaches it, and the abort released the thread still inside the collective
        assert r0.error.ename in ("KeyboardInterrupt", "UnavailableError")
        assert set(c.status()["state"]) == {"idle"}
        assert any("interrupted by the user" in a for a in c.alerts())


def test_strategy_start_up_waiting_for_a_task_not_running_the_cell_is_named() -> None:
    """The strategy is created on worker:0 only; worker:1 never joins. worker:0 waits in C++
    holding the GIL until TensorFlow's registration timeout: its start-up row names worker:1
    at once, and the report says worker:0 is still blocked there (no interrupt reaches it)."""
    with Cluster(workers=2, preload=()) as c:
        started = time.monotonic()
        result = c.run("import tensorflow as tf\n"
                       "strategy = tf.distribute.MultiWorkerMirroredStrategy()",
                       on=0, timeout=60)
        assert time.monotonic() - started < 15  # not the cell's timeout
        waiting = result.tasks["worker:0"]
        assert waiting.status == "aborted"
        hang = result.hang
        assert hang is not None
        assert (hang.rule, hang.culprit, hang.waiters) == (HangRule.ABSENT, "worker:1",
                                                           ["worker:0"])
        assert hang.waited_in["worker:0"].kind == "startup"
        assert hang.frozen == {"worker:0"} and hang.likely is LikelyCause.CELL_ON_SOME_TASKS
        assert result.cause is not None and result.cause.startswith(
            "worker:0 waits in the start-up of MultiWorkerMirroredStrategy"), result.cause
        assert "worker:0 is still blocked in the start-up" in waiting.explanation


def test_a_frozen_interpreter_is_said_from_the_gap_in_its_heartbeats() -> None:
    """A task whose Python threads are all frozen (a C call holding the GIL: here libc's
    sleep through ctypes.PyDLL, which keeps it) sends no heartbeat: the gap is said once,
    naming the tasks not running the cell; the cell then ends normally."""
    with Cluster(workers=2, preload=(), warm=False) as c:
        seen: list[Any] = []
        result = c.run("import ctypes\nctypes.PyDLL(None).sleep(8)", on=0, timeout=60,
                       on_event=seen.append)
        assert result.ok, result.summary()
        gaps = [a for a in c.alerts() if "no heartbeat for" in a]
        assert len(gaps) == 1 and gaps[0].startswith("worker:0: no heartbeat for ")
        assert "its Python threads are blocked" in gaps[0]
        assert "not running this cell: worker:1 (idle): run it on every task" in gaps[0]
        assert any("no heartbeat for" in getattr(e, "text", "") for e in seen)
        # healthy: the same cell without the frozen C call says nothing
        assert c.run("import time\ntime.sleep(8)", on=0, timeout=60).ok
        assert len([a for a in c.alerts() if "no heartbeat for" in a]) == 1


def test_a_task_that_dies_between_cells_is_dead_at_once_with_an_alert() -> None:
    """No cell runs, so no run notices the exit: the dashboard must not show it idle."""
    import os
    import signal

    from tfdist_nb.errors import ClusterNotRunningError

    with Cluster(workers=2, preload=(), warm=False) as c:
        assert c.run("x = 1").ok
        os.kill(next(rt.pid for rt in c.tasks.values() if rt.name == "worker:1"), signal.SIGKILL)
        wait_for(lambda: c.status().set_index("task")["state"]["worker:1"] == "dead", 5,
                 "worker:1 shown dead")
        assert c.status().set_index("task")["state"]["worker:0"] == "idle"
        said = [a for a in c.alerts() if a.startswith("worker:1:")]
        assert said and "killed by SIGKILL while no cell was running on it" in said[-1], said
        assert "%tfdist_restart" in said[-1]
        with pytest.raises(ClusterNotRunningError, match=r"worker:1 is dead; bring it back"):
            c.run("x = 2")
        assert c.run("x = 3", on="worker:0").ok  # the living task still runs cells
        c.restart("worker:1")
        back = c.run("print('x' in dir())")
        assert back.ok and back.tasks["worker:1"].stdout.strip() == "False"  # a new process
        assert back.tasks["worker:0"].stdout.strip() == "True"


def test_a_stopped_task_is_said_stopped_and_a_later_cell_is_refused_with_advice() -> None:
    """kill -STOP on a task in a cell: the stall report says the process is stopped (not that
    TensorFlow holds the GIL), and the next cell is refused naming the task and what to do,
    instead of 'no transition from stalled on run' on every later cell (issue 21)."""
    import os
    import signal

    from tfdist_nb.errors import ClusterNotRunningError

    with Cluster(workers=2, preload=(), warm=False) as c:
        assert c.run("x = 1").ok
        pid = next(rt.pid for rt in c.tasks.values() if rt.name == "worker:1")
        results: list[Any] = []
        runner = threading.Thread(target=lambda: results.append(
            c.run("import time\ntime.sleep(1000)", stall_timeout=10, timeout=120)))
        runner.start()
        wait_for(lambda: set(c.status()["state"]) == {"busy"}, 20, "both tasks in the cell")
        os.kill(pid, signal.SIGSTOP)
        try:
            runner.join(90)
            assert not runner.is_alive()
            stalled = results[0].tasks["worker:1"]
            assert stalled.status == "stalled"
            assert f"process (pid {pid}) is stopped" in stalled.explanation, stalled.explanation
            assert "holds no Python frame" not in stalled.explanation
            stopped = [a for a in c.alerts() if "is stopped" in a]
            assert stopped and f"kill -CONT {pid}" in stopped[0], c.alerts()
            assert not any("holds the GIL" in a for a in c.alerts() if a.startswith("worker:1"))
            with pytest.raises(ClusterNotRunningError,
                               match="worker:1: it is still in an earlier cell"):
                c.run("print(1)")
        finally:
            os.kill(pid, signal.SIGCONT)
        c.restart(on="worker:1")
        again = c.run("print('back')")
        assert again.ok and set(c.status()["state"]) == {"idle"}


STRATEGY_AND_ALL_REDUCE = """
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
print(float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)))
"""


@pytest.mark.timeout(240)
def test_a_second_strategy_in_the_same_tasks_is_said_once_with_the_restart() -> None:
    """The training cell run twice: the second MultiWorkerMirroredStrategy in live tasks is
    said when it is made, once for the cluster, naming its cell and the fix; the first one,
    and the first after a restart, are not said at all. A collective aborted under it is
    explained by it (hub findings: the explanation test in test_core_without_processes)."""
    with Cluster(workers=2, warm=False) as c:
        first = c.run(STRATEGY_AND_ALL_REDUCE)
        assert first.ok, first.summary()
        assert not [a for a in c.alerts() if "MultiWorkerMirroredStrategy" in a]
        c.run(STRATEGY_AND_ALL_REDUCE)  # passes, or is aborted (about 1 run in 6)
        said = wait_for(lambda: [a for a in c.alerts() if "number 2" in a], 10,
                        "the second strategy said")
        assert len(said) == 1, said
        # IPython drops the leading empty line: line 2, as the task's own traceback says
        assert "MultiWorkerMirroredStrategy number 2 in the same task process (cell 2 " \
               "line 2)" in said[0], said
        assert "Fix: restart the tasks (%%tfcluster --restart" in said[0]
        assert all(Finding.SECOND_STRATEGY in c.live.view(t).findings
                   for t in ("worker:0", "worker:1"))
        c.restart()
        again = c.run(STRATEGY_AND_ALL_REDUCE)
        assert again.ok, again.summary()
        assert len([a for a in c.alerts() if "MultiWorkerMirroredStrategy number" in a]) == 1
        assert not c.live.view("worker:0").findings
