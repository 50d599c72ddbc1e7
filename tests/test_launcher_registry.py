"""The launcher registry is the one way in (no process started): a launcher added by
``register`` (or an entry point) is taken by the magic and the API like the built-in ones, says
what it can do through its capabilities, and takes only the cluster arguments it declares."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from tests.support.magic_lines import request
from tfdist_nb import Cluster
from tfdist_nb.errors import SpecError
from tfdist_nb.launchers import registry
from tfdist_nb.launchers.base import Launcher, LauncherOption, TaskHandle, TaskLaunch
from tfdist_nb.magics.request import ClusterRequest
from tfdist_nb.topology import TaskId


class Elsewhere(Launcher):
    """A third-party launcher: tasks on a scheduler of its own (never started here)."""

    name = "elsewhere"
    remote = True
    line_options = (LauncherOption("--queue", "queue", metavar="NAME", help="its queue"),)

    def __init__(self, queue: str = "default", python: str | None = None) -> None:
        self.queue = queue

    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        return {t: f"node{i}:2222" for i, t in enumerate(tasks)}

    async def start(self, launch: TaskLaunch) -> TaskHandle:
        raise NotImplementedError("not started in these tests")


class Strict(Elsewhere):
    """Another third-party launcher, which cannot start without its flag."""

    name = "strict"
    line_options = (LauncherOption("--queue", "queue", metavar="NAME", required=True),)


@pytest.fixture
def elsewhere() -> Iterator[None]:
    registry.register("elsewhere", Elsewhere)
    registry.register("strict", Strict)
    try:
        yield
    finally:
        registry._added.pop("elsewhere", None)
        registry._added.pop("strict", None)


def magic_line(line: str) -> ClusterRequest:
    """The request the ``%%tfcluster`` magic reads from ``line`` (its own parser; nothing
    starts)."""
    from IPython.core.interactiveshell import InteractiveShell

    from tfdist_nb.magics.run import RunMagics

    return RunMagics(InteractiveShell.instance())._read_line(line)[1]


def magic_parser() -> Any:
    from IPython.core.interactiveshell import InteractiveShell

    from tfdist_nb.magics.run import RunMagics

    return RunMagics(InteractiveShell.instance()).tfcluster.parser


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


def test_a_plugin_launchers_flags_are_read_from_its_schema(elsewhere: None) -> None:
    """The magic does not declare --queue: the launcher's ``line_options`` do, so a flag of
    a launcher from an entry point names it, sets its option, and is refused for another."""
    for line in ("2 workers --queue gpu", "--queue gpu 2 workers", "2 workers --queue=gpu",
                 "2 workers --launcher elsewhere --queue gpu --timeout 5"):
        req = magic_line(line)
        assert (req.launcher, req.launcher_options, req.spec) == (
            "elsewhere", {"queue": "gpu"}, request("2 workers").spec), line
    with pytest.raises(SpecError, match="--queue needs --launcher elsewhere or strict; the "
                                        "local launcher does not use it"):
        magic_line("2 workers --launcher local --queue gpu")
    with pytest.raises(SpecError, match="--launcher strict needs --queue NAME"):
        magic_line("2 workers --launcher strict")
    with pytest.raises(SpecError, match="unrecognized arguments: --colour red"):
        magic_line("2 workers --launcher elsewhere --colour red")


def test_the_magic_declares_the_built_in_launchers_flags_as_their_schemas_do() -> None:
    """``%%tfcluster?`` lists the built-in launchers' flags (declared by the magic); they are
    the ones their ``line_options`` declare, with the same help, and every other option of
    the magic is its own (magics/launcher_flags.py, MAGIC_OWN)."""
    from tfdist_nb.magics.launcher_flags import MAGIC_OWN

    actions = {a.option_strings[0] if a.option_strings else a.dest: a
               for a in magic_parser()._actions}
    declared = [o for name in registry.BUILTIN
                for o in registry.launcher_class(name).line_options]
    assert declared, "the built-in launchers declare their flags"
    for option in declared:
        action = actions[option.flag]
        assert (action.dest, action.metavar, action.help) == (
            option.dest, option.metavar, option.help), option.flag
    assert {a.dest for a in actions.values()} - MAGIC_OWN == {o.dest for o in declared}


def test_a_dashed_flags_value_is_glued_and_a_missing_value_is_left_to_the_parser() -> None:
    from tfdist_nb.magics.launcher_flags import glue_values

    assert glue_values('2 workers --sbatch "--nodes=2"') == "2 workers --sbatch=--nodes=2"
    assert glue_values("2 workers --hosts --timeout 5") == "2 workers --hosts --timeout 5"
    assert glue_values("2 workers --sbatch") == "2 workers --sbatch"
    assert magic_line('2 workers --sbatch "--nodes=2"').launcher_options == {
        "sbatch_args": ["--nodes=2"]}


def test_a_launcher_installed_after_the_first_line_is_found_when_named(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry points are read once (not on every line); a name not among them is looked up
    again, so a plugin installed while the notebook runs works once it is named."""
    registry.available()  # the group as it was before the install
    (tmp_path / "later_launcher.py").write_text(
        "from tfdist_nb.launchers.base import Launcher\n\n"
        "class Later(Launcher):\n"
        "    name = 'later'\n"
        "    def tf_addresses(self, tasks, avoid=None):\n"
        "        return {}\n"
        "    async def start(self, launch):\n"
        "        raise NotImplementedError\n")
    info = tmp_path / "later_launcher-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: later-launcher\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[tfdist_nb.launchers]\nlater = later_launcher:Later\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "later" not in registry.available()  # the scan made before the install
        assert magic_line("2 workers --launcher later").launcher == "later"
        assert registry.launcher_class("later").name == "later"
        assert "later" in registry.available()
    finally:
        monkeypatch.undo()
        registry.available(fresh=True)


def test_the_ray_launchers_flags_imply_it_and_a_bad_strategy_is_refused() -> None:
    req = magic_line("2 workers --ray-address ray://head:10001 --ray-strategy strict_spread")
    assert req.launcher == "ray"
    assert req.launcher_options == {"address": "ray://head:10001", "strategy": "STRICT_SPREAD"}
    with pytest.raises(Exception, match=r"--ray-strategy takes PACK, SPREAD, STRICT_SPREAD, "
                                        r"got 'anywhere'"):
        magic_line("2 workers --ray-strategy anywhere")
    with pytest.raises(SpecError, match=r"drop hosts= and name the cluster"):
        Cluster(workers=2, launcher="ray", hosts=["gpu1"])
