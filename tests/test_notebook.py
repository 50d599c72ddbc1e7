"""The magics inside a real notebook kernel (nbclient), which starts the worker kernels itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.notebooks import ANSI, cell_text, run_notebook

pytestmark = [pytest.mark.cluster, pytest.mark.compat]
REPO = Path(__file__).resolve().parents[1]


def text_of(cell: Any) -> str:
    return cell_text(cell)


def errors_of(cell: Any) -> list[str]:
    return [out.ename for out in cell.outputs if out.output_type == "error"]


@pytest.mark.user
def test_quickstart_command_runs_the_notebook_and_prints_the_summary(tmp_path: Path) -> None:
    saved = tmp_path / "executed.ipynb"
    env = {**os.environ, "TFDIST_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.run([sys.executable, "-m", "tfdist_nb", "quickstart", "--no-colour",
                           "--save", str(saved)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] {task} final loss" in out  # the MWMS custom loop, attributed
        assert f"[{task}] keras tf_keras" in out  # tf_keras model.fit after the restart
    assert "restarting the cluster: --env changed" in out
    assert "[worker:0] replicas in sync: 2" in out
    assert "[worker:1] only ('worker', 1)" in out
    assert "[worker:0] only" not in out
    summary = out[out.index(">>> %tfdist_status --table"):]
    assert "worker:0" in summary and "worker:1" in summary and "idle" in summary
    assert "stopped 2 task(s) of 2 workers" in out
    code_cells = sum(c.cell_type == "code" for c in nbformat.read(
        REPO / "examples" / "01_quickstart.ipynb", as_version=4).cells)
    assert f"tfdist-nb: quickstart ran {code_cells} code cells in " in out
    python = (os.path.relpath(sys.executable, REPO) if sys.executable.startswith(f"{REPO}/")
              else sys.executable)  # as the README's commands name it: .venv/bin/python
    assert "What next:" in out and f"  {python} -m tfdist_nb lab " in out
    # a healthy run: no warning about any task, and nothing from the notebook's own kernel
    # (it runs on ipc sockets, so ipykernel has no plain-TCP warning to print)
    assert "] tfdist_nb: " not in out, out
    assert "without encryption" not in out + proc.stderr
    nb = nbformat.read(saved, as_version=4)
    assert not [e for c in nb.cells if c.cell_type == "code" for e in errors_of(c)]
    logs = next(c for c in nb.cells if c.source.startswith("%tfdist_logs"))
    shown = "".join(o.get("data", {}).get("text/plain", "") for o in logs.outputs)
    # the value grepped for, whole (pandas cut the text column at 50 characters)
    assert len(re.findall(r"final loss \d+\.\d+ steps \d+", shown)) == 2, shown
    assert "final loss" in out[out.index(">>> %tfdist_logs"):]
    # in the notebook's own outputs, in order: each task's tf.print lines (its stderr) before
    # the print that followed them (stdout), and the cell's closing lines after every task line
    first = next(c for c in nb.cells if c.cell_type == "code" and "%%tfcluster" in c.source)
    lines = ANSI.sub("", "".join(o.get("text", "") for o in first.outputs)).splitlines()
    task_lines = [i for i, ln in enumerate(lines) if ln.startswith("[worker:")]
    closing = [i for i, ln in enumerate(lines) if ln.startswith("tfdist_nb: ")
               and i > min(task_lines)]
    assert closing and min(closing) > max(task_lines), lines
    for task in ("worker:0", "worker:1"):
        losses = [i for i, ln in enumerate(lines) if ln.startswith(f"[{task}] loss ")]
        final = next(i for i, ln in enumerate(lines) if ln.startswith(f"[{task}] {task} final"))
        assert len(losses) == 20 and max(losses) < final, lines


def test_quickstart_lab_passes_jupyter_labs_own_options_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tfdist_nb import cli

    opened: list[tuple[Path, list[str]]] = []
    monkeypatch.setattr(cli, "lab", lambda where, extra: opened.append((where, extra)) or 0)
    assert cli.main(["quickstart", "--lab", "--no-browser", "--port", "8899"]) == 0
    assert opened == [(cli.examples_dir(), ["--no-browser", "--port", "8899"])]
    with pytest.raises(SystemExit):  # without --lab, an unknown option is refused
        cli.main(["quickstart", "--no-browser"])


def test_error_resize_and_on_in_a_notebook(tmp_path: Path) -> None:
    nb = run_notebook([
        "%load_ext tfdist_nb",
        "%%tfcluster 2 workers\nimport tfdist_nb.worker as tw\nprint('hello')\n"
        "if tw.task[1] == 1:\n    raise ValueError('bad shard on 1')",
        "%%tfcluster 1 worker\nimport tfdist_nb.worker as tw\nprint('alone as', tw.task)",
        "%%tfcluster 1 worker --on worker:3\nprint('never')",
        "%%tfcluster --restart\nimport os\nprint('fresh pid', os.getpid())",
        "%tfdist_status --table",
        "%tfdist_stop",
    ], tmp_path)
    failing = nb.cells[1]
    assert errors_of(failing) == ["TaskError"]  # the cell raises, so "Run All" stops there
    text = text_of(failing)
    assert "[worker:0] hello" in text and "[worker:1] hello" in text
    assert "[worker:1] error: ValueError: bad shard on 1" in text
    assert "line 5" in text  # the worker's traceback keeps the cell's own line numbers
    error = next(o for o in failing.outputs if o.output_type == "error")
    assert "1 of 2 task(s) failed: worker:1 error (ValueError: bad shard on 1)" in error.evalue
    resized = text_of(nb.cells[2])
    assert "resized: 2 workers -> 1 worker" in resized
    assert "[worker:0] alone as ('worker', 0)" in resized
    # IPython shows a UsageError as one short message, without a traceback
    assert "UsageError: no task worker:3 in a cluster of 1 worker" in text_of(nb.cells[3])
    assert "never" not in text_of(nb.cells[3])
    restarted = text_of(nb.cells[4])
    assert "restarting all tasks of 1 worker" in restarted
    fresh_pid = re.search(r"\[worker:0\] fresh pid (\d+)", restarted).group(1)
    status = text_of(nb.cells[5])
    assert "worker:0" in status and "worker:1" not in status and fresh_pid in status
    assert "stopped 1 task(s)" in text_of(nb.cells[6])


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_cell_is_named_by_the_notebooks_number_in_the_tasks_tracebacks_and_the_ledger(
        tmp_path: Path) -> None:
    """In[5] of the notebook is 'Cell In[5]' in the task's own traceback and 'cell 5' in the
    ledger, though it is only the cluster's second cell (they used to say In[2] and cell 2)."""
    nb = run_notebook([
        "%load_ext tfdist_nb",
        "%%tfcluster 2 workers --no-dashboard --no-warm\nimport tensorflow as tf\n"
        "strategy = tf.distribute.MultiWorkerMirroredStrategy()",
        "x = 1",
        "y = 2",
        "%%tfcluster 2 workers --no-dashboard\n"
        "total = strategy.reduce('SUM', strategy.run(lambda: tf.constant(1.0)), axis=None)\n"
        "raise ValueError('after the reduce')",
        "import tfdist_nb\n"
        "print(sorted(set(tfdist_nb.current().collectives(last=None)['where'])))",
        "%tfdist_stop",
    ], tmp_path)
    failing = nb.cells[4]
    assert failing.execution_count == 5
    text = text_of(failing)
    assert "Cell In[5], line 3" in text, text
    assert "'cell 5 line 2'" in text_of(nb.cells[5])
