"""The launcher registry is the one way in (no process started): a launcher added by
``register`` (or an entry point) is taken by the magic and the API like the built-in ones, says
what it can do through its capabilities, and takes only the cluster arguments it declares."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pytest

from tests.support.magic_lines import request
from tfdist_nb import Cluster
from tfdist_nb.errors import SpecError
from tfdist_nb.launchers import registry
from tfdist_nb.launchers.base import Launcher, TaskHandle, TaskLaunch
from tfdist_nb.topology import TaskId


class Elsewhere(Launcher):
    """A third-party launcher: tasks on a scheduler of its own (never started here)."""

    name = "elsewhere"
    remote = True

    def __init__(self, queue: str = "default", python: str | None = None) -> None:
        self.queue = queue

    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        return {t: f"node{i}:2222" for i, t in enumerate(tasks)}

    async def start(self, launch: TaskLaunch) -> TaskHandle:
        raise NotImplementedError("not started in these tests")


@pytest.fixture
def elsewhere() -> Iterator[None]:
    registry.register("elsewhere", Elsewhere)
    try:
        yield
    finally:
        registry._added.pop("elsewhere", None)


def test_a_registered_launcher_is_taken_by_the_magic_and_listed(elsewhere: None) -> None:
    assert request("2 workers", launcher="elsewhere").launcher == "elsewhere"
    with pytest.raises(SpecError) as err:
        request("2 workers", launcher="nowhere")
    assert "elsewhere" in str(err.value) and "local" in str(err.value)


def test_a_registered_launcher_gets_its_options_and_refuses_hosts(elsewhere: None) -> None:
    c = Cluster(workers=2, launcher="elsewhere", launcher_options={"queue": "gpu"},
                preload=())
    assert isinstance(c.launcher, Elsewhere) and c.launcher.queue == "gpu"
    assert c.warm == 0  # no spares capability: the cold path, nothing to say
    with pytest.raises(SpecError, match="hosts= is for launcher='ssh'"):
        Cluster(workers=2, launcher="elsewhere", hosts=["h1"])
    with pytest.raises(SpecError, match="warm= needs"):
        Cluster(workers=2, launcher="elsewhere", warm=True)
    with pytest.raises(SpecError, match="launcher 'elsewhere'"):
        Cluster(workers=2, launcher="elsewhere", launcher_options={"colour": "red"})


def test_built_in_launchers_declare_what_they_take() -> None:
    with pytest.raises(SpecError, match="launcher='ssh' needs hosts"):
        Cluster(workers=2, launcher="ssh")
    with pytest.raises(SpecError, match="hosts= is for launcher='ssh'"):
        Cluster(workers=2, launcher="attach", hosts=["h1"])
    with pytest.raises(SpecError, match="drop hosts="):
        Cluster(workers=2, launcher="slurm", hosts=["h1"])
    with pytest.raises(SpecError, match="--sbatch: "):
        request("2 workers", launcher="slurm", sbatch="--ntasks=4")
    local = registry.get_launcher("local")
    assert local.spares and not local.remote
    assert not registry.launcher_class("ssh")(hosts=["h1"]).spares
