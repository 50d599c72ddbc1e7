"""An append-only file that a full or failing disk cannot take output from (docs/reference.md,
"When the run directory cannot be written"). ``os.write``, not a Python buffer, which could write
a refused chunk twice; what the disk refuses is held in memory, bounded, oldest dropped and counted.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

RETRY_EVERY_S = 1.0


@dataclass(frozen=True)
class DiskChange:
    """What changed in the file's fortunes with the last write, for the user to be told once."""

    kind: str  # "failed" | "dropping" | "recovered"
    error: str = ""  # the disk's answer, e.g. "No space left on device"
    lines: int = 0  # recovered: lines written from memory; dropping: lines dropped so far


class HeldAppender:
    """Appends bytes to ``fd``; what cannot be written now waits in memory (``limit`` bytes)."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = limit
        self.held = bytearray()  # written to the file before anything newer
        self.dropped = 0  # lines given up for the bound
        self.error: str | None = None  # the disk's last refusal while anything is held
        self.closed = False
        self._retry_at = 0.0
        self._dropping_said = False

    def held_lines(self) -> int:
        return self.held.count(b"\n")

    def append(self, data: bytes) -> DiskChange | None:
        """Write ``data`` after anything held; a refusal keeps the unwritten rest in memory."""
        if self.closed:
            return None
        if self.held:
            from_memory = self.held.count(b"\n")
            self.held += data
            if time.monotonic() < self._retry_at:  # a full disk is not asked on every line
                return self._bound()
            data, self.held = bytes(self.held), bytearray()
            return self._write(data, from_memory)
        return self._write(data, 0)

    def retry(self) -> DiskChange | None:
        """Write what is held, if the disk takes it now (a flush, or the file's close)."""
        if not self.held or self.closed:
            return None
        data, self.held = bytes(self.held), bytearray()
        return self._write(data, data.count(b"\n"))

    def _write(self, data: bytes, from_memory: int) -> DiskChange | None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except InterruptedError:
                continue
            except OSError as exc:
                self.held = bytearray(view)
                self._retry_at = time.monotonic() + RETRY_EVERY_S
                first = self.error is None
                self.error = exc.strerror or str(exc)
                return DiskChange("failed", self.error) if first else self._bound()
        if self.error is not None:
            self.error, self._dropping_said = None, False
            return DiskChange("recovered", lines=from_memory)
        return None

    def _bound(self) -> DiskChange | None:
        """Drop the oldest whole held lines past ``limit``; said the first time only."""
        if len(self.held) <= self.limit:
            return None
        cut = self.held.find(b"\n", len(self.held) - self.limit)
        cut = len(self.held) if cut < 0 else cut + 1
        gone = self.held[:cut].count(b"\n")
        del self.held[:cut]
        self.dropped += gone
        if self._dropping_said:
            return None
        self._dropping_said = True
        return DiskChange("dropping", self.error or "", self.dropped)

    def close(self) -> None:
        if not self.closed:
            self.retry()
            self.closed = True
            os.close(self.fd)
