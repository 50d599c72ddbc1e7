"""What a %%tfcluster line asks of the cluster that exists (pure planning)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.magic_lines import request
from tfdist_nb.errors import SpecError
from tfdist_nb.magics.request import plan
from tfdist_nb.topology import parse_spec


def test_first_line_starts() -> None:
    assert plan(request("2 workers"), None).action == "start"


def test_same_spec_reuses_and_no_spec_reuses() -> None:
    two = parse_spec("2 workers")
    assert plan(request("2 workers"), two).action == "reuse"
    assert plan(request(""), two).action == "reuse"


def test_different_spec_resizes_with_message() -> None:
    decided = plan(request("1 worker"), parse_spec("2 workers"))
    assert decided.action == "replace"
    assert decided.message == "resized: 2 workers -> 1 worker"


def test_env_change_needs_fresh_kernels_but_same_env_reuses() -> None:
    two = parse_spec("2 workers")
    legacy = request("2 workers", env=["TF_USE_LEGACY_KERAS=1"])
    assert plan(legacy, two, {}).action == "replace"
    assert plan(legacy, two, {"TF_USE_LEGACY_KERAS": "1"}).action == "reuse"
    assert plan(request("2 workers"), two, {"TF_USE_LEGACY_KERAS": "1"}).action == "reuse"


def test_restart_flag() -> None:
    assert plan(request("", restart=True), parse_spec("2 workers")).action == "restart"


def test_on_is_checked_against_the_new_spec() -> None:
    with pytest.raises(SpecError, match="no task worker:1 in a cluster of 1 worker"):
        plan(request("1 worker", on="1"), parse_spec("2 workers"))
    assert plan(request("", on="1"), parse_spec("2 workers")).action == "reuse"


def test_hosts_imply_ssh_and_a_remote_python_is_not_looked_up_here(tmp_path: Path) -> None:
    req = request("2 workers", hosts="gpu1, me@gpu2", python="/opt/venv/bin/python")
    assert req.launcher == "ssh" and req.hosts == ["gpu1", "me@gpu2"]
    assert req.python == "/opt/venv/bin/python"
    assert request("2 workers", connection_dir=str(tmp_path)).launcher == "attach"


def test_changing_hosts_or_launcher_replaces_the_cluster() -> None:
    two = parse_spec("2 workers")
    here = ("ssh", ["gpu1", "gpu2"])
    assert plan(request("2 workers", hosts="gpu1,gpu2"), two, current_place=here).action == \
        "reuse"
    moved = plan(request("2 workers", hosts="gpu3"), two, current_place=here)
    assert moved.action == "replace" and moved.message == "restarting the cluster: --hosts changed"
    assert plan(request("2 workers", launcher="local"), two,
                current_place=here).message == "restarting the cluster: launcher ssh -> local"
    assert plan(request(""), two, current_place=here).action == "reuse"  # line keeps placement
