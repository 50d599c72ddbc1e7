"""A restart that cannot complete leaves nothing running and says what to do; a run directory
removed under a running cluster is made again (real 2-task clusters)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.processes import worker_kernels
from tfdist_nb import Cluster
from tfdist_nb.errors import ClusterNotRunningError, ClusterStartError

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def test_a_failed_restart_leaves_dead_tasks_no_process_and_a_way_back(tmp_path: Path) -> None:
    with Cluster(workers=2, run_dir=tmp_path) as c:
        assert c.run("x = 1").ok
        before = worker_kernels()
        tasks = c.run_dir / "tasks"
        shutil.rmtree(tasks)
        tasks.write_text("in the way")  # the tasks' directories cannot be made
        with pytest.raises(ClusterStartError, match="worker:0 failed to start"):
            c.restart()
        assert {str(rt.state) for rt in c.tasks.values()} == {"dead"}
        assert not worker_kernels() & before and not worker_kernels()  # none left running
        said = [a for a in c.alerts() if "the restart failed" in a]
        assert len(said) == 2 and all("%tfdist_restart to try again" in a for a in said)
        with pytest.raises(ClusterNotRunningError, match="worker:0, worker:1 are dead; bring "
                                                         "them back with %tfdist_restart"):
            c.run("x = 2")
        tasks.unlink()  # the way back: mend it, restart again
        c.restart()
        assert c.run("print('back')").ok


def test_a_run_directory_removed_while_the_cluster_runs_is_made_again(tmp_path: Path) -> None:
    with Cluster(workers=2, run_dir=tmp_path) as c:
        shutil.rmtree(c.run_dir)
        result = c.run("print('kept')")
        assert result.ok
        assert any("was removed while the cluster ran: made it again" in a for a in c.alerts())
        assert "kept" in list(c.logs(on="worker:0")["text"])
        assert (c.run_dir / "events.jsonl").stat().st_mode & 0o777 == 0o600
        shutil.rmtree(c.run_dir)
        c.restart()  # its tasks' directories are made again too
        assert c.run("print('restarted')").ok
        assert "restarted" in list(c.logs(on="worker:1")["text"])


def test_a_restart_it_can_refuse_first_leaves_the_running_tasks_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebook's working directory deleted under a running cluster: a restart says so,
    naming it, before it kills anything (the tasks keep their state); back in a directory that
    exists, the restart works. A start there, and a relative run directory, are refused the
    same way, and a run directory that cannot be made is a SpecError naming it."""
    from tfdist_nb.errors import SpecError

    gone = tmp_path / "work"
    gone.mkdir()
    monkeypatch.chdir(gone)
    with Cluster(workers=1, preload=(), warm=False, run_dir=tmp_path / "runs") as c:
        assert c.run("x = 41").ok
        pids = {rt.pid for rt in c.tasks.values()}
        gone.rmdir()
        with pytest.raises(ClusterStartError, match=f"working directory {gone} was deleted"):
            c.restart()
        assert {rt.pid for rt in c.tasks.values()} == pids
        assert c.run("print(x + 1)").tasks["worker:0"].stdout.strip() == "42"
        with pytest.raises(ClusterStartError, match=f"working directory {gone} was deleted"):
            Cluster(workers=1, preload=(), warm=False, run_dir=tmp_path / "runs").start()
        with pytest.raises(SpecError, match="relative to the working directory, which was "
                                            "deleted"):
            Cluster(workers=1, preload=(), warm=False, run_dir="runs").start()
        monkeypatch.chdir(tmp_path)
        c.restart()
        assert c.run("print('back')").ok
    with pytest.raises(SpecError, match="cannot make the run directory under /proc/tfdist_x "):
        Cluster(workers=1, preload=(), run_dir="/proc/tfdist_x").start()
