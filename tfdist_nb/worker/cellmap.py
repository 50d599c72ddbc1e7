"""Which notebook cell a line of code on this task came from, in the controller's numbering.

A kernel's own count (``Cell In[k]``) equals the controller's only while every cell ran on every
task, so the controller sends its number in each execute request's metadata (``tfdist_cell``)
and this module remembers it per compiled cell file: ``cell N line L`` in the notebook's
numbering, the magic line as line 1 (docs/reference.md, "Collectives and hangs").
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections.abc import Iterable
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from tfdist_nb.worker.kernel_internals import TaskKernel

_by_name: dict[str, int] = {}  # a cell file the compiler cached -> the controller's cell number
_shell: InteractiveShell | None = None
_own = (f"{os.sep}tensorflow{os.sep}", f"{os.sep}keras{os.sep}", f"{os.sep}tf_keras{os.sep}",
        f"{os.sep}tfdist_nb{os.sep}", f"{os.sep}IPython{os.sep}", f"{os.sep}ipykernel{os.sep}",
        f"{os.sep}absl{os.sep}")
_stdlib = sysconfig.get_paths()["stdlib"]


def install(kernel: TaskKernel) -> None:
    """Map each cell file the shell's compiler caches to the controller's cell number. Hooked
    on the compiler's ``cache`` (where a cell gets its file name), so it holds whatever order
    ``run_cell`` counts in (IPython 9 counts before ``pre_run_cell``, 8.x after the cell)."""
    global _shell
    _shell = kernel.shell
    compiler = kernel.shell.compile
    if getattr(compiler.cache, "_tfdist", False):
        return
    cache = compiler.cache

    def cache_and_remember(transformed_code: str, number: int = 0,
                           raw_code: str | None = None) -> str:
        cell = (kernel.get_parent("shell").get("metadata") or {}).get("tfdist_cell")
        # the controller's number names the cell's file, so the task's own tracebacks say
        # Cell In[n] as the notebook does (docs/reference.md, "Collectives and hangs")
        name: str = cache(transformed_code, cell if isinstance(cell, int) else number,
                          raw_code)
        if isinstance(cell, int):
            _by_name[name] = cell
        return name

    cache_and_remember._tfdist = True  # type: ignore[attr-defined]
    compiler.cache = cache_and_remember


def cell_of(filename: str) -> int | None:
    """The controller's cell number for a cell file of this kernel (the kernel's own count for a
    cell that did not come from the controller), or None for other files."""
    if filename in _by_name:
        return _by_name[filename]
    compiled = getattr(getattr(_shell, "compile", None), "_filename_map", None)
    return compiled.get(filename) if compiled else None


def site(frames: Iterable[tuple[str, int]]) -> str:
    """Where, in the user's code, a stack (innermost first, ``(filename, line)`` pairs) was:
    ``cell N line L`` for the innermost notebook cell frame, else the innermost frame outside
    TensorFlow, Keras, tfdist_nb and the standard library (``file.py:L``), else ``?``."""
    fallback = None
    for filename, line in frames:
        cell = cell_of(filename)
        if cell is not None:
            return f"cell {cell} line {line}"
        if fallback is None and not _library(filename):
            fallback = f"{os.path.basename(filename)}:{line}"
    return fallback or "?"


@functools.lru_cache(maxsize=4096)  # per call of a traced step (the ledger's called_at)
def _library(filename: str) -> bool:
    return (any(part in filename for part in _own) or filename.startswith("<")
            or (filename.startswith(_stdlib) and "-packages" not in filename))


def python_frames(frame: FrameType | None) -> Iterable[tuple[str, int]]:
    """``(filename, line)`` from ``frame`` outwards."""
    while frame is not None:
        yield frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back


def main_thread_site() -> str:
    """Where the main thread (the one running the cell) is: collectives launched eagerly may
    run on a strategy's worker thread, whose own stack has no user frame."""
    import threading

    main = threading.main_thread()
    frame = (sys._getframe(1) if threading.current_thread() is main
             else sys._current_frames().get(main.ident or 0))
    return site(python_frames(frame))
