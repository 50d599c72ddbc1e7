"""The run directory (docs/reference.md): everything a cluster saw, as JSON Lines, owner-only.

``./tfdist_runs/<cluster-id>/``::

    events.jsonl          every output line, rich output and controller note, in arrival order
    telemetry.jsonl       every heartbeat: resources, GPUs, step records
    cells.jsonl           every cell sent: sequence number, targets, code
    tasks/<task>/         tf_config.json, env.json, kernel.log (what the process wrote before
                          ipykernel captured fd 1/2), kernel connection file while it runs

Each batch is flushed as it is written, so a crash of the controller loses nothing already received.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tfdist_nb.events import Event, OutputLine

DEFAULT_ROOT = "tfdist_runs"
_ENCODER = json.JSONEncoder(default=str)  # one encoder: json.dumps(default=...) builds one a call
_STR = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]  # C-accelerated


def _line_json(e: OutputLine) -> str:
    """The JSON of one output line, built directly: this runs for every line of a flood."""
    cell = "null" if e.cell is None else int(e.cell)
    return (f'{{"time": {float(e.time)!r}, "task": {_STR(e.task)}, "stream": {_STR(e.stream)}, '
            f'"text": {_STR(e.text)}, "cell": {cell}, "kind": "output"}}')


def new_cluster_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _owner_only_dir(path: Path) -> Path:
    """A directory inside the run directory (ours by construction): made or kept ``0700``."""
    path.mkdir(exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _make_missing_dirs(path: Path) -> None:
    """Create the missing components of ``path`` ``0700``; existing ones keep their mode.

    A base such as ``.``, ``$HOME`` or ``/tmp`` belongs to the user or the system, not to
    tfdist_nb: chmodding it would lock others out of a shared directory or drop /tmp's sticky
    bit (docs/security.md, "Run directories").
    """
    missing = []
    for part in (path, *path.parents):
        if part.exists():
            break
        missing.append(part)
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another cluster made it a moment ago
            part.mkdir(mode=0o700)
            os.chmod(part, 0o700)  # whatever the umask
    if not path.is_dir():
        raise NotADirectoryError(f"run directory root {path} is not a directory")


def _cluster_dir(path: Path) -> Path:
    """The cluster's own directory: new and ``0700``, or (a restart) one that is ours already.

    An existing entry that is a symlink or belongs to someone else is refused: in a shared base
    such as /tmp another user could have made it first.
    """
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(f"{path} exists and is not a directory of this user; "
                                  "refusing to write a run there") from None
    os.chmod(path, 0o700)
    return path


def open_private(path: Path, mode: str = "a", permissions: int = 0o600) -> Any:
    """Open a file created readable by the owner only (``permissions``), whatever the umask
    (never through a symlink: the run holds code, output and environments, docs/security.md);
    also what the exported reproducer and a saved log are written with."""
    flags = (os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
             | (os.O_APPEND if mode == "a" else os.O_TRUNC))
    fd = os.open(path, flags, permissions)
    os.fchmod(fd, permissions)
    return os.fdopen(fd, mode, encoding="utf-8")


class RunDirectory:
    """Appends events and cells; safe to call from the loop thread and the caller's thread."""

    def __init__(self, root: str | os.PathLike[str] | None, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        base = Path(root or os.environ.get("TFDIST_RUNS_DIR") or DEFAULT_ROOT)
        _make_missing_dirs(base)
        self.path = _cluster_dir(base / cluster_id)
        self._lock = threading.Lock()
        self._events = open_private(self.path / "events.jsonl")
        self._cells = open_private(self.path / "cells.jsonl")
        self._telemetry = open_private(self.path / "telemetry.jsonl")

    def task_dir(self, slug: str) -> Path:
        return _owner_only_dir(_owner_only_dir(self.path / "tasks") / slug)

    def write_json(self, slug: str, name: str, data: Any) -> Path:
        path = self.task_dir(slug) / name
        with open_private(path, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        return path

    def write_events(self, events: list[Event]) -> None:
        """Append a batch and flush it: a crash of the controller loses nothing written."""
        output = [_line_json(e) if isinstance(e, OutputLine) else _ENCODER.encode(e.to_json())
                  for e in events if e.kind != "telemetry"]
        telemetry = [_ENCODER.encode(e.to_json()) for e in events if e.kind == "telemetry"]
        with self._lock:
            for out, lines in ((self._events, output), (self._telemetry, telemetry)):
                if lines and not out.closed:
                    out.write("\n".join(lines) + "\n")
                    out.flush()

    def write_cell(self, seq: int, code: str, targets: list[str]) -> None:
        rec = {"cell": seq, "time": time.time(), "targets": targets, "code": code}
        with self._lock:
            if not self._cells.closed:
                self._cells.write(json.dumps(rec) + "\n")
                self._cells.flush()

    def iter_events(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            if not self._events.closed:
                self._events.flush()
        with open(self.path / "events.jsonl", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)

    def cells(self) -> list[dict[str, Any]]:
        with open(self.path / "cells.jsonl", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def close(self) -> None:
        with self._lock:
            self._events.close()
            self._cells.close()
            self._telemetry.close()
