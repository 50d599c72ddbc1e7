"""The teaching notebooks run as a workshop would run them, and show what they promise."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from tests.notebooks import cell_text

pytestmark = pytest.mark.cluster
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def execute(name: str, tmp_path: Path) -> list[Any]:
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    NotebookClient(nb, timeout=240, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return [c for c in nb.cells if c.cell_type == "code"]


def text(cell: Any) -> str:
    return cell_text(cell, errors=True)


@pytest.mark.timeout(400)
def test_hang_and_crash_notebook(tmp_path: Path) -> None:
    cells = execute("06_deadlock_stall.ipynb", tmp_path)
    hang = text(cells[2])
    assert "TaskError" in hang and "worker:1 stalled" in hang
    assert "elsewhere, likely the cause: worker:1" in hang
    crash = text(cells[5])
    assert "TaskError" in crash and "worker:1 crashed" in crash and "killed by SIGKILL" in crash
    assert "Last resource sample" in crash
    assert re.search(r"worker:1\s+\S+\s+\d+\s+dead", text(cells[6]))
    again = text(cells[8])
    assert "[worker:0] done 20 steps" in again and "[worker:1] done 20 steps" in again


@pytest.mark.timeout(300)
def test_straggler_notebook(tmp_path: Path) -> None:
    cells = execute("07_straggler.ipynb", tmp_path)
    assert "[worker:1] tfdist_nb: worker:1 is a straggler" in text(cells[2])
    assert "straggler" in text(cells[3])  # the flags column of %tfdist_status --table


@pytest.mark.timeout(300)
def test_input_pipeline_notebook(tmp_path: Path) -> None:
    cells = execute("05_input_pipeline.ipynb", tmp_path)
    slow = text(cells[1])
    assert "[worker:0] done 20 steps" in slow and "[worker:1] done 20 steps" in slow
    assert "worker:1 is a straggler" in slow and "cause: its input pipeline" in slow
    assert "straggler" in text(cells[2])  # the flags column
    unsharded = text(cells[4])
    assert "worker:1" in unsharded and "input not sharded" in unsharded
    assert "epoch done" in unsharded
