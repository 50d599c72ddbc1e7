"""Reading executed notebooks as a person would: the text each cell shows; and running one the way
"Run All" does (tests/test_examples.py).

``python -m tests.notebooks examples/03_environment_mismatch.ipynb`` runs one notebook as the
tests do and prints each code cell's wall time and text: how the notebooks are timed.
"""

from __future__ import annotations

import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: The standard cell tag (nbclient, Jupyter Book, nbval): the cell is expected to raise, and
#: "Run All" goes on past it.
RAISES = "raises-exception"


def cell_text(cell: Any, errors: bool = False) -> str:
    """Streams and the text form of results, colours stripped; ``errors``: also ename: evalue.
    A result is a block of its own, as the notebook shows it: the line after it starts anew
    (a widget's one-line repr must not run into the task line printed next)."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(_block(out.data.get("text/plain", "")))
        elif errors and out.output_type == "error":
            parts.append(_block(f"{out.ename}: {out.evalue}"))
    return ANSI.sub("", "".join(parts))


def _block(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def cell_html(cell: Any) -> str:
    """The HTML form of the cell's results (a CheckReport, a DataFrame), tags left in."""
    return "".join(out.data.get("text/html", "") for out in cell.outputs
                   if out.output_type in ("execute_result", "display_data"))


def errors_of(cell: Any) -> list[str]:
    return [out.ename for out in cell.outputs if out.output_type == "error"]


def expects_error(cell: Any) -> bool:
    return RAISES in cell.metadata.get("tags", [])


def cell_seconds(cell: Any) -> float:
    """Wall time of one executed code cell, from the timestamps nbclient records."""
    timing = cell.metadata.get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not start or not end:
        return 0.0
    parse = (lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


class Executed:
    """A notebook run top to bottom: its code cells (by position, or by a ``# label`` comment
    one can find with :meth:`find`), its wall time."""

    def __init__(self, nb: Any, seconds: float) -> None:
        self.nb = nb
        self.seconds = seconds
        self.cells = [c for c in nb.cells if c.cell_type == "code"]

    def find(self, needle: str) -> Any:
        """The first code cell whose source contains ``needle``."""
        for cell in self.cells:
            if needle in cell.source:
                return cell
        raise AssertionError(f"no code cell contains {needle!r}")

    def text(self, needle: str) -> str:
        return cell_text(self.find(needle), errors=True)

    def timings(self) -> list[tuple[float, str]]:
        return [(cell_seconds(c), (c.source.splitlines() or [""])[0]) for c in self.cells]


def execute_notebook(path: Path, cwd: Path, timeout: float = 240) -> Executed:
    """Run ``path`` as "Run All" and nbclient do, WITHOUT ``allow_errors``: a cell that raises
    fails the run unless it carries the ``raises-exception`` tag, and a tagged cell that does
    not raise fails it too (the notebook would no longer show what it promises)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    started = time.monotonic()
    client.execute()
    run = Executed(nb, time.monotonic() - started)
    for cell in run.cells:
        if expects_error(cell) and not errors_of(cell):
            raise AssertionError(f"a cell tagged {RAISES} did not raise:\n{cell.source}")
    return run


def main(argv: list[str]) -> int:
    import tempfile

    for name in argv:
        with tempfile.TemporaryDirectory() as tmp:
            run = execute_notebook(Path(name).resolve(), Path(tmp))
        for seconds, first in run.timings():
            print(f"{seconds:6.1f}s  {first}")
        for i, cell in enumerate(run.cells):
            print(f"----- [{i}] {(cell.source.splitlines() or [''])[0]}")
            print(cell_text(cell, errors=True))
        print(f"{name}: {run.seconds:.1f}s")
    return 0


def run_notebook(cells: list[str], tmp_path: Path) -> Any:
    """Execute ``cells`` as a new notebook in ``tmp_path`` (errors kept in the outputs)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    client = NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return nb


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

