"""What a refusing disk does to the run directory's files (pure: a file descriptor whose writes
fail is the edge here; the real full disk is in tests/test_disk_full.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tfdist_nb.events import OutputLine
from tfdist_nb.store import appender
from tfdist_nb.store.appender import HeldAppender
from tfdist_nb.store.rundir import RunDirectory

REAL_WRITE = os.write


class Disk:
    """Stands in for os.write: takes ``room`` more bytes, then refuses with ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __call__(self, fd: int, data: memoryview) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(data), self.room)
        self.room -= n
        return REAL_WRITE(fd, data[:n])


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    d = Disk(room=10**9)
    monkeypatch.setattr(appender.os, "write", d)
    monkeypatch.setattr(appender, "RETRY_EVERY_S", 0.0)
    return d


def test_a_refused_write_is_held_whole_and_written_in_order_once_the_disk_takes_it(
        tmp_path: Path, disk: Disk) -> None:
    path = tmp_path / "f"
    out = HeldAppender(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), limit=1 << 20)
    assert out.append(b"one\n") is None
    disk.room = 5  # "two\n" fits, "three" is cut after its first byte
    change = out.append(b"two\nthree\nfour\n")
    assert change is not None and change.kind == "failed"
    assert change.error == "No space left on device"
    assert path.read_bytes() == b"one\ntwo\nt" and out.held == b"hree\nfour\n"
    assert out.append(b"five\n") is None  # still refused: said once
    disk.room = 10**9
    change = out.append(b"six\n")
    assert change is not None and change.kind == "recovered" and change.lines == 3
    assert path.read_bytes() == b"one\ntwo\nthree\nfour\nfive\nsix\n"
    assert out.error is None and not out.held


def test_past_its_bound_the_oldest_held_lines_are_dropped_and_counted(
        tmp_path: Path, disk: Disk) -> None:
    out = HeldAppender(os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND),
                       limit=12)
    disk.room = 0
    assert out.append(b"aaaa\n").kind == "failed"
    assert out.append(b"bbbb\n") is None
    change = out.append(b"cccc\n")  # 15 bytes held: the oldest line goes
    assert change is not None and change.kind == "dropping" and change.lines == 1
    assert out.held == b"bbbb\ncccc\n" and out.dropped == 1
    assert out.append(b"dddd\n") is None and out.dropped == 2  # said once


def test_the_run_directory_answers_with_what_it_holds(tmp_path: Path, disk: Disk) -> None:
    rd = RunDirectory(tmp_path, "c1")
    line = OutputLine(1.0, "worker:0", "stdout", "x" * 30, 2)
    assert rd.write_events([line]) is None
    disk.room = 40  # the second line is cut short
    said = rd.write_events([OutputLine(2.0, "worker:0", "stdout", "second", 2)])
    assert said is not None and said[1] == "WARNING"
    assert said[0].startswith(f"cannot write the run directory {rd.path} (No space left on "
                              "device): output is kept in memory")
    assert rd.trouble() == "No space left on device" and rd.held_lines() == 1
    # %tfdist_logs reads the file and the held rest as one
    assert [e["text"] for e in rd.iter_events()] == ["x" * 30, "second"]
    disk.room = 10**9
    said = rd.write_events([OutputLine(3.0, "worker:1", "stderr", "third", 2)])
    assert said == (f"the run directory {rd.path} is written again: 1 line(s) held in memory "
                    "meanwhile are now on disk", "INFO")
    assert [e["text"] for e in rd.iter_events()] == ["x" * 30, "second", "third"]
    assert rd.close() is None


def test_a_stop_while_the_disk_still_refuses_says_what_is_lost(tmp_path: Path,
                                                              disk: Disk) -> None:
    rd = RunDirectory(tmp_path, "c1")
    disk.room = 0
    rd.write_events([OutputLine(1.0, "worker:0", "stdout", "a", 1),
                     OutputLine(1.0, "worker:0", "stdout", "b", 1)])
    assert rd.close() == (f"2 of 2 line(s) held in memory could not be written to {rd.path} "
                          "when the cluster stopped (the disk still refuses them)")


def test_a_relative_run_directory_is_said_and_kept_as_an_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quickstart's kernel runs in examples/: a relative base was printed relative to a
    directory the user's terminal was not in, and moved when the kernel changed directory."""
    from tfdist_nb.store.rundir import RunDirectory

    monkeypatch.chdir(tmp_path)
    rundir = RunDirectory("runs", "c1")
    assert rundir.path == tmp_path / "runs" / "c1" and rundir.path.is_absolute()
    monkeypatch.chdir("/")
    rundir.write_cell(1, "x = 1", ["worker:0"])
    assert (tmp_path / "runs" / "c1" / "cells.jsonl").stat().st_size > 0
