"""What a %%tfcluster line asks of the cluster that exists (pure planning)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.magic_lines import request
from tfdist_nb.errors import SpecError
from tfdist_nb.magics.request import Running, plan
from tfdist_nb.topology import parse_spec


def test_first_line_starts() -> None:
    assert plan(request("2 workers"), None).action == "start"


def test_same_spec_reuses_and_no_spec_reuses() -> None:
    two = Running(parse_spec("2 workers"))
    assert plan(request("2 workers"), two).action == "reuse"
    assert plan(request(""), two).action == "reuse"


def test_different_spec_resizes_with_message() -> None:
    decided = plan(request("1 worker"), Running(parse_spec("2 workers")))
    assert decided.action == "replace"
    assert decided.message == "resized: 2 workers -> 1 worker"


def test_env_change_needs_fresh_kernels_but_same_env_reuses() -> None:
    two = parse_spec("2 workers")
    legacy = request("2 workers", env=["TF_USE_LEGACY_KERAS=1"])
    assert plan(legacy, Running(two, env={})).action == "replace"
    assert plan(legacy, Running(two, env={"TF_USE_LEGACY_KERAS": "1"})).action == "reuse"
    assert plan(request("2 workers"),
                Running(two, env={"TF_USE_LEGACY_KERAS": "1"})).action == "reuse"


def test_restart_flag() -> None:
    assert plan(request("", restart=True), Running(parse_spec("2 workers"))).action == "restart"


def test_on_is_checked_against_the_new_spec() -> None:
    with pytest.raises(SpecError, match="no task worker:1 in a cluster of 1 worker"):
        plan(request("1 worker", on="1"), Running(parse_spec("2 workers")))
    assert plan(request("", on="1"), Running(parse_spec("2 workers"))).action == "reuse"


def test_hosts_imply_ssh_and_a_remote_python_is_not_looked_up_here(tmp_path: Path) -> None:
    req = request("2 workers", hosts="gpu1, me@gpu2", python="/opt/venv/bin/python")
    assert req.launcher == "ssh" and req.hosts == ["gpu1", "me@gpu2"]
    assert req.python == "/opt/venv/bin/python"
    assert request("2 workers", connection_dir=str(tmp_path)).launcher == "attach"


def test_changing_hosts_or_launcher_replaces_the_cluster() -> None:
    here = Running(parse_spec("2 workers"), launcher="ssh", hosts=["gpu1", "gpu2"])
    assert plan(request("2 workers", hosts="gpu1,gpu2"), here).action == "reuse"
    moved = plan(request("2 workers", hosts="gpu3"), here)
    assert moved.action == "replace" and moved.message == "restarting the cluster: --hosts changed"
    assert plan(request("2 workers", launcher="local"),
                here).message == "restarting the cluster: launcher ssh -> local"
    assert plan(request(""), here).action == "reuse"  # line keeps placement


def test_a_resize_keeps_what_the_line_does_not_change() -> None:
    """The replacement is decided here, not in the magic: env, interpreter, launcher, hosts
    and launcher options carry over; spares too, unless they were turned off."""
    here = Running(parse_spec("2 workers"), env={"A": "1"}, python="/opt/py", launcher="ssh",
                   hosts=["gpu1", "gpu2"], launcher_options={"ssh_config": "/cfg"}, warm=0)
    new = plan(request("1 worker"), here).new
    assert new is not None and new.spec == parse_spec("1 worker")
    assert (new.env, new.python, new.launcher, new.hosts, new.launcher_options, new.warm) == (
        {"A": "1"}, "/opt/py", "ssh", ["gpu1", "gpu2"], {"ssh_config": "/cfg"}, False)
    local = plan(request("1 worker", env=["B=2"], warm=True), Running(parse_spec("2 workers"),
                                                                      warm=2)).new
    assert local is not None and (local.env, local.launcher, local.warm) == ({"B": "2"}, "local",
                                                                            True)


def test_restart_replaces_a_cluster_whose_launcher_cannot_restart_tasks() -> None:
    job = Running(parse_spec("2 workers"), launcher="slurm",
                  launcher_options={"sbatch_args": "--nodes=2"},
                  line_values={"sbatch_args": ["--nodes=2"]}, restartable=False)
    decided = plan(request("", restart=True), job)
    assert decided.action == "replace" and decided.message == "restarting all tasks of 2 workers"
    assert decided.new is not None and decided.new.launcher == "slurm"
    assert decided.new.launcher_options == {"sbatch_args": "--nodes=2"}
    # the line's --sbatch is compared with what the launcher runs with, not the raw argument
    assert plan(request("", sbatch="--nodes=2"), job).action == "reuse"
    other = plan(request("", sbatch="--nodes=3"), job)
    assert (other.action, other.message) == ("replace", "restarting the cluster: --sbatch changed")
    kept = plan(request("", restart=True, warm=False), Running(parse_spec("2 workers"), warm=2))
    assert (kept.action, kept.set_warm) == ("restart", False)


def test_the_planner_decides_whether_a_replacement_takes_over_the_spares() -> None:
    """``stop(keep_spares=)`` of the running cluster is the plan's: only a replacement on the
    same launcher that keeps spares takes them; a start, reuse or restart keeps none."""
    warm = Running(parse_spec("2 workers"), warm=2)
    assert plan(request("1 worker"), warm).keep_spares
    assert plan(request("1 worker", warm=True), warm).keep_spares
    assert plan(request("2 workers", env=["A=1"]), warm).keep_spares
    assert not plan(request("1 worker", warm=False), warm).keep_spares
    assert not plan(request("1 worker", hosts="gpu1"), warm).keep_spares  # ssh: no spares
    assert not plan(request("1 worker"), Running(parse_spec("2 workers"), warm=0)).keep_spares
    assert not plan(request("2 workers"), None).keep_spares
    for line in (request(""), request("", restart=True)):
        assert not plan(line, warm).keep_spares


def test_launcher_flags_come_from_the_launchers_schema(tmp_path: Path) -> None:
    """Each flag sets the option its launcher declares; a changed one replaces the cluster
    and is named."""
    job = request("2 workers", sbatch="--partition=gpu --nodes=2")
    assert (job.launcher, job.launcher_options, job.hosts) == (
        "slurm", {"sbatch_args": ["--partition=gpu", "--nodes=2"]}, None)
    attached = request("2 workers", connection_dir=str(tmp_path))
    assert attached.launcher_options == {"connection_dir": str(tmp_path)}
    here = Running(parse_spec("2 workers"), launcher="attach",
                   line_values={"connection_dir": str(tmp_path)}, restartable=False)
    assert plan(attached, here).action == "reuse"
    (tmp_path / "other").mkdir()
    moved = plan(request("2 workers", connection_dir=str(tmp_path / "other")), here)
    assert moved.message == "restarting the cluster: --connection-dir changed"
    assert moved.new is not None and moved.new.launcher_options == {
        "connection_dir": str(tmp_path / "other")}
