"""Spare kernels (issues 13, 21): restart and resize take warmed spares that become their
tasks, indistinguishable from cold ones, also spares still warming; an import-time env change
starts cold and says so; spares never leak, are replaced when they die, start as soon as the
cluster is up and whenever the host has CPU to spare (also while a cell's tasks sleep), and a
restart is never held by a spare slower than a cold start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.cells import cell
from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.cluster.spare import Held, NoSpare, Spare, env_delta
from tfdist_nb.errors import SpecError
from tfdist_nb.events import Restart
from tfdist_nb.launchers.fork_handle import ServerKey
from tfdist_nb.launchers.kernel_key import KernelKey, Part, Unfit, import_time

pytestmark = pytest.mark.cluster

#: A spare forked from the fork server (docs/design.md, "Fork server") has its preload from the
#: server: a spare that is slow or fails to warm, or is killed mid-import, is a spawned one.
SPAWNED = {"fork": False}

IDENTITY = textwrap.dedent("""
    import json, logging, os, sys
    import tfdist_nb.worker as tw
    record = logging.getLogRecordFactory()("t", 20, "f", 1, "m", None, None)
    os.write(2, b"fd-level line\\n")
    print(json.dumps({"pid": os.getpid(), "task": list(tw.task), "env_task":
                      os.environ["TFDIST_TASK"], "tf_config": json.loads(os.environ["TF_CONFIG"]),
                      "late": os.environ.get("MY_LATE"), "spare": os.environ.get("TFDIST_SPARE"),
                      "log_task": record.task, "tf_loaded": "tensorflow" in sys.modules}))
""")


@pytest.fixture(autouse=True)
def _spares_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster leaving warm= unset has its default spares here (conftest turns them off for
    the rest of the suite)."""
    monkeypatch.setenv("TFDIST_WARM", "auto")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def ready_spares(c: Cluster, n: int, timeout: float = 120) -> list[int]:
    wait_for(lambda: c.spares()["ready"] >= n, timeout, f"{n} spare kernel(s) ready")
    return list(c.spares()["pids"])


def restarts(c: Cluster) -> list[Restart]:
    """The restarts the run directory keeps, by their records."""
    assert c.rundir is not None
    return [Restart(**r) for r in c.rundir.iter_events() if r["kind"] == Restart.kind]


def identities(c: Cluster) -> dict[str, dict[str, Any]]:
    result = c.run(IDENTITY, timeout=60)
    assert result.ok, result.summary()
    assert all("fd-level line" in t.stderr for t in result.tasks.values())  # fd capture
    return {name: json.loads(t.stdout.strip().splitlines()[-1])
            for name, t in result.tasks.items()}


def losses(result: Any) -> dict[str, str]:
    assert result.ok, result.summary()
    return {name: re.search(r"final loss (\S+)", t.stdout).group(1)
            for name, t in result.tasks.items()}


# ---------------------------------------------------------------------- pure parts
def test_a_warm_outcome_says_how_spares_were_used_in_one_line() -> None:
    from tfdist_nb.cluster.spare import Held, NoSpare, NotStarting, WarmOutcome

    assert str(WarmOutcome(2, 2, fresh_ports=True)) == (
        "2 task(s) from spare kernels on fresh TF ports")
    assert str(WarmOutcome(2, 1, 1, ("worker:1",), NoSpare(warming=1))) == (
        "cold start for worker:1 (1 of 2 from spares): no spare ready yet (1 warming) "
        "(1 still warming when taken)")
    off = NoSpare(off=True)
    assert str(WarmOutcome(2, 0, cold=("worker:0", "worker:1"), why_cold=off)) == (
        "cold start for every task: spares are off")
    held = NoSpare(held=NotStarting(Held.CPU, "waiting for a core to spare (0.2 of 2 idle now)"))
    assert str(held) == "waiting for a core to spare (0.2 of 2 idle now)"
    assert str(NoSpare()) == "no spare ready yet"
    forked = WarmOutcome(2, 0, cold=("worker:0", "worker:1"), why_cold=off,
                         forked=True)
    assert str(forked).endswith("(forked from the fork server: TensorFlow is imported already)")


def test_import_time_variables_are_told_apart_from_late_ones() -> None:
    for key in ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_VMODULE", "TF_ENABLE_ONEDNN_OPTS",
                "CUDA_MODULE_LOADING", "TF_USE_LEGACY_KERAS", "XLA_FLAGS", "OMP_NUM_THREADS",
                "LD_LIBRARY_PATH", "PYTHONPATH", "TFDIST_TELEMETRY_INTERVAL", "KERAS_BACKEND"):
        assert import_time(key), key
    # a task's GPUs: CUDA reads them when it initialises, after the import (docs/reference.md)
    for key in ("TF_CONFIG", "TFDIST_TASK", "TFDIST_SPARE", "MY_LATE", "PATH", "USER",
                "CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH"):
        assert not import_time(key), key
    assert env_delta({"A": "1", "B": "2", "TFDIST_SPARE": "1"}, {"A": "1", "B": "3", "C": "4"}) \
        == ({"B": "3", "C": "4"}, ["TFDIST_SPARE"])


def test_a_spare_differing_in_import_time_env_python_or_preload_does_not_fit() -> None:
    """One rule for spares and fork servers (tfdist_nb/launchers/kernel_key.py): which part
    differs is a record; the sentence a user reads is its str()."""
    spare = Spare(number=1, env={"TF_CPP_MIN_LOG_LEVEL": "1", "MY_LATE": "a", "TFDIST_SPARE": "1"},
                  python="/py", preload=("tensorflow",), cwd="/w", directory=Path("/x"))
    task = {"TF_CPP_MIN_LOG_LEVEL": "1", "MY_LATE": "b", "TF_CONFIG": "{}", "TFDIST_TASK": "w:0"}

    def unfit(env: dict[str, str] = task, python: str = "/py",
              preload: tuple[str, ...] = ("tensorflow",), cwd: str = "/w") -> Unfit | None:
        return spare.key.unfit(KernelKey.of(python, preload, cwd, env))

    assert unfit() is None  # the late ones are set in the kernel
    why = unfit({**task, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert why is not None and (why.part, why.names) == (Part.ENV, ("TF_CPP_MIN_LOG_LEVEL",))
    assert "TF_CPP_MIN_LOG_LEVEL differs" in str(why) and "imported" in str(why)
    many = unfit({**task, **{f"TF_X{i}": "1" for i in range(5)}})
    assert many is not None and str(many).startswith("TF_X0, TF_X1, TF_X2 and 2 more differ")
    other = unfit(python="/other")
    assert other is not None and other.part is Part.PYTHON and "/other" in str(other)
    assert (unfit(preload=()) or Unfit(Part.ENV, "", "")).part is Part.PRELOAD
    moved = unfit(cwd="/else")
    assert moved is not None and str(moved) == "the working directory changed (/w -> /else)"
    # the fork server's key is the same rule plus the network it forks into
    assert ServerKey.on(spare.key, None) == ServerKey.on(KernelKey.of("/py", ("tensorflow",),
                                                                      "/w", task), None)
    assert ServerKey.on(spare.key, None) != ServerKey.on(spare.key, 1234)


def test_warm_is_for_the_local_launcher() -> None:
    assert Cluster(workers=2).warm == 2  # default: one spare per task
    assert Cluster(workers=2, preload=()).warm == 0  # nothing to preload: nothing to gain
    assert Cluster(workers=2, warm=False).warm == 0
    assert Cluster(workers=1, preload=(), warm=3).warm == 3
    assert Cluster(workers=2, launcher="ssh", hosts=["h1"]).warm == 0
    with pytest.raises(SpecError, match="local launcher"):
        Cluster(workers=2, launcher="ssh", hosts=["h1"], warm=True)
    with pytest.raises(SpecError, match="warm="):
        Cluster(workers=2, warm="yes")  # type: ignore[arg-type]


def test_warm_options_of_the_magic() -> None:
    import shlex

    from IPython.core.interactiveshell import InteractiveShell

    from tfdist_nb.magics.request import build_request
    from tfdist_nb.magics.run import RunMagics

    magics = RunMagics(InteractiveShell.instance())
    parse = magics.tfcluster.parser.parse_args
    assert build_request(parse(shlex.split("2 workers"))).warm is None
    assert build_request(parse(shlex.split("2 workers --warm"))).warm is True
    assert build_request(parse(shlex.split("2 workers --no-warm"))).warm is False


# ---------------------------------------------------------------------- real TensorFlow
def test_restart_from_spares_gives_a_working_mwms_cluster_like_a_cold_one() -> None:
    with Cluster(workers=2, env={"MY_LATE": "a"}) as c:
        cold = losses(c.run(cell("mwms_loop"), timeout=180))
        spares = ready_spares(c, 2)
        old = {rt.name: (rt.pid, rt.address) for rt in c.tasks.values()}
        c.restart()
        w = c.warm_outcome
        assert w is not None and (w.adopted, w.cold, w.still_warming, w.fresh_ports) == (
            2, (), 0, True), w
        assert sorted(rt.pid for rt in c.tasks.values()) == sorted(spares)
        [restart] = restarts(c)  # kept with the events: how each came back, where it moved
        assert restart.tasks == {"worker:0": "spare", "worker:1": "spare"}, restart
        assert restart.moved == {rt.name: rt.address for rt in c.tasks.values()}
        assert 0 < restart.seconds < 30
        wait_for(lambda: all(gone(pid) for pid, _ in old.values()), 5,
                 "the old processes to be killed")
        seen = identities(c)
        for rt in c.tasks.values():
            me = seen[rt.name]
            assert me["pid"] == rt.pid and me["task"] == [rt.task.role, rt.task.index]
            assert me["env_task"] == me["log_task"] == rt.name
            assert me["tf_config"] == json.loads(rt.tf_config)  # fresh ports, as on disk
            assert me["tf_config"] == json.loads(
                (c.run_dir / "tasks" / rt.task.slug / "tf_config.json").read_text())
            assert rt.address != old[rt.name][1]
            assert me["late"] == "a" and me["spare"] is None and me["tf_loaded"]
            assert rt.info["port_free"] is True and rt.info["task"] == list(me["task"])
        # the same training, the same result, and everything a cold task has
        assert losses(c.run(cell("mwms_loop"), timeout=180)) == cold
        status = c.status().set_index("task")
        assert list(status["step"]) == [20, 20]  # step hooks, counted through telemetry
        wait_for(lambda: c.status()["cpu_percent"].notna().all(), 10, "telemetry samples")
        assert all("Thread" in text or "thread" in text for text in c.stacks().values())
        assert "straggler armed" in c.inject("straggler", on=1, seconds=0.01)["worker:1"]
        c.inject("clear")
        log = (c.run_dir / "tasks" / "worker-1" / "kernel.log").read_text()
        assert "started as spare-" in log and "fd-level line" in log
        # a second strategy needs fresh kernels again: the pool has refilled
        ready_spares(c, 1)
        c.restart(on="0")  # some tasks: their addresses stay (the others know them)
        assert c.tasks[next(iter(c.tasks))].address == seen["worker:0"]["tf_config"][
            "cluster"]["worker"][0]
        assert (restarts(c)[-1].tasks, restarts(c)[-1].moved) == ({"worker:0": "spare"}, {})


def test_a_restart_with_one_spare_ready_takes_it_and_starts_the_other_task_cold() -> None:
    """The usual moment: a restart soon after the first strategy, one spare ready and the next
    still warming. It used to wait out start_timeout on the cold task (issue 21): the old
    process's clean-up removed the connection file the cold task had just been given."""
    with Cluster(workers=2, start_timeout=45, warm=1) as c:  # one spare: the mix is certain
        cold = losses(c.run(cell("mwms_loop"), timeout=180))
        ready_spares(c, 1)
        c.restart()
        w = c.warm_outcome
        assert w is not None and (w.tasks, w.adopted, len(w.cold)) == (2, 1, 1), w
        # the task without a spare was forked from the fork server (TensorFlow imported)
        assert sorted(restarts(c)[-1].tasks.values()) == ["forked", "spare"], restarts(c)
        assert losses(c.run(cell("mwms_loop"), timeout=180)) == cold
        assert set(c.status()["state"]) == {"idle"}


def test_a_restart_with_no_spare_starts_every_task_cold_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No spare at all (memory too short to start one): the restart is a plain cold start."""
    class Short:
        available = 900 * 2**20

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Short())
    with Cluster(workers=2, warm=True) as c:
        cold = losses(c.run(cell("mwms_loop"), timeout=180))
        wait_for(lambda: c.spares()["note"], 10, "the pool to say why it starts none")
        assert c.spares()["pids"] == [] and "no spare started" in c.spares()["note"]
        old = {rt.pid for rt in c.tasks.values()}
        c.restart()
        w = c.warm_outcome
        assert w is not None and (w.adopted, len(w.cold)) == (0, 2), w
        assert isinstance(w.why_cold, NoSpare) and w.why_cold.held is not None, w
        assert w.why_cold.held.held is Held.MEMORY, w
        assert str(w.why_cold).startswith("no spare started: 900 MB available"), w
        assert w.forked, w  # forked from the fork server: no import to wait for
        assert not old & {rt.pid for rt in c.tasks.values()}
        assert losses(c.run(cell("mwms_loop"), timeout=180)) == cold
        assert set(c.status()["state"]) == {"idle"}


def test_a_restart_2s_after_the_first_strategy_takes_the_spares() -> None:
    """The usual moment (issue 21): the spares started when the cluster came up; ready or still
    warming, the restart takes them instead of paying two more TensorFlow imports."""
    with Cluster(workers=2) as c:
        cold = losses(c.run(cell("mwms_loop"), timeout=180))
        time.sleep(2)  # the scenario itself: the user reads the output, then restarts
        spares = set(c.spares()["pids"])
        assert len(spares) == 2, c.spares()
        c.restart()
        w = c.warm_outcome
        assert w is not None and (w.adopted, w.cold) == (2, ()), w
        assert {rt.pid for rt in c.tasks.values()} == spares
        assert losses(c.run(cell("mwms_loop"), timeout=180)) == cold
        # and the pool starts its next spares at once
        wait_for(lambda: len(set(c.spares()["pids"]) - spares) == 2, 30, "2 new spares")


def test_a_spare_killed_while_it_is_being_adopted_is_replaced_by_a_cold_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The spare's process is SIGKILLed at the start of its adoption (after it was taken,
    before the adopt call): the restart starts that task cold, says so, and completes."""
    from tfdist_nb.cluster import spare as adoption

    killed: list[int] = []
    real = adoption.copy_start_log

    def kill_then_go_on(spare: Any, path: Any) -> None:
        if not killed and spare.pid:
            killed.append(spare.pid)
            os.kill(spare.pid, signal.SIGKILL)
        real(spare, path)

    with Cluster(workers=2) as c:
        cold = losses(c.run(cell("mwms_loop"), timeout=180))
        ready_spares(c, 2)
        monkeypatch.setattr(adoption, "copy_start_log", kill_then_go_on)
        c.restart()
        assert len(killed) == 1 and killed[0] not in {rt.pid for rt in c.tasks.values()}
        assert any("could not take spare-" in a and "starting it cold" in a
                   for a in c.alerts()), c.alerts()
        assert losses(c.run(cell("mwms_loop"), timeout=180)) == cold
        assert set(c.status()["state"]) == {"idle"}


def test_resize_by_the_magic_takes_the_old_clusters_spares(capsys: Any) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    from tfdist_nb.cluster.registry import current

    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("tfdist_nb")
    try:
        ip.run_cell_magic("tfcluster", "2 workers --no-dashboard", "x = 1")
        old = current()
        spares = ready_spares(old, 2)
        started = time.monotonic()
        ip.run_cell_magic("tfcluster", "1 worker --no-dashboard", cell("mwms_loop"))
        took = time.monotonic() - started
        out = capsys.readouterr().out
        assert "resized: 2 workers -> 1 worker" in out and "cold start" not in out
        new = current()
        assert new is not old and not old.running
        (rt,) = new.tasks.values()
        assert rt.pid in spares
        assert "replicas in sync: 1" in out and "final loss" in out, out
        assert json.loads(rt.tf_config)["cluster"] == {"worker": [rt.address]}
        # the spare beyond the new cluster's one task is not kept
        wait_for(lambda: len(new.spares()["pids"]) <= 1, 10, "the extra spare to stop")
        assert took < 30, took
    finally:
        ip.extension_manager.unload_extension("tfdist_nb")


# ---------------------------------------------------------------------- no TensorFlow needed
def test_an_import_time_env_change_starts_cold_and_says_so() -> None:
    with Cluster(workers=1, preload=(), warm=1, env={"MY_LATE": "a"}) as c:
        (spare,) = ready_spares(c, 1)
        c.extra_env["TF_CPP_MIN_LOG_LEVEL"] = "3"  # what %tfdist_loglevel --cpp does
        c._lifecycle.refresh_env()
        c.restart()
        w = c.warm_outcome
        assert w is not None and w.adopted == 0 and w.cold == ("worker:0",), w
        assert isinstance(w.why_cold, Unfit) and w.why_cold.names == ("TF_CPP_MIN_LOG_LEVEL",)
        assert "imported" in str(w.why_cold)
        assert c.tasks[next(iter(c.tasks))].pid != spare
        assert any("cold start" in text for text in c.logs(on=None)["text"])
        # the pool replaces the spare that no longer fits; a late variable change is warm
        wait_for(lambda: c.spares()["ready"] and spare not in c.spares()["pids"], 60,
                 "a spare with the new environment")
        c.extra_env["MY_LATE"] = "b"
        c._lifecycle.refresh_env()
        c.restart()
        w = c.warm_outcome
        assert w is not None and (w.adopted, w.cold, w.fresh_ports) == (1, (), True), w
        me = identities(c)["worker:0"]
        assert me["late"] == "b" and me["spare"] is None
        out = c.run("import os; print(os.environ['TF_CPP_MIN_LOG_LEVEL'])").tasks["worker:0"]
        assert out.stdout.strip() == "3"


def test_a_spare_that_died_while_idle_is_replaced_not_handed_out() -> None:
    with Cluster(workers=1, preload=(), warm=1) as c:
        (dead,) = ready_spares(c, 1)
        os.kill(dead, signal.SIGKILL)
        wait_for(lambda: gone(dead), 5, "the spare to die")
        c.restart()
        rt = c.tasks[next(iter(c.tasks))]
        assert rt.pid != dead and c.run("x = 1").ok
        # the restart found it dead and started cold, or the pool's own check had already
        # replaced it and a fresh spare was adopted: either way never the dead one
        w = c.warm_outcome
        assert w is not None and (w.cold == ("worker:0",) or w.adopted == 1), w
        # said either way: found dead while idle, or found dead as it was adopted
        assert any(("while idle" in a and "not handed out" in a)
                   or ("could not take spare" in a and "killed by SIGKILL" in a
                       and "starting it cold" in a) for a in c.alerts()), c.alerts()
        (fresh,) = ready_spares(c, 1)
        assert fresh != dead


def _hog_every_core() -> list[subprocess.Popen[bytes]]:
    """A busy host: one CPU-bound process per core, at normal priority."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(psutil.cpu_count() or 1)]


def test_spares_wait_for_a_core_start_while_a_cell_sleeps_and_stop_with_the_cluster() -> None:
    hogs = _hog_every_core()
    try:
        c = Cluster(workers=1, preload=(), warm=2).start()
        wait_for(lambda: "waiting for a core" in (c.spares()["note"] or ""), 20,
                 "the pool to say it waits for a core")
        assert c.spares()["pids"] == []  # nothing started while every core is taken
        assert "waiting for a core" in __import__("tfdist_nb.display.dashboard",
                                                  fromlist=["_"]).spares_text(c.snapshot())
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    try:
        pids = ready_spares(c, 2, timeout=60)
        assert "spares: 2 ready" in __import__("tfdist_nb.display.dashboard",
                                               fromlist=["_"]).spares_text(c.snapshot())
        assert c.status().attrs["spares"]["ready"] == 2
        for pid in pids:  # low priority only for the import thread, not the kernel
            assert psutil.Process(pid).nice() == psutil.Process().nice()
        # a cell whose task sleeps leaves the host idle: the pool refills while it runs
        c.restart()
        (taken,) = {rt.pid for rt in c.tasks.values()}
        assert taken in pids
        sleeper = threading.Thread(target=c.run, args=("import time; time.sleep(8)",))
        sleeper.start()
        wait_for(lambda: set(c.status()["state"]) == {"busy"}, 10, "the cell to run")
        wait_for(lambda: set(c.spares()["pids"]) - set(pids), 6, "a spare started mid-cell")
        assert set(c.status()["state"]) == {"busy"}
        sleeper.join(20)
        pids = ready_spares(c, 2, timeout=60)
    finally:
        started = time.monotonic()
        c.stop()
    assert time.monotonic() - started < 5
    wait_for(lambda: all(gone(p) for p in pids), 5, "the spares to end")
    assert not list(c.run_dir.rglob("kernel-connection.json"))


def test_no_spare_when_memory_is_short(monkeypatch: pytest.MonkeyPatch) -> None:
    class Short:
        available = 900 * 2**20

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Short())
    with Cluster(workers=1, preload=(), warm=1) as c:
        wait_for(lambda: c.spares()["note"], 10, "the memory note")
        assert c.spares()["pids"] == []  # the note is the pool's decision, made
        notes = [t for t in c.logs()["text"] if "no spare started" in t]
        assert len(notes) == 1 and "600 MB" in notes[0]


def test_a_spare_that_cannot_be_warmed_is_said_and_ended(tmp_path: Path) -> None:
    (tmp_path / "spare_breaks.py").write_text(
        "import os\nif os.environ.get('TFDIST_SPARE') == '1':\n"
        "    raise ImportError('not in a spare')\n")
    with Cluster(workers=1, preload=("spare_breaks",), warm=1, launcher_options=SPAWNED,
                 env={"PYTHONPATH": str(tmp_path)}) as c:
        wait_for(lambda: any("could not be warmed" in a for a in c.alerts()), 60,
                 "the failed warm-up to be said")
        alert = next(a for a in c.alerts() if "could not be warmed" in a)
        assert "not in a spare" in alert and "trying again" in alert
        assert c.spares()["pids"] == [] and c.run("x = 1").ok
        c.restart()
        # the restart found it dead and started cold, or the pool's own check had already
        # replaced it and a fresh spare was adopted: either way never the dead one
        w = c.warm_outcome
        assert w is not None and (w.cold == ("worker:0",) or w.adopted == 1), w


def _slow_in_spares(directory: Path, seconds: float) -> dict[str, str]:
    """A preload module whose import takes ``seconds`` in a spare only (a slow warm-up)."""
    (directory / "slow_spare.py").write_text(
        f"import os, time\nif os.environ.get('TFDIST_SPARE') == '1':\n    time.sleep({seconds})\n")
    return {"PYTHONPATH": str(directory)}


def test_a_restart_waits_for_a_spare_still_warming(tmp_path: Path) -> None:
    with Cluster(workers=1, preload=("slow_spare",), warm=1, launcher_options=SPAWNED,
                 env=_slow_in_spares(tmp_path, 1.0)) as c:
        wait_for(lambda: c.spares()["warming"] == 1 and c.spares()["pids"], 20,
                 "the spare to be warming")
        (spare,) = c.spares()["pids"]
        c.restart()
        w = c.warm_outcome
        assert w is not None and (w.adopted, w.still_warming, w.fresh_ports) == (1, 1, True), w
        assert c.tasks[next(iter(c.tasks))].pid == spare
        out = c.run("import os, tfdist_nb.worker as tw; print(os.environ.get('TFDIST_SPARE'), "
                    "tw.task)").tasks["worker:0"]
        assert out.stdout.strip() == "None ('worker', 0)"


def test_a_spare_warming_much_longer_than_a_cold_start_gives_way_to_one(tmp_path: Path) -> None:
    with Cluster(workers=1, preload=("slow_spare",), warm=1, launcher_options=SPAWNED,
                 env=_slow_in_spares(tmp_path, 120)) as c:
        wait_for(lambda: c.spares()["warming"] == 1 and c.spares()["pids"], 20,
                 "the spare to be warming")
        (spare,) = c.spares()["pids"]
        started = time.monotonic()
        c.restart()
        took = time.monotonic() - started
        assert c.tasks[next(iter(c.tasks))].pid != spare and c.run("x = 1").ok
        said = [a for a in c.alerts() if "could not take spare-1" in a]
        assert said and "was still warming" in said[0] and "starting it cold" in said[0], \
            c.alerts()
        assert took < 30, took  # its patience is a cold start's time, x1.5, + 2 s
        wait_for(lambda: gone(spare), 5, "the slow spare to be ended")


#: a preload that marks a spare's entry into its (slow) warm-up import with a file named by its pid
SLOW_IMPORT = ("import os, time\nif os.environ.get('TFDIST_SPARE') == '1':\n"
               "    open(os.path.join({inside!r}, str(os.getpid())), 'w').close()\n"
               "    time.sleep(120)\n")
CONTROLLER = textwrap.dedent("""
    import json, os, sys, time
    from tfdist_nb import Cluster
    c = Cluster(workers=1, preload=("slow_spare",), warm=2,
                launcher_options={"fork": False}).start()
    deadline = time.time() + 60
    while c.spares()["ready"] + c.spares()["warming"] < 1 or not c.spares()["pids"]:
        assert time.time() < deadline, "no spare"
        time.sleep(0.1)
    print(json.dumps(c.spares()["pids"]), flush=True)
    time.sleep(600)
""")


def test_spares_die_with_a_sigkilled_controller(tmp_path: Path) -> None:
    """ipykernel's parent poller ends a spare whose controller died, also one that is busy
    importing its preload."""
    inside = tmp_path / "inside"
    inside.mkdir()
    (tmp_path / "slow_spare.py").write_text(SLOW_IMPORT.format(inside=str(inside)))
    env = {**os.environ, "TFDIST_RUNS_DIR": str(tmp_path / "runs"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                      os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line, "the controller printed no spare pids"
        pids = json.loads(line)
        wait_for(lambda: {str(p) for p in pids} & {f.name for f in inside.iterdir()}, 60,
                 "a spare inside its (slow) warm-up import")
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    wait_for(lambda: all(gone(p) for p in pids), 15, "orphaned spares to exit")


def test_the_benchmark_summary_has_the_warm_goals() -> None:
    """``python -m bench`` reports part (g), bench.warm, goal by goal (canned results)."""
    from bench.__main__ import PARTS, summary

    assert "warm" in PARTS
    res = {"median": {"warm_restart_s": 0.44, "cold_start_2_s": 4.0, "ipyparallel_s": 11.0,
                      "warm_resize_s": 0.3, "cold_start_1_s": 3.0, "step_warm_ms": 6.1,
                      "step_cold_ms": 6.0},
           "ratio": {"restart_vs_cold_start": 0.11, "restart_vs_ipyparallel": 0.04,
                     "resize_vs_cold_start": 0.1, "step_warm_vs_cold": 6.1 / 6.0}}
    rows = summary({"warm": res})
    assert [r["goal"] for r in rows] == ["(g)"] * 4
    assert [r["result"] for r in rows] == ["met", "met", "met", "met"]
