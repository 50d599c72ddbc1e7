"""The cluster core (lifecycle, spares, runner) on tasks that are not processes
(tests/support/fake_launcher.py): every way a start, a restart or a cell ends, in milliseconds.
The same paths on real kernels are in test_start_robust.py, test_warm.py, test_failures.py and
test_restart_failures.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_launcher import FakeLauncher
from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.cluster import spares as spares_module
from tfdist_nb.errors import ClusterNotRunningError

pytestmark = pytest.mark.timeout(60)


class IdleHost:
    """The host's CPU as the pool sees it: always a core to spare (a loaded test machine must
    not decide whether a spare starts here)."""

    room_cores = 1.0
    cores = 2
    idle = 2.0

    def idle_cores(self) -> float:
        return IdleHost.idle


@pytest.fixture(autouse=True)
def _idle_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spares_module, "HostCpu", IdleHost)
    monkeypatch.setattr(IdleHost, "idle", 2.0)


def cluster(workers: int = 2, warm: int | bool = False, **fake: Any) -> Cluster:
    return Cluster(workers=workers, launcher=FakeLauncher(**fake), preload=(), warm=warm,
                   start_timeout=20)


@pytest.fixture
def two() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def test_a_cell_runs_on_every_task_and_each_ends_its_own_way(two: Cluster) -> None:
    result = two.run("print hello\nraise ValueError: bad batch", on="worker:1")
    (r,) = result.tasks.values()
    assert (r.status, r.error.ename, r.stdout) == ("error", "ValueError", "hello\n")
    ok = two.run("print fine")
    assert ok.ok and {t.stdout for t in ok.tasks.values()} == {"fine\n"}


def test_a_task_that_dies_in_a_cell_is_crashed_and_the_others_are_released(two: Cluster) -> None:
    result = two.run("worker:1> die -9\nsleep 30", timeout=60)
    died = result.tasks["worker:1"]
    assert died.status == "crashed" and died.explanation and "SIGKILL" in died.explanation
    assert result.tasks["worker:0"].status == "interrupted"  # released at once, not in 30 s
    with pytest.raises(ClusterNotRunningError, match="worker:1 is dead; bring"):
        two.run("print again")
    two.restart()
    assert two.run("print back").ok


def test_a_start_that_fails_once_is_retried_and_said() -> None:
    with cluster(start_fails=["worker:1"]) as c:
        assert c.run("print up").ok
        said = [a for a in c.alerts() if a.startswith("worker:1:")]
        assert said and "failed to start (OSError: could not start worker:1)" in said[0]
        assert "starting it once more" in said[0]


def test_a_restart_that_cannot_start_leaves_dead_tasks_that_say_what_to_do() -> None:
    with cluster() as c:
        c.launcher.start_fails = ["worker:0", "worker:0", "worker:1", "worker:1"]
        with pytest.raises(Exception, match="failed to start"):
            c.restart()
        assert set(c.status()["state"]) == {"dead"}
        assert any("the restart failed" in a for a in c.alerts())
        c.restart()  # the launcher works again
        assert c.run("print back").ok


def test_a_restart_takes_a_ready_spare() -> None:
    with cluster(workers=1, warm=1) as c:
        wait_for(lambda: c.spares()["ready"] == 1, 10, "the spare")
        (spare,) = c.spares()["pids"]
        c.restart()
        w = c.warm_outcome
        assert w is not None and (w.adopted, w.cold, w.still_warming) == (1, (), 0), w
        assert next(iter(c.tasks.values())).pid == spare
        assert sum(k.calls.count("adopt") for k in c.launcher.kernels) == 1
        assert c.run("print adopted").ok


def test_a_spare_much_slower_than_a_cold_start_gives_way_to_one() -> None:
    with cluster(workers=1, warm=1, behaviour={"spare": {"warm_s": 60}}) as c:
        wait_for(lambda: c.spares()["warming"] == 1, 10, "the spare warming")
        c.restart()
        w = c.warm_outcome
        assert w is not None and w.adopted == 1 and w.still_warming == 1  # taken warming,
        said = [a for a in c.alerts() if "could not take spare-1" in a]   # then given up
        assert said and "was still warming" in said[0] and "starting it cold" in said[0]
        assert c.run("print cold").ok


def test_a_spare_whose_adoption_fails_is_replaced_by_a_cold_start() -> None:
    with cluster(workers=1, warm=1, behaviour={"spare": {"adopt_fails": True}}) as c:
        wait_for(lambda: c.spares()["ready"] == 1, 10, "the spare")
        c.restart()
        said = [a for a in c.alerts() if "could not take spare-1" in a]
        assert said and "adoption refused" in said[0], c.alerts()
        assert c.run("print cold").ok


def test_an_interrupt_ends_a_sleeping_cell_as_interrupted(two: Cluster) -> None:
    import threading

    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(two.run("sleep 30")))
    runner.start()
    wait_for(lambda: set(two.status()["state"]) == {"busy"}, 10, "the cell to run")
    two.interrupt()
    runner.join(20)
    assert {r.status for r in results[0].tasks.values()} == {"interrupted"}


def test_a_busy_host_gets_no_spare_until_a_core_is_idle_and_the_pool_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(IdleHost, "idle", 0.2)
    with cluster(workers=1, warm=1) as c:
        wait_for(lambda: "waiting for a core" in (c.spares()["note"] or ""), 10, "the note")
        assert c.spares()["pids"] == [] and "0.2 of 2 idle" in c.spares()["note"]
        IdleHost.idle = 2.0
        wait_for(lambda: c.spares()["ready"] == 1, 10, "the spare once a core is idle")
        assert c.spares()["note"] is None


def test_the_session_knows_which_clusters_run_and_the_registry_reads_it() -> None:
    """The registry's state is the session's (cluster/session.py): a started cluster is live
    and current, a stopped one neither, and still the last one the magics drove."""
    from tfdist_nb.cluster import registry
    from tfdist_nb.cluster.session import SESSION

    with cluster(workers=1) as c:
        assert registry.current() is c is SESSION.clusters.current()
        assert c in registry.live_clusters() and c in SESSION.clusters.live()
    assert registry.current() is None and c not in registry.live_clusters()
    assert registry.last_cluster() is c


def test_spare_pools_are_the_sessions_one_per_kernel_key_taken_and_given_back() -> None:
    """The session owns one spare pool per kernel key (cluster/session.py): two clusters whose
    import-time environments differ keep separate pools; the cluster that replaces one
    (``stop(keep_spares=True)``, a resize) takes the pool of its key and its spares become its
    tasks; a stop without keep ends the pool; the session's close ends every pool left."""
    from tfdist_nb.cluster.session import SESSION

    def make(launcher: FakeLauncher, tf_x: str) -> Cluster:
        return Cluster(workers=1, launcher=launcher, preload=(), warm=1, start_timeout=20,
                       env={"TF_X": tf_x}).start()

    fakes = [FakeLauncher() for _ in range(3)]
    a, b = make(fakes[0], "a"), make(fakes[1], "b")
    try:
        wait_for(lambda: a.spares()["ready"] == b.spares()["ready"] == 1, 10, "two spares")
        pools = {id(c._lifecycle.spares) for c in (a, b) if c._lifecycle}
        assert len(pools) == 2 and len(SESSION._pools) == 2
        (spare,) = a.spares()["pids"]
        a.stop(keep_spares=True)  # kept in the session for the next cluster of its key
        assert len(SESSION._pools) == 2
        resized = make(fakes[2], "a")
        w = resized.warm_outcome
        assert w is not None and w.adopted == 1, w
        assert next(iter(resized.tasks.values())).pid == spare
        resized.stop()  # nobody else uses its pool: it ends
        assert len(SESSION._pools) == 1
    finally:
        SESSION.close()
    assert not SESSION._pools and not b.running
    spares = [k for f in fakes for k in f.kernels if k.launch.task.role == "spare"]
    assert len(spares) >= 2 and all(k.exit_code is not None for k in spares)


def test_an_aborted_collective_is_explained_by_a_second_strategy_only_where_one_was_made(
        tmp_path: Path) -> None:
    """worker:1 made a second strategy (its note said so), worker:0 did not: the same abort
    is explained by it on worker:1 alone; the first task to say it alerts, the second's same
    words are kept without a second alert; a restart forgets it."""
    from tfdist_nb.cluster.cells import Cells
    from tfdist_nb.cluster.hub import EventHub
    from tfdist_nb.events import Finding, TelemetrySample
    from tfdist_nb.results import RemoteError, RunResult, TaskResult, TaskStatus
    from tfdist_nb.store.rundir import RunDirectory
    from tfdist_nb.store.tails import LiveStore

    hub = EventHub(RunDirectory(tmp_path, "c1"), LiveStore(), dict)
    said = {"text": "MultiWorkerMirroredStrategy number 2 (cell 2 line 2) ...", "level":
            "WARNING", "finding": str(Finding.SECOND_STRATEGY)}
    for task in ("worker:1", "worker:2"):
        hub.sink([TelemetrySample(1.0, task, {"notes": [said]})])
    said_alerts = [a for a in hub.alerts if a.kind == Finding.SECOND_STRATEGY]
    assert len(said_alerts) == 1 and "number 2" in said_alerts[0].text
    abort = ("Collective ops is aborted by: Delete called on non-empty BufRendezvous "
             "[Op:CollectiveReduceV2]")
    result = RunResult(cell=2, tasks={
        t: TaskResult(t, TaskStatus.ERROR, error=RemoteError("InternalError", abort, []))
        for t in ("worker:0", "worker:1")})
    Cells._explain_second_strategy(result, hub)
    assert result.tasks["worker:0"].explanation is None
    assert (result.tasks["worker:1"].explanation or "").startswith(
        "This task made a second MultiWorkerMirroredStrategy in the same process")
    hub.live.view("worker:1").new_process()
    assert not hub.live.view("worker:1").findings
