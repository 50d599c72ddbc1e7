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
    job = Running(parse_spec("2 workers"), launcher="slurm", sbatch=["--nodes=2"],
                  restartable=False)
    decided = plan(request("", restart=True), job)
    assert decided.action == "replace" and decided.message == "restarting all tasks of 2 workers"
    assert decided.new is not None and decided.new.launcher == "slurm"
    kept = plan(request("", restart=True, warm=False), Running(parse_spec("2 workers"), warm=2))
    assert (kept.action, kept.set_warm) == ("restart", False)
