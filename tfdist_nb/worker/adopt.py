"""A spare worker kernel (``TFDIST_SPARE=1``, no task identity): warmed before it has a task,
then adopted as one before any user code runs (docs/design.md).

Warming imports ``preload`` at low priority and makes no TensorFlow context, so a strategy can
still come first; TensorFlow reads TF_CONFIG only when a strategy is made, so adoption can set it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any

from tfdist_nb import host_os
from tfdist_nb.worker import agent, state
from tfdist_nb.worker.replies import Adopted, HowAdopted, Warmed

#: Nice value of the thread that imports ``preload`` in a spare (Linux: nice is per thread).
WARM_NICE = 10

_warmed: dict[str, Any] = {}


def warm(preload: list[str], nice: int = WARM_NICE) -> Warmed:
    """Import ``preload`` on a thread of its own at nice ``nice``, and wait for it. Only that
    thread is niced (per thread on Linux; nothing where nice is per process, as on macOS): an
    unprivileged process cannot raise its priority again, and the task's later threads must
    keep a cold task's priority."""
    if not state.is_spare():
        raise RuntimeError("only a spare kernel is warmed")
    failed: list[BaseException] = []
    imported: dict[str, Any] = {}

    def run() -> None:
        if host_os.threads() is not None:  # else the pid named could be another process
            with contextlib.suppress(OSError, AttributeError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        try:
            imported.update(agent.import_all(preload))
        except BaseException as exc:  # re-raised on the kernel's thread, named in the reply
            failed.append(exc)

    began = time.monotonic()
    thread = threading.Thread(target=run, name="tfdist-warm", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    from tfdist_nb.worker import forked

    forked.replay()  # a forked spare's import ran in the fork server: said where it imports
    _warmed.update(preload=list(preload), seconds=round(time.monotonic() - began, 3))
    return {"pid": os.getpid(), "executable": sys.executable, "imported": imported,
            "warm_s": _warmed["seconds"]}


def adopt(task: str, set_env: dict[str, str], unset_env: list[str], log_path: str | None,
          preload: list[str]) -> Adopted:
    """Become ``task`` (``worker:1``): its environment, identity, log tag, process log and
    telemetry; answers what :func:`tfdist_nb.worker.agent.describe` answers at a cold start,
    plus ``adopted`` (how the spare was warmed, and threads whose priority stayed low)."""
    if not state.is_spare():
        raise RuntimeError("this kernel is not a spare (or was adopted already)")
    role, sep, index = task.partition(":")
    if not sep or not index.isdigit():
        raise ValueError(f"task must be role:index, got {task!r}")
    for key in unset_env:
        os.environ.pop(key, None)
    os.environ.update(set_env)
    os.environ["TFDIST_TASK"] = task
    state.set_task((role, int(index)))
    state.adopted = True
    agent._tag_log_records()  # records made from now on carry the task's name
    if log_path:
        _redirect_process_log(log_path)
    low = _restore_priority()
    if state.telemetry is not None:
        state.telemetry.start()
    info = agent.describe(preload)  # preload is imported: this only reads and checks the port
    return Adopted(**info, adopted=HowAdopted(warm_s=_warmed.get("seconds"),
                                              low_priority_threads=low))


def _redirect_process_log(path: str) -> None:
    """Send fds 1 and 2 on to the task's ``tasks/<task>/kernel.log``: with ipykernel's fd
    capture, the copy of the original descriptor its reader forwards to; without, the fds."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0),
                 0o600)
    try:
        for stream, std_fd in ((sys.stdout, 1), (sys.stderr, 2)):
            copy = getattr(stream, "_original_stdstream_copy", None)
            with contextlib.suppress(OSError):
                os.dup2(fd, copy if isinstance(copy, int) else std_fd)
    finally:
        os.close(fd)


def _restore_priority() -> int:
    """Give threads that inherited the warm-up thread's nice value the main thread's priority
    back where the system allows it (root, or an RLIMIT_NICE that permits it); returns how many
    stayed low (idle helper threads TensorFlow made while it was imported). Where a thread id
    is no priority target (macOS) :func:`warm` niced nothing: nothing to undo."""
    tids = host_os.threads()
    if tids is None:
        return 0
    base = os.getpriority(os.PRIO_PROCESS, threading.main_thread().native_id or 0)
    low = 0
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) > base:
                os.setpriority(os.PRIO_PROCESS, tid, base)
        except PermissionError:
            low += 1
        except OSError:  # ended meanwhile
            continue
    return low
