"""``tfdist-nb`` / ``python -m tfdist_nb``: run the quickstart headless, or open JupyterLab on it.

``quickstart`` executes ``examples/01_quickstart.ipynb`` with nbclient (a real kernel starting a
real cluster) and prints its output as text; it exits non-zero if any cell failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tfdist_nb.results import ANSI

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def examples_dir() -> Path:
    for candidate in (Path.cwd() / "examples", Path(__file__).resolve().parents[1] / "examples"):
        if (candidate / "01_quickstart.ipynb").is_file():
            return candidate
    raise SystemExit("tfdist-nb: examples/01_quickstart.ipynb not found; run from the repository")


def _cell_text(cell: Mapping[str, Any], colour: bool) -> str:
    lines: list[str] = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            lines.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data", {})
            if WIDGET_MIME in data:  # the live dashboard; a terminal has the text output
                continue
            lines.append(str(data.get("text/plain", "")) + "\n")
        elif kind == "error":
            lines.append("\n".join(out.get("traceback", [])) + "\n")
    text = "".join(lines)
    return text if colour else ANSI.sub("", text)


def quickstart(notebook: Path, timeout: float, colour: bool, save: Path | None) -> int:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from traitlets.config import Config

    nb = nbformat.read(notebook, as_version=4)
    # The notebook's own kernel on ipc sockets in a private (0700) temp dir, as the tasks' are:
    # nothing listens on TCP, and ipykernel has no plain-TCP warning to print first
    sockets = tempfile.mkdtemp(prefix="tfdist-quickstart-")
    ipc = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "kernel")}})
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", config=ipc,
                            resources={"metadata": {"path": str(notebook.parent)}})
    started = time.monotonic()
    failed = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = exc
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        first = cell.source.splitlines()[0] if cell.source else ""
        print(f"\n>>> {first}")
        sys.stdout.write(_cell_text(cell, colour))
    if save is not None:
        nbformat.write(nb, save)
    took = time.monotonic() - started
    if failed is not None:
        print(f"\ntfdist-nb: the quickstart failed after {took:.0f}s", file=sys.stderr)
        return 1
    code = sum(cell.cell_type == "code" for cell in nb.cells)
    print(f"\ntfdist-nb: quickstart ran {code} code cells in {took:.0f}s")
    print(next_steps(notebook.parent))
    return 0


def next_steps(examples: Path) -> str:
    """What to try after the quickstart, with commands that run as they are printed."""
    python = sys.executable
    if os.path.commonpath([os.path.abspath(python), os.getcwd()]) == os.getcwd():
        python = os.path.relpath(python)  # .venv/bin/python, as the README's commands say
    names = sorted(p.stem for p in examples.glob("[0-9][0-9]_*.ipynb"))[1:]
    listed = ", ".join(n.split("_", 1)[0] + " " + n.split("_", 1)[1].replace("_", " ")
                       for n in names)
    return ("\nWhat next:\n"
            f"  {python} -m tfdist_nb lab    JupyterLab on examples/: {listed or 'the notebooks'}\n"
            f"  {python} -m tfdist_nb lab --no-browser --ip 127.0.0.1    on a remote machine; "
            "then ssh -L 8888:127.0.0.1:8888 THAT_MACHINE here and open the URL it prints\n"
            "  in a notebook of your own: %load_ext tfdist_nb, then a cell that begins with "
            "%%tfcluster 2 workers")


def lab(directory: Path, extra: list[str]) -> int:
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={directory}", *extra]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tfdist-nb", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quickstart", help="run the quickstart notebook headless and summarise")
    q.add_argument("--lab", action="store_true",
                   help="open JupyterLab on examples/ instead (jupyter lab's own options, "
                        "e.g. --no-browser, may follow)")
    q.add_argument("--notebook", type=Path, help="another notebook to run")
    q.add_argument("--timeout", type=float, default=600, help="per-cell timeout (seconds)")
    q.add_argument("--save", type=Path, help="write the executed notebook here")
    q.add_argument("--no-colour", action="store_true", help="strip ANSI colours")
    lb = sub.add_parser("lab", help="open JupyterLab on examples/")
    lb.add_argument("extra", nargs=argparse.REMAINDER, help="arguments for jupyter lab")
    args, rest = parser.parse_known_args(argv)
    if args.command == "quickstart" and rest and not args.lab:
        parser.error(f"unrecognized arguments: {' '.join(rest)} (jupyter lab's own options go "
                     "after --lab)")
    if args.command == "lab" or (args.command == "quickstart" and args.lab):
        return lab(examples_dir(), [*(getattr(args, "extra", None) or []), *rest])
    notebook = args.notebook or examples_dir() / "01_quickstart.ipynb"
    colour = not args.no_colour and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    return quickstart(notebook, args.timeout, colour, args.save)


if __name__ == "__main__":
    raise SystemExit(main())
