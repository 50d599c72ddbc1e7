"""Files of this user's, opened without trusting what is in their place (docs/security.md): a
FIFO would block ``open()`` forever (the JupyterLab extension reads on the server's own event
loop), and a symlink would serve or receive whatever it points at.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def read_regular(path: Path, offset: int = 0, limit: int | None = None) -> bytes | None:
    """Up to ``limit`` bytes of ``path`` from ``offset``; None when it is missing, not a
    regular file (a FIFO, a device, a directory) or a symbolic link."""
    flags = os.O_RDONLY | NONBLOCK | NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        size = st.st_size - offset if limit is None else min(limit, st.st_size - offset)
        if size <= 0:
            return b""
        return os.pread(fd, size, offset)
    except OSError:
        return None
    finally:
        os.close(fd)


def regular_stat(path: Path) -> os.stat_result | None:
    """``lstat`` of ``path`` when it is a regular file (not a link to one), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def open_owned(path: Path, mode: str = "a", permissions: int = 0o600,
               read: bool = False) -> int:
    """A descriptor writing ``path``, a regular file of this user's in a directory of ours;
    anything else found there (a link, a FIFO, another user's file) is replaced by a new file.
    ``read``: also readable, so what was written is read back from this file itself."""
    flags = ((os.O_RDWR if read else os.O_WRONLY) | os.O_CREAT | NOFOLLOW | NONBLOCK
             | (os.O_APPEND if mode == "a" else os.O_TRUNC))
    if (st := lstat_or_none(path)) is not None and not ours_regular(st):
        os.unlink(path)
    fd = os.open(path, flags, permissions)
    if not ours_regular(os.fstat(fd)):  # made in the moment between: refused, not written
        os.close(fd)
        raise OSError(errno.EEXIST, f"{path} is not a regular file of this user's")
    os.set_blocking(fd, True)
    os.fchmod(fd, permissions)
    return fd


def lstat_or_none(path: Path) -> os.stat_result | None:
    """What is at ``path`` itself (a link is not followed); None: nothing."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def ours_regular(st: os.stat_result) -> bool:
    """A regular file this user owns."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def open_task_log(path: Path) -> int:
    """The descriptor a task's process log (``tasks/<task>/kernel.log``) is appended through,
    by the launchers that write it on this machine."""
    return open_owned(path)


def private_temp_dir(kind: str) -> Path:
    """A new owner-only directory ``$TMPDIR/tfdist-<kind>-<pid>-<random>`` for this process's
    scratch, after removing the ones of this user whose process is gone (a notebook kernel
    killed with SIGKILL cannot remove its own: docs/security.md)."""
    import shutil
    import tempfile

    import psutil

    base = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for old in base.glob(f"tfdist-{kind}-*-*"):
            pid = old.name.split("-")[2]
            st = lstat_or_none(old)
            if (pid.isdigit() and st is not None and stat.S_ISDIR(st.st_mode)
                    and st.st_uid == os.geteuid() and not psutil.pid_exists(int(pid))):
                shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"tfdist-{kind}-{os.getpid()}-"))  # 0700
