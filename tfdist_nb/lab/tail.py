"""Incremental reading of a JSON Lines file another process appends to: each poll reads only
what was appended, the first only the last ``initial_bytes``, so a huge log is never read whole.
"""

from __future__ import annotations

import json
from pathlib import Path

from tfdist_nb.owned_files import read_regular, regular_stat
from tfdist_nb.store.rundir import Record

INITIAL_BYTES = 1 << 20  # the first read of a file: its last MiB
MAX_READ = 4 << 20       # at most this much per poll; the rest comes with the next ones


class JsonlTail:
    def __init__(self, path: Path, initial_bytes: int = INITIAL_BYTES,
                 max_read: int = MAX_READ) -> None:
        self.path = path
        self.initial_bytes = initial_bytes
        self.max_read = max_read
        self.offset: int | None = None  # None: not read yet
        self.bytes_read = 0             # how much this tail has read in all (tests check it)
        self._partial = b""
        self._skip_first = False
        self._ino: int | None = None

    def read_new(self) -> list[Record]:
        """The records appended since the last call (whole lines only)."""
        st = regular_stat(self.path)  # a FIFO or a link in its place reads as nothing
        if st is None:
            return []
        if self.offset is None or st.st_ino != self._ino or st.st_size < self.offset:
            # first read, or the file was replaced / truncated: start again near its end
            self._ino = st.st_ino
            self.offset = max(0, st.st_size - self.initial_bytes)
            self._skip_first = self.offset > 0  # we start inside a line: drop it
            self._partial = b""
        if st.st_size == self.offset:
            return []
        data = read_regular(self.path, self.offset, min(self.max_read, st.st_size - self.offset))
        if not data:
            return []
        self.offset += len(data)
        self.bytes_read += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if self._skip_first and lines:
            lines.pop(0)
            self._skip_first = False
        out: list[Record] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out
