"""Processes the tests start and wait for: which worker processes this session started, a free
loopback port, and polling with a deadline instead of sleeping."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

SESSION_ROOT: list[str] = []  # this session's pytest base temp: every test's run dirs are below


#: Command-line words of every worker process tfdist_nb starts: a local (or remote) kernel, the
#: SSH launcher's remote lifeline, and an attached worker (``python -m tfdist_nb.worker``).
WORKER_MARKERS = ("tfdist_nb.worker.kernel", "tfdist_nb.worker.remote", "tfdist_nb.worker")


def _netns_id(pid: int) -> tuple[int, int] | None:
    with contextlib.suppress(OSError):
        st = os.stat(f"/proc/{pid}/ns/net")
        return st.st_dev, st.st_ino
    return None


def worker_kernels() -> set[int]:
    """PIDs of the tfdist_nb worker processes this test session started, so another test run on
    the machine does not count: local kernels and attached workers name a path under the
    session's base temp dir; SSH tasks (lifeline and kernel) run in a network namespace of one
    of this session's fake hosts (tests/remote_hosts.py)."""
    from tests.remote_hosts import namespace_ids

    root = SESSION_ROOT[0] if SESSION_ROOT else ""
    hosts = namespace_ids()
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        # a forked kernel's title is its command in one string (tfdist_nb.launchers.zygote)
        words = " ".join(cmd).split()
        if not any(marker in words for marker in WORKER_MARKERS):
            continue
        if any(root in part for part in cmd) or (
                hosts and _netns_id(proc.info["pid"]) in hosts):
            found.add(proc.info["pid"])
    return found


def free_port() -> int:
    """A loopback TCP port that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it is truthy; fail the test with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def path_without(tool: str, bindir: os.PathLike[str] | str) -> str:
    """A ``PATH`` with ``tool`` hidden, as on a machine that lacks it: ``bindir`` (made here)
    holds a link to every other program of the directories where ``tool`` is."""
    bindir = os.fspath(bindir)
    os.makedirs(bindir, exist_ok=True)
    parts = []
    for part in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.exists(os.path.join(part, tool)):
            parts.append(part)
            continue
        for name in os.listdir(part):
            if name != tool and not os.path.lexists(os.path.join(bindir, name)):
                os.symlink(os.path.join(part, name), os.path.join(bindir, name))
        if bindir not in parts:
            parts.append(bindir)
    return os.pathsep.join(parts)
