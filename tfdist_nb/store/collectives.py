"""The controller's bounded copy of one task's collective ledger, from its telemetry samples:
``open`` the rows it is inside now, ``counts`` per group (``ledger_runs.pair_key``) what the
hang rules compare (diagnostics/hangs.py). The run directory keeps every row.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from tfdist_nb.ledger_runs import LedgerDrain, LedgerRow, pair_key, unfold

KEEP_ROWS = 2000


@dataclass
class LedgerView:
    rows: OrderedDict[int, LedgerRow] = field(default_factory=OrderedDict)
    open: dict[int, LedgerRow] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    issued: int = 0
    _at: dict[tuple[str, int | None], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # written on the loop thread

    def update(self, ledger: LedgerDrain) -> None:
        with self._lock:
            if ledger.get("issued", 0) < self.issued:  # a new process under this name
                self._clear()
            self.issued = int(ledger.get("issued", 0))
            self.counts = {str(k): int(v) for k, v in (ledger.get("counts") or {}).items()}
            rows = list(ledger.get("rows") or ())
            for run in ledger.get("runs") or ():
                rows.extend(unfold(run))
            if ledger.get("runs"):
                rows.sort(key=lambda r: r["seq"])
            for row in rows:
                seq = row["seq"]
                self.rows[seq] = row
                self.rows.move_to_end(seq)
                if row.get("index") is not None:
                    self._at[(pair_key(row), row["index"])] = seq
                if row.get("state") == "entered":
                    self.open[seq] = row
                else:
                    self.open.pop(seq, None)
            while len(self.rows) > KEEP_ROWS:
                seq, row = self.rows.popitem(last=False)
                self.open.pop(seq, None)
                self._at.pop((pair_key(row), row.get("index")), None)

    def reset(self) -> None:
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self.rows.clear()
        self.open.clear()
        self.counts = {}
        self.issued = 0
        self._at.clear()

    def at(self, key: str, index: int) -> LedgerRow | None:
        """This task's row for the ``index``-th collective of ``key`` (a ``pair_key``), if
        still kept."""
        with self._lock:
            seq = self._at.get((key, index))
            return None if seq is None else self.rows.get(seq)

    def checked(self, key: str | None) -> LedgerRow | None:
        """This task's row of the manifest check ``key``, if still kept."""
        with self._lock:
            rows = [r for r in self.rows.values() if r.get("check") == key]
        return rows[-1] if rows else None

    def count(self, key: str) -> int:
        """This task's collectives of ``key`` (a ``pair_key``) so far."""
        return self.counts.get(key, 0)

    def recent(self, last: int | None = None) -> list[LedgerRow]:
        with self._lock:
            rows = list(self.rows.values())
        return rows if last is None else rows[-last:]

    def current(self) -> LedgerRow | None:
        """The collective this task is in now (its oldest open row), or None."""
        with self._lock:
            rows = list(self.open.values())
        return min(rows, key=lambda r: r["seq"]) if rows else None

    def open_rows(self) -> list[LedgerRow]:
        with self._lock:
            return sorted(self.open.values(), key=lambda r: r["seq"])

