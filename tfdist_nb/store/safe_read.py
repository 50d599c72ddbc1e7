"""Reading a run directory's files without trusting what is in their place.

The JupyterLab server extension reads run directories on the Jupyter server's own event loop;
a FIFO named ``state.json`` would block ``open()`` forever, and a symlink would serve whatever it
points at (docs/security.md). Here a file is opened non-blocking and without following a link,
and read only when it is a regular file: anything else reads as missing.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def read_regular(path: Path, offset: int = 0, limit: int | None = None) -> bytes | None:
    """Up to ``limit`` bytes of ``path`` from ``offset``; None when it is missing, not a
    regular file (a FIFO, a device, a directory) or a symbolic link."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
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
