"""Everything this task writes, in the order it wrote it, each write stamped when it was made
(docs/reference.md, "Output order and time": ipykernel buffers stdout and stderr apart, and
native writes to fds 1 and 2 come back through a pipe read later).

Every write gets a sequence number and a time under one lock: a Python write first drains the
pipes (non-blocking), so native bytes are numbered before the write that followed them; a
reader thread numbers native bytes while Python is quiet and still echoes them to the process
log; ``flush()`` drains first, so a cell's reply follows every native line before it (the
cell-end barrier), and returns at once when every write is already out on IOPub (saving four
IO-thread round trips per cell). What a forked child writes carries its pid and is passed on
as it comes. Cost: a lock and two non-blocking reads per write (bench/, part d).
"""
from __future__ import annotations

import codecs
import contextlib
import functools
import os
import select
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from io import StringIO
from typing import TYPE_CHECKING, TypedDict, cast

from tfdist_nb.worker import kernel_internals

if TYPE_CHECKING:
    from ipykernel.iostream import OutStream

    #: a parent header's items: the key of ipykernel's buffers, one per parent
    _Parent = frozenset[tuple[str, object]]

    class _Stream(OutStream):
        """ipykernel's stdout or stderr with what :meth:`OrderedOutput._wrap` sets on it."""
        _tfdist_marks: defaultdict[_Parent, list[list[float]]]
        _tfdist_written: int  # writes made
        _tfdist_sent: int  # of them, sent on IOPub

    class _Buffer(StringIO):
        """One of a stream's buffers, with its writes' marks once rotated out."""
        tfdist_marks: list[list[float]] | None

    class _Message(TypedDict):
        """What ipykernel passes an IOPub hook (the keys read here)."""
        msg_type: str
        content: dict[str, object]

MARKS = "tfdist_marks"
READ_BYTES = 65536


class OrderedOutput:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.seq = 0
        self.pid = os.getpid()
        #: read fd -> (stream, utf-8 decoder)
        self._pipes: dict[int, tuple[_Stream, codecs.IncrementalDecoder]] = {}
        self._outgoing: dict[str, list[list[float]] | None] = {}
        #: id(stream) -> its own write, before ours
        self._raw: dict[int, Callable[[str], int | None]] = {}

    # ------------------------------------------------------------------ set-up
    def install(self, streams: Iterable[object]) -> None:
        for given in streams:
            if kernel_internals.lacking(
                    given, f"output order ({getattr(given, 'name', 'stream')})",
                    "its writes go out as ipykernel batches them, stamped when sent",
                    kernel_internals.OUT_STREAM):
                continue
            stream = cast("_Stream", given)  # it has OutStream's internals (lacking)
            self._wrap(stream)
            self._take_over_fd(stream)
        if self._pipes:
            threading.Thread(target=self._read_forever, daemon=True,
                             name="tfdist-ordered-output").start()

    def _wrap(self, stream: _Stream) -> None:
        write, flush, name = stream.write, stream.flush, stream.name
        self._raw[id(stream)] = write
        stream._tfdist_marks = defaultdict(list)
        stream._tfdist_written = stream._tfdist_sent = 0  # writes made; of them, sent on IOPub

        def ordered_write(text: str) -> int | None:
            if not isinstance(text, str) or os.getpid() != self.pid:
                return write(text)  # ipykernel's own TypeError; a forked child as it comes
            with self.lock:
                self._drain()
                return self._write(stream, write, text)

        def ordered_flush() -> None:
            if os.getpid() == self.pid:
                with self.lock:
                    self._drain()
                    if self._all_sent(stream):
                        return  # nothing to wait for on the IO thread
            flush()

        def rotate() -> tuple[dict[_Parent, _Buffer], int]:
            """ipykernel's buffer swap, with this stream's marks swapped under the same lock."""
            with stream._buffer_lock:
                buffers, stream._buffers = stream._buffers, defaultdict(StringIO)
                marks, stream._tfdist_marks = stream._tfdist_marks, defaultdict(list)
                taken = stream._tfdist_written
            self._outgoing[name] = None
            for frozen, buffer in buffers.items():
                buffer.tfdist_marks = marks.get(frozen)  # read by the hook, message by message
            return buffers, taken

        def flush_buffers() -> Iterator[tuple[dict[str, object], str]]:
            buffers, taken = rotate()
            for frozen, buffer in buffers.items():
                data = buffer.getvalue()
                self._outgoing[name] = buffer.tfdist_marks
                buffer.close()
                yield dict(frozen), data
            # ipykernel's _flush resumes this after sending the last message: all is out
            with stream._buffer_lock:
                stream._tfdist_sent = taken

        def hook(msg: _Message) -> _Message:
            marks = self._outgoing.get(name)
            if marks and msg.get("msg_type") == "stream":
                msg["content"][MARKS] = {"pid": self.pid, "marks": marks}
            return msg

        # ignores: putting ours in place of the stream's own methods is this module's point
        stream.write = ordered_write  # type: ignore[method-assign, assignment]
        stream.flush = ordered_flush  # type: ignore[method-assign]
        stream._flush_buffers = flush_buffers  # type: ignore[method-assign]
        # hooks are per thread: register it on the thread that sends (ipykernel's IO thread)
        stream.pub_thread.schedule(lambda: stream.register_hook(hook))

    def _take_over_fd(self, stream: _Stream) -> None:
        """Point fd 1 or 2 at a pipe of ours (ipykernel's reader stays parked on its own)."""
        std_fd = getattr(stream, "_original_stdstream_fd", None)
        if not isinstance(std_fd, int) or getattr(stream, "_original_stdstream_copy", None) is None:
            return  # ipykernel does not capture this descriptor
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.dup2(write, std_fd)
        os.close(write)
        self._pipes[read] = (stream, codecs.getincrementaldecoder("utf-8")(errors="replace"))

    # ------------------------------------------------------------------ writing
    def _write(self, stream: _Stream, write: Callable[[str], int | None], text: str,
               ) -> int | None:
        with stream._buffer_lock:
            self.seq += 1
            key = frozenset(stream.parent_header.items())
            stream._tfdist_marks[key].append([self.seq, round(time.time(), 6), len(text)])
            stream._tfdist_written += 1
            return write(text)

    @staticmethod
    def _all_sent(stream: _Stream) -> bool:
        """Every write so far is out on IOPub, so a flush need not wait for ipykernel's IO
        thread (it would, written or not: four round trips per cell, docs/performance.md)."""
        if getattr(stream, "echo", None) is not None:
            return False  # the echo's own flush is ipykernel's to make
        with stream._buffer_lock:
            return bool(stream._tfdist_sent == stream._tfdist_written)

    def _drain(self) -> None:
        """Number what native code has written so far (call with ``self.lock`` held)."""
        for fd, (stream, decoder) in self._pipes.items():
            while True:
                try:
                    data = os.read(fd, READ_BYTES)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    return
                if not data:
                    break
                copy = getattr(stream, "_original_stdstream_copy", None)
                if isinstance(copy, int):  # the kernel's process log keeps every byte
                    with contextlib.suppress(OSError):
                        os.write(copy, data)
                text = decoder.decode(data)
                if text:
                    self._write(stream, self._raw[id(stream)], text)

    def _read_forever(self) -> None:
        poller = select.poll()
        for fd in self._pipes:
            poller.register(fd, select.POLLIN)
        while True:
            try:
                poller.poll()
            except InterruptedError:
                continue
            with self.lock:
                self._drain()


@functools.cache
def install() -> OrderedOutput:
    """Order this kernel's output (once per process; a stream that is not ipykernel's is left
    as it is)."""
    ordered = OrderedOutput()
    ordered.install([sys.stdout, sys.stderr])
    return ordered
