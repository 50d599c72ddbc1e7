"""%tfdist_export: the reproducer runs outside Jupyter and gives what the notebook run gave."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cells import cell
from tfdist_nb import Cluster
from tfdist_nb.cluster.export import plain_python

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
FINAL = re.compile(r"(worker:\d) final loss ([0-9.]+) after 20 steps")


def _final_losses(text: str) -> dict[str, str]:
    return dict(FINAL.findall(text))


def test_export_round_trip_and_a_failing_task_fails_the_launch(tmp_path: Path) -> None:
    with Cluster(workers=2, env={"REPRO_FLAVOUR": "mint"}) as c:
        first = c.run(cell("mwms_loop"), timeout=120)
        assert first.ok, first.summary()
        notebook = _final_losses("".join(r.stdout for r in first.tasks.values()))
        assert set(notebook) == {"worker:0", "worker:1"}
        c.run("print('only on', tw.task)", on="worker:1")
        out = c.export(tmp_path / "repro")
    train = (out / "train.py").read_text()
    assert "# --- cell 1 (every task) ---" in train
    assert "# --- cell 2 (only worker:1) ---" in train
    assert "export REPRO_FLAVOUR=mint" in (out / "launch.sh").read_text()

    run = subprocess.run(["bash", str(out / "launch.sh")], capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    # every line attributed to its task, the same training result as in the notebook
    assert _final_losses("\n".join(line.split("] ", 1)[1] for line in lines
                                   if line.startswith("[worker:"))) == notebook
    assert "[worker:1] only on ('worker', 1)" in lines
    assert not [x for x in lines if x.startswith("[worker:0] only on")]
    assert sum(1 for x in lines if x.startswith("[worker:0] loss ")) == 20

    # a task that fails makes the launch fail, naming it (a train.py that only fails there:
    # the launcher's bookkeeping is what is tested, not the training again)
    (out / "train.py").write_text("import os\n"
                                  "if os.environ['TFDIST_TASK'] == 'worker:1':\n"
                                  "    raise SystemExit(3)\n")
    run = subprocess.run(["bash", str(out / "launch.sh")], capture_output=True, text=True,
                         timeout=240)
    assert run.returncode != 0
    assert "launch.sh: worker:1 failed" in run.stderr
    assert "launch.sh: worker:0 failed" not in run.stderr


def test_notebook_machinery_is_left_out_with_a_comment() -> None:
    code = "%time x = 1\n!ls\nfor i in range(2):\n    %timeit i\nprint('kept')\n"
    out = plain_python(code)
    assert out.splitlines() == [
        "pass  # tfdist_nb export: IPython-only, left out: %time x = 1",
        "pass  # tfdist_nb export: IPython-only, left out: !ls",
        "for i in range(2):",
        "    pass  # tfdist_nb export: IPython-only, left out: %timeit i",
        "print('kept')"]
    compile(out, "cell", "exec")  # still valid Python


def _export(directory: Path, force: bool = False, env: dict | None = None,
            code: str = "x = 1") -> Path:
    from tfdist_nb.cluster.export import export
    from tfdist_nb.topology import ClusterSpec

    return export(directory, cluster_id="c1", spec=ClusterSpec(workers=2),
                  cells=[{"cell": 1, "code": code, "targets": ["worker:0", "worker:1"]}],
                  env=env or {}, python="python", force=force)


def test_export_keeps_the_users_own_files_and_follows_no_symlink(tmp_path: Path) -> None:
    import os
    import stat

    from tfdist_nb.cluster.export import ExportError

    mine = tmp_path / "train.py"
    mine.write_text("print('my own training script')\n")
    with pytest.raises(ExportError, match=r"train\.py exists and was not written by"):
        _export(tmp_path)
    assert mine.read_text() == "print('my own training script')\n"
    assert not (tmp_path / "launch.sh").exists()  # nothing half-written
    out = _export(tmp_path, force=True)
    assert "Reproducer exported by tfdist_nb" in (out / "train.py").read_text()
    assert _export(tmp_path) == out  # its own files it replaces without --force
    modes = {n: stat.S_IMODE(os.stat(out / n).st_mode) for n in ("train.py", "launch.sh")}
    assert modes == {"train.py": 0o600, "launch.sh": 0o700}
    # a symlink planted in its place (to a file of someone else's) is never written through:
    # kept without --force, replaced by a file of its own with it
    target = tmp_path / "elsewhere.sh"
    target.write_text("untouched\n")
    (out / "launch.sh").unlink()
    (out / "launch.sh").symlink_to(target)
    with pytest.raises(ExportError, match=r"launch\.sh exists and was not written by"):
        _export(tmp_path)
    _export(tmp_path, force=True)
    assert target.read_text() == "untouched\n"
    assert not (out / "launch.sh").is_symlink() and stat.S_IMODE(
        os.stat(out / "launch.sh").st_mode) == 0o700
    with pytest.raises(ExportError, match=r"cannot make the directory .*Not a directory"):
        _export(target / "repro")


def test_export_names_what_look_like_secrets_without_showing_them(tmp_path: Path) -> None:
    from tfdist_nb.cluster.export import SecretsWarning

    code = "api_key = 'sk-123'\nlr = 0.1\nos.environ['WANDB_API_KEY'] = 'w-9'\n"
    with pytest.warns(SecretsWarning) as said:
        _export(tmp_path, env={"HF_TOKEN": "hf-1", "TF_USE_LEGACY_KERAS": "1"}, code=code)
    text = str(said[0].message)
    for name in ("launch.sh: HF_TOKEN", "cell 1: api_key", "WANDB_API_KEY"):
        assert name in text, text
    assert "sk-123" not in text and "hf-1" not in text and "lr" not in text


OTHER_UID = 65534  # nobody


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's files needs root (as in a "
                    "root notebook, the case this guards)")
def test_files_and_directories_of_another_user_are_never_written(tmp_path: Path) -> None:
    """A root notebook writing into a directory another user can write: that user's planted
    train.py (starting with tfdist's own header) is not "ours", a directory of theirs (or a
    link of theirs to one of ours) is refused, and nothing of the cells reaches their files."""
    from tfdist_nb.cluster.export import OURS, ExportError

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chown(shared, OTHER_UID, OTHER_UID)
    planted = shared / "train.py"
    planted.write_text(OURS["train.py"] + " (planted)\n")
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(ExportError, match=r"not yours to write into \(it belongs to uid 65534"):
        _export(shared, force=True)
    assert planted.read_text().endswith("(planted)\n") and sorted(
        p.name for p in shared.iterdir()) == ["train.py"]
    # their link to a directory of ours: refused too (they choose where it points)
    mine = tmp_path / "mine"
    mine.mkdir()
    link = tmp_path / "link"
    link.symlink_to(mine)
    os.lchown(link, OTHER_UID, OTHER_UID)
    with pytest.raises(ExportError, match="it belongs to uid 65534"):
        _export(link)
    assert list(mine.iterdir()) == []
    # in a directory of ours, their file with our header is not ours: kept
    theirs = mine / "train.py"
    theirs.write_text(OURS["train.py"] + " (theirs)\n")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(ExportError, match=r"train\.py exists and was not written by"):
        _export(mine)
    assert theirs.read_text().endswith("(theirs)\n")


def test_restarts_are_found_by_their_records_never_by_words() -> None:
    """Isolate and export replay the cells after every task was last restarted: a restart is
    one ``Restart`` record in the run directory, read back by its fields, not a line or a note
    whose text begins with 'restart'; each task's log says how it came back."""
    from tfdist_nb.cluster.export import restart_times
    from tfdist_nb.events import Restart
    from tfdist_nb.lab.model import compact_event
    from tfdist_nb.store.logs import logs_frame

    both = Restart(10.0, {"worker:0": "spare", "worker:1": "forked"},
                   {"worker:0": "127.0.0.1:2001", "worker:1": "127.0.0.1:2002"}, 0.51)
    one = Restart(30.0, {"worker:1": "cold"}, seconds=4.2)
    events = [
        {"kind": "output", "time": 1.0, "task": "worker:0", "text": "restarting the epoch"},
        {"kind": "note", "time": 2.0, "task": "worker:0", "text": "restarted by hand?"},
        both.to_json(), one.to_json()]
    assert restart_times(events, ["worker:0", "worker:1"]) == [10.0]
    assert restart_times(events, ["worker:1"]) == [10.0, 30.0]
    assert Restart(**both.to_json()) == both
    assert str(both) == ("restarted in 0.5s, on fresh TF ports: worker:0 from a spare; "
                         "worker:1 forked from the fork server")
    assert compact_event(both.to_json()) == {  # the panel's line: the whole restart
        "time": 10.0, "task": "cluster", "stream": "note", "text": str(both), "cell": None,
        "level": "INFO"}
    said = logs_frame(events, on={"worker:1"}, grep="^restarted").text.tolist()
    assert said == ["restarted in 0.5s, forked from the fork server, on a fresh TF port "
                    "(127.0.0.1:2002)", "restarted in 4.2s, spawned cold, with the same TF_CONFIG"]
