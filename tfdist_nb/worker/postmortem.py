"""``%tfdist_debug`` inside a task: pdb on the task's last exception (docs/reference.md, Input
from the tasks).

The controller asks for the last exception (``sys.last_traceback``, as ``%debug`` uses), then
runs :func:`debug` as a silent request with stdin, so pdb's prompts reach the notebook like any
``input()``; ``q`` (or end-of-file) leaves the task as it was.
"""

from __future__ import annotations

import pdb
import sys

from tfdist_nb.worker.replies import LastException


def last_exception() -> LastException | None:
    """The exception the task's last failing cell raised (``ename``, ``evalue``, ``where``: the
    innermost frame), or None when no cell raised since the process started."""
    tb = getattr(sys, "last_traceback", None)
    if tb is None:
        return None
    value = getattr(sys, "last_value", None)
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return {"ename": type(value).__name__ if value is not None else "?",
            "evalue": str(value) if value is not None else "",
            "where": f"{code.co_name} ({code.co_filename}:{tb.tb_lineno})"}


def debug() -> None:
    """pdb post-mortem on the last exception, in this task's main thread; returns on ``q``."""
    said = last_exception()
    if said is None:  # the controller asked first; a restart in between lands here
        print("tfdist_nb: no exception to debug in this task (no cell raised since it started)")
        return
    print(f"post-mortem of {said['ename']}: {said['evalue']} "
          f"(p NAME, pp locals(), up, down, l; q quits and leaves the task as it was)",
          flush=True)
    pdb.post_mortem(sys.last_traceback)


def install() -> None:
    """``breakpoint()`` in a task cell opens pdb, as ``pdb.set_trace()`` does, with its prompts
    sent to the notebook: ipykernel imports debugpy, whose breakpoint hook does nothing unless a
    debugger client is attached to the kernel, and none is attached to a task. A hook of
    anyone else's (``PYTHONBREAKPOINT`` is honoured by the default one) is left alone."""
    if "pydevd" in (getattr(sys.breakpointhook, "__module__", None) or ""):
        sys.breakpointhook = sys.__breakpointhook__
