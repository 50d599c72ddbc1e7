"""A directory the user names for the tasks to write into (``--logdir``, ``--dump``): made, or
refused in one line, before any task is asked to write there (docs/reference.md, Magics)."""

from __future__ import annotations

import os
from pathlib import Path

from tfdist_nb.errors import SpecError


def directory_to_write(path: Path, option: str) -> None:
    """Make ``path`` (owner-only), or a SpecError naming ``option`` and why it cannot be
    written (a file in the way, a read-only mount, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SpecError(f"{option} {path}: cannot make this directory "
                        f"({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SpecError(f"{option} {path}: not writable by this user")
