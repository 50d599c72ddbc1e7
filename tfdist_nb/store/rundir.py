"""The run directory (docs/reference.md): everything a cluster saw, as JSON Lines, owner-only.

``./tfdist_runs/<cluster-id>/``::

    events.jsonl          every output line, rich output and controller note, in arrival order
    telemetry.jsonl       every heartbeat: resources, GPUs, step records
    cells.jsonl           every cell sent: sequence number, targets, code
    tasks/<task>/         tf_config.json, env.json, kernel.log (what the process wrote before
                          ipykernel captured fd 1/2), kernel connection file while it runs

Each batch is written as it arrives, so a crash of the controller loses nothing already received.
A disk that refuses a write (full, a quota, gone read-only) never keeps a line from the user: the
batch is held in memory (bounded) and written when the disk takes it again (``store/appender``);
what changed is returned once, for the controller to say.
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
from typing import IO, cast

from tfdist_nb.errors import SpecError
from tfdist_nb.events import CellRecord, Event, OutputLine
from tfdist_nb.owned_files import lstat_or_none, open_owned, ours_regular, read_regular
from tfdist_nb.store.appender import DiskChange, HeldAppender

DEFAULT_ROOT = "tfdist_runs"
HOLD_EVENTS_BYTES = 64 << 20  # output held in memory while the disk refuses it
HOLD_OTHER_BYTES = 16 << 20  # telemetry, cells
#: the run's JSON Lines files (``<name>.jsonl``) and what each holds in memory at most
FILES = {"events": HOLD_EVENTS_BYTES, "telemetry": HOLD_OTHER_BYTES, "cells": HOLD_OTHER_BYTES}
_ENCODER = json.JSONEncoder(default=str)  # one encoder: json.dumps(default=...) builds one a call
_STR = json.encoder.encode_basestring_ascii  # C-accelerated
#: a line of a run's JSON Lines file read back: a JSON object, its fields not checked
Record = dict[str, object]


def _line_json(e: OutputLine) -> str:
    """The JSON of one output line, built directly: this runs for every line of a flood."""
    cell = "null" if e.cell is None else int(e.cell)
    origin = "" if e.origin is None else f', "origin": {_STR(e.origin)}'
    return (f'{{"time": {float(e.time)!r}, "task": {_STR(e.task)}, "stream": {_STR(e.stream)}, '
            f'"text": {_STR(e.text)}, "cell": {cell}, "kind": "output"{origin}}}')


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


def open_private(path: Path, mode: str = "a", permissions: int = 0o600) -> IO[str]:
    """Open a file created readable by the owner only (``permissions``), whatever the umask
    (never through a symlink: the run holds code, output and environments, docs/security.md);
    also what the exported reproducer and a saved log are written with."""
    return os.fdopen(open_owned(path, mode, permissions), mode, encoding="utf-8")


def replace_private(path: Path, text: str, permissions: int = 0o600) -> None:
    """Replace ``path`` with ``text`` at ``permissions``: written to a fresh name opened with
    O_EXCL|O_NOFOLLOW (never into a file or through a link someone planted there), then
    renamed into place, so a reader sees the old file or the new one, whole."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                 permissions)
    try:
        os.fchmod(fd, permissions)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def foreign(path: Path) -> str | None:
    """Why ``path`` (a directory to write into) is not this user's: a link, or the directory
    it names, owned by someone else; None when it is ours."""
    try:
        link, target = os.lstat(path), os.stat(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    me = os.geteuid()
    if link.st_uid != me:
        return f"it belongs to uid {link.st_uid}"
    if target.st_uid != me:
        return f"it is a link to a directory of uid {target.st_uid}"
    return None


def _copy_written(source: int, target: int, chunk: int = 1 << 20) -> None:
    """Everything ``source`` holds, appended to ``target`` (an unlinked file's descriptor
    still reads it)."""
    offset = 0
    while data := os.pread(source, chunk, offset):
        os.write(target, data)
        offset += len(data)


def _private_appender(path: Path, limit: int) -> HeldAppender:
    return HeldAppender(open_owned(path, read=True), limit)


def _inode(out: HeldAppender) -> tuple[int, int] | None:
    if out.closed:
        return None
    st = os.fstat(out.fd)
    return st.st_ino, st.st_dev


def describe_change(path: Path, change: DiskChange) -> str:
    """The one sentence a change of the disk's fortunes is said with."""
    if change.kind == "failed":
        return (f"cannot write the run directory {path} ({change.error}): output is kept in "
                f"memory (up to {HOLD_EVENTS_BYTES >> 20} MB) and written there when the disk "
                "takes it again; it still shows live and in %tfdist_logs")
    if change.kind == "dropping":
        return (f"the run directory {path} still cannot be written ({change.error}) and the "
                f"memory kept for it is full: the oldest held lines are dropped ({change.lines} "
                "so far); they were shown live but will not be on disk")
    return (f"the run directory {path} is written again: {change.lines} line(s) held in "
            "memory meanwhile are now on disk")


class RunDirectory:
    """Appends events and cells; safe to call from the loop thread and the caller's thread."""

    def __init__(self, root: str | os.PathLike[str] | None, cluster_id: str) -> None:
        # absolute: said as a path that works from anywhere, and kept if the kernel changes
        # its working directory
        given = Path(root or os.environ.get("TFDIST_RUNS_DIR") or DEFAULT_ROOT).expanduser()
        try:
            base = given.absolute()
        except FileNotFoundError:  # a relative base in a deleted working directory
            raise SpecError(f"the run directory {given} is relative to the working directory, "
                            "which was deleted: change to one that exists (%cd ~) or give an "
                            "absolute run_dir= (or $TFDIST_RUNS_DIR)") from None
        try:
            _make_missing_dirs(base)
            self.path = _cluster_dir(base / cluster_id)
        except OSError as exc:
            if exc.errno is None:  # our own refusal, said already (another user's directory)
                raise
            raise SpecError(f"cannot make the run directory under {base} "
                            f"({exc.strerror or exc}): give one you can write, e.g. "
                            "run_dir='~/tfdist_runs' or $TFDIST_RUNS_DIR") from None
        self._lock = threading.Lock()
        self._troubled = self._dropping_said = False  # said: cannot be written / dropping
        self._recovered = 0  # held lines written out since the trouble began
        self._files = {name: _private_appender(self.path / f"{name}.jsonl", limit)
                       for name, limit in FILES.items()}

    def ensure(self) -> str | None:
        """Make the directory and its files again if they were removed while the cluster ran
        (``rm -rf`` of the run directory): writes would otherwise go to files no one can read
        and every task start would fail. Returns what to tell the user, else None."""
        with self._lock:
            found = {n: lstat_or_none(self.path / f"{n}.jsonl") for n in self._files}
            replaced = [f"{n}.jsonl" for n, st in found.items()
                        if st is not None and not ours_regular(st)]
            if not replaced and all(st is not None and (st.st_ino, st.st_dev) ==
                                    _inode(self._files[n]) for n, st in found.items()):
                return None
        _make_missing_dirs(self.path.parent)
        _cluster_dir(self.path)
        with self._lock:
            for name, old in self._files.items():
                fresh = _private_appender(self.path / f"{name}.jsonl", old.limit)
                if _inode(old) != _inode(fresh):  # what was written lives on in our old fd
                    _copy_written(old.fd, fresh.fd)
                fresh.held = old.held  # what waited for the disk goes to the new file
                fresh.error = old.error
                old.held = bytearray()
                old.close()
                self._files[name] = fresh
        if replaced:
            return (f"{', '.join(replaced)} in the run directory {self.path} was replaced by "
                    "something that is not a file of yours (a link, a FIFO): made a new one "
                    "with everything written before")
        return (f"the run directory {self.path} was removed while the cluster ran: made it "
                "again, with everything written before")

    def task_dir(self, slug: str) -> Path:
        return _owner_only_dir(_owner_only_dir(self.path / "tasks") / slug)

    def write_json(self, slug: str, name: str, data: object) -> Path:
        path = self.task_dir(slug) / name
        with open_private(path, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        return path

    def write_events(self, events: list[Event]) -> tuple[str, str] | None:
        """Append a batch: on disk at once (a crash of the controller loses nothing written),
        or held in memory while the disk refuses it. Returns what to tell the user, once per
        change (the disk refused, held lines are being dropped, it takes them again)."""
        output = [_line_json(e) if isinstance(e, OutputLine) else _ENCODER.encode(e.to_json())
                  for e in events if e.kind != "telemetry"]
        telemetry = [_ENCODER.encode(e.to_json()) for e in events if e.kind == "telemetry"]
        with self._lock:
            changes = [self._files[name].append(("\n".join(lines) + "\n").encode())
                       for name, lines in (("events", output), ("telemetry", telemetry)) if lines]
            self._retry_others(changes)
        return self._said(changes)

    def write_cell(self, seq: int, code: str, targets: list[str]) -> tuple[str, str] | None:
        rec: CellRecord = {"cell": seq, "time": time.time(), "targets": targets, "code": code}
        with self._lock:
            changes = [self._files["cells"].append((json.dumps(rec) + "\n").encode())]
            self._retry_others(changes)
        return self._said(changes)

    def _retry_others(self, changes: list[DiskChange | None]) -> None:
        """One file written again: the others share its disk, so theirs go out now too."""
        if any(c is not None and c.kind == "recovered" for c in changes):
            changes.extend(f.retry() for f in self._files.values())

    def _said(self, changes: list[DiskChange | None]) -> tuple[str, str] | None:
        """What to say of the directory as a whole (its three files share one disk): that it
        cannot be written, the first time any file is refused; that held lines are dropped,
        once; that it is written again, when no file holds anything any more."""
        said = [c for c in changes if c is not None]
        if not said:
            return None
        with self._lock:
            self._recovered += sum(c.lines for c in said if c.kind == "recovered")
            files = self._files.values()
            refused = next((f.error for f in files if f.error), None)
            if refused is not None and not self._troubled:
                self._troubled, self._recovered = True, 0
                change = DiskChange("failed", refused)
            elif refused is not None and not self._dropping_said and any(
                    c.kind == "dropping" for c in said):
                self._dropping_said = True
                change = DiskChange("dropping", refused, sum(f.dropped for f in files))
            elif refused is None and self._troubled:
                self._troubled = self._dropping_said = False
                change = DiskChange("recovered", lines=self._recovered)
            else:
                return None
        return (describe_change(self.path, change),
                "INFO" if change.kind == "recovered" else "WARNING")

    def held_lines(self) -> int:
        """Output lines waiting in memory for the disk (0 when everything is on disk)."""
        with self._lock:
            return self._files["events"].held_lines()

    def trouble(self) -> str | None:
        """The disk's refusal while output is held in memory, else None."""
        with self._lock:
            return next((f.error for f in self._files.values() if f.error), None)

    def iter_events(self) -> Iterator[Record]:
        """Every event kept: the file, then what waits in memory for the disk."""
        return self._records(self._files["events"], "events.jsonl")

    def cells(self) -> list[CellRecord]:
        """The cells the cluster ran, in order (``write_cell``'s records)."""
        return [cast(CellRecord, rec) for rec in self._records(self._files["cells"], "cells.jsonl")]

    def _records(self, out: HeldAppender, name: str) -> Iterator[Record]:
        with self._lock:  # the file as far as written, and the rest, at one moment
            held = bytes(out.held)
            size = os.fstat(out.fd).st_size if not out.closed else None
        partial = b""
        if size is not None:  # our own file, whatever is at its name now
            data = os.pread(out.fd, size, 0)
        else:
            data = read_regular(self.path / name) or b""
        lines = data.splitlines(keepends=True)
        if lines and not lines[-1].endswith(b"\n"):  # cut short by the disk: the rest is held
            partial = lines.pop()
        for line in [*lines, *(partial + held).splitlines()]:
            if line.strip():
                yield json.loads(line)

    def close(self) -> str | None:
        """Close the files; what could still not be written is said (it is lost)."""
        with self._lock:
            left = sum(self._files[n].held_lines() for n in ("events", "telemetry"))
            for out in self._files.values():
                out.close()
            left_after = sum(self._files[n].held_lines() for n in ("events", "telemetry"))
        if not left_after:
            return None
        return (f"{left_after} of {left} line(s) held in memory could not be written to "
                f"{self.path} when the cluster stopped (the disk still refuses them)")
