"""%tfdist_export: the reproducer runs outside Jupyter and gives what the notebook run gave."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cell
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

    # a task that fails makes the launch fail, naming it
    (out / "train.py").write_text((out / "train.py").read_text() +
                                  "\nif TASK == 'worker:1':\n    raise SystemExit(3)\n")
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
