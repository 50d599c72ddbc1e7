"""A task's stdout and stderr put back into the order it wrote them (docs/reference.md, "Output
order and time"): the two streams travel as separate messages, so a ``tf.print`` line can arrive
after the ``print`` that followed it. The worker numbers each write (worker/ordered_output.py);
writes wait here for every lower number, at most ``HOLD_S`` (a message lost with a dying process),
and the cell's idle releases all. Unnumbered messages (no agent, a forked child) pass as they come.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

HOLD_S = 0.5
#: a line: ``(time, stream, text, parent)``, parent the msg_id of the request whose output it is
Line = tuple[float, str, str, str]


@dataclass
class _Write:
    seq: int
    time: float
    stream: str
    text: str
    parent: str
    arrived: float


@dataclass
class StreamOrder:
    """Used from one thread (the channel's event loop)."""

    _held: dict[int, _Write] = field(default_factory=dict)
    _next: int = 1
    _pid: int | None = None
    _partial: dict[str, tuple[float, str, str]] = field(default_factory=dict)

    def add(self, stream: str, text: str, marks: Any, parent: str, now: float,
            sent: float) -> list[Line]:
        """The lines this message completes, in write order: ``(time, stream, line, parent)``."""
        pid, writes = self._writes(stream, text, marks, parent, now)
        out: list[Line] = []
        if pid is not None and pid != self._pid:
            if self._pid is not None and writes[0].seq != 1:
                pid = None  # a forked child, numbering on from its parent: as it comes
            else:  # this kernel's process (again, after a restart): numbers begin anew
                out += self.release(now, force=True)
                self._pid, self._next = pid, 1
        if pid is None:
            return out + self.release(now, force=True) + self._lines(
                _Write(0, sent, stream, text, parent, now))
        for w in writes:
            if w.seq < self._next:  # late, its gap already passed over: show it now
                out += self._lines(w)
            else:
                self._held[w.seq] = w
        return out + self.release(now)

    def release(self, now: float, force: bool = False) -> list[Line]:
        """Writes whose turn has come; ``force`` (the cell went idle) releases all."""
        out: list[Line] = []
        while self._held:
            w = self._held.pop(self._next, None)
            if w is None:
                first = min(self._held)
                if not force and now - self._held[first].arrived < HOLD_S:
                    break
                self._next = first
                continue
            self._next += 1
            out += self._lines(w)
        return out

    def partials(self, keep: Container[str] = ()) -> list[Line]:
        """Unfinished lines, as they are, but those begun by a request in ``keep``.

        A kernel goes idle after each control request too (a debugger's ``continue``, an
        interrupt) and after a probe on a subshell; such an idle mid-``print`` must not cut the
        running cell's line in two (``print('double', f(21))`` writes ``double`` and `` 42``
        apart). What a thread writes after its cell ended goes out at the next idle."""
        out = [(t, stream, text, parent) for stream, (t, text, parent) in self._partial.items()
               if parent not in keep]
        for _, stream, _, _ in out:
            del self._partial[stream]
        return sorted(out, key=lambda line: line[0])

    def _writes(self, stream: str, text: str, marks: Any, parent: str,
                now: float) -> tuple[int | None, list[_Write]]:
        try:
            pid, rows = int(marks["pid"]), marks["marks"]
            if not rows or sum(int(r[2]) for r in rows) != len(text):
                return None, []
            writes, at = [], 0
            for seq, t, n in rows:
                writes.append(_Write(int(seq), float(t), stream, text[at:at + int(n)], parent,
                                     now))
                at += int(n)
        except (TypeError, KeyError, ValueError, IndexError):
            return None, []
        return pid, writes

    def _lines(self, w: _Write) -> list[Line]:
        began, head, parent = self._partial.pop(w.stream, (w.time, "", w.parent))
        *complete, rest = (head + w.text).split("\n")
        out = []
        for line in complete:
            out.append((began, w.stream, line.rstrip("\r"), parent))
            began, parent = w.time, w.parent
        if rest:
            self._partial[w.stream] = (began, rest, parent)
        return out
