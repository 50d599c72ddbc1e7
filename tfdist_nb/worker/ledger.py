"""This task's collective ledger: one row per collective execution, in order, with its state
(docs/reference.md, "Collectives and hangs").

A row's ``index`` is its position among this task's collectives of the same group under the same
strategy (``ledger_runs.pair_key``), which is how TensorFlow pairs them across tasks (instance
keys are handed out in that order, anew for each strategy): rows with the same key and index on
two tasks are the same collective, or should be.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tfdist_nb.events import describe_tensor
from tfdist_nb.ledger_runs import (
    BARRIER_KINDS,
    RELEASED_ERRORS,
    LedgerDrain,
    LedgerRow,
    fold,
    pair_key,
)

T = TypeVar("T")
KEEP = 5000
MAX_ROWS_PER_MESSAGE = 2000


@dataclass(frozen=True, slots=True)
class Op:
    """One collective as traced into a function or launched eagerly."""

    kind: str  # all_reduce | all_gather | broadcast | check | startup (BARRIER_KINDS)
    group_size: int | None
    group_key: int | None
    dtype: str
    shape: tuple[int | None, ...] | None  # None: rank unknown
    nbytes: int | None
    where: str  # cell N line L
    in_control_flow: bool = False  # inside tf.cond / tf.while_loop: may run 0 or n times per call

    def signature(self) -> list[str | int | list[int | None] | None]:
        """What must agree across tasks for the collective to pair correctly."""
        return [self.kind, self.dtype, None if self.shape is None else list(self.shape),
                self.group_size]

    def describe(self) -> str:
        return f"{self.kind} {describe_tensor(self.dtype, self.shape)}"


def failed_state(exc: BaseException) -> str:
    """``aborted`` when the collective was released (aborted, cancelled, interrupted)."""
    name = type(exc).__name__
    return "aborted" if name in (*RELEASED_ERRORS, "KeyboardInterrupt") else "failed"


class CollectiveMismatchError(RuntimeError):
    """A traced function issues different collectives on different tasks (found before its
    first run, so none of them were paired with the wrong partner)."""


class Ledger:
    """Thread-safe: eager collectives may be launched from a strategy's worker thread."""

    def __init__(self, keep: int = KEEP) -> None:
        self._rows: collections.deque[LedgerRow] = collections.deque(maxlen=keep)
        self._seq = 0
        self._counts: dict[tuple[int, int | None], int] = {}  # by (strategy, group key)
        self._strategy = 0  # strategies made before the current one in this process
        self._dirty: dict[int, LedgerRow] = {}
        self._open: dict[int, LedgerRow] = {}  # entered, not yet closed
        self._lock = threading.Lock()

    def enter(self, ops: list[Op] | tuple[Op, ...], function: str, call: int | None = None,
              where: str | None = None, members: list[str] | None = None,
              called_at: str | None = None, check: str | None = None) -> list[LedgerRow]:
        """Rows for ``ops`` entered now; ``where`` overrides the ops' own (an eager launch);
        ``called_at``: the line that called the traced function they run in."""
        now = time.time()
        extra: LedgerRow = {}  # the same on every task
        if members is not None:
            extra["members"] = members
        if check is not None:
            extra["check"] = check
        rows = []
        with self._lock:
            if self._strategy:
                extra["strategy"] = self._strategy
            for op in ops:
                index = None
                if op.kind not in BARRIER_KINDS:
                    key = (self._strategy, op.group_key)
                    index = self._counts.get(key, 0)
                    self._counts[key] = index + 1
                row = self._add(op, function, {
                    "index": index, "call": call, "where": where or op.where,
                    "called_at": called_at, "state": "entered", "entered": now, "done": None,
                    **extra})
                self._open[row["seq"]] = row
                rows.append(row)
        return rows

    def new_strategy(self) -> None:
        """A second (third...) strategy is being made in this process: its collectives count
        from the first again, as TensorFlow pairs them."""
        with self._lock:
            self._strategy += 1

    def traced(self, ops: list[Op], function: str, check: str,
               differs_at: int | None = None) -> None:
        """What ``function`` traced, as its tasks compared it before its first run (``check``
        its key): one row per collective, state ``traced``, or ``differs`` at the first
        position where the tasks' manifests differ, so each task's ledger shows what it traced
        side by side with the others'. Not executions: no index, no count."""
        now = time.time()
        with self._lock:
            for position, op in enumerate(ops):
                self._add(op, function, {
                    "index": None, "call": None, "where": op.where, "called_at": None,
                    "traced_for": check, "position": position + 1,
                    "state": "differs" if position == differs_at else "traced",
                    "entered": now, "done": now})

    def _add(self, op: Op, function: str, fields: LedgerRow) -> LedgerRow:
        """A new row for ``op``, kept and marked unsent (call with the lock held)."""
        self._seq += 1
        row: LedgerRow = {"seq": self._seq, "kind": op.kind, "group": op.group_key,
               "group_size": op.group_size, "dtype": op.dtype,
               "shape": None if op.shape is None else list(op.shape), "bytes": op.nbytes,
               "function": function, "in_control_flow": op.in_control_flow, **fields}
        self._rows.append(row)
        self._dirty[self._seq] = row
        return row

    def close(self, rows: list[LedgerRow], state: str = "done") -> None:
        now = time.time()
        with self._lock:
            for row in rows:
                row["state"], row["done"] = state, now
                self._dirty[row["seq"]] = row
                self._open.pop(row["seq"], None)

    def run(self, rows: list[LedgerRow], fn: Callable[..., T], *args: object,
            **kwargs: object) -> T:
        """``fn(*args, **kwargs)`` with ``rows`` (just entered) closed as it ends: done, or
        ``failed_state`` of what it raised."""
        try:
            out = fn(*args, **kwargs)
        except BaseException as exc:
            self.close(rows, failed_state(exc))
            raise
        self.close(rows)
        return out

    def pending(self) -> bool:
        return bool(self._dirty)

    def waiting_unsent(self, older_than_s: float) -> bool:
        """Whether a row not yet sent has been open for ``older_than_s``: a collective that
        did not complete at once, which the controller should hear of now, not at the next
        sample (a hang is named from it)."""
        limit = time.time() - older_than_s
        with self._lock:
            return any(r["entered"] <= limit and seq in self._dirty
                       for seq, r in self._open.items())

    def drain(self) -> LedgerDrain | None:
        """The rows that are new or changed since the last drain (copies; completed calls
        folded into runs), with this task's per-group counts; None when nothing changed."""
        with self._lock:
            if not self._dirty:
                return None
            seqs = sorted(self._dirty)[:MAX_ROWS_PER_MESSAGE]
            rows = [self._dirty.pop(s).copy() for s in seqs]
            issued, more = self._seq, bool(self._dirty)
            counts = {pair_key({"strategy": s, "group": g}): n
                      for (s, g), n in self._counts.items()}
        single, runs = fold(rows)
        return {"rows": single, **({"runs": runs} if runs else {}), "issued": issued,
                "counts": counts, "more": more}

    def recent(self, last: int | None = None) -> list[LedgerRow]:
        with self._lock:
            rows = list(self._rows)
        return [r.copy() for r in (rows if last is None else rows[-last:])]


LEDGER = Ledger()
# Set from the inspection subshell (abort_collectives): a task waiting in the manifest check
# gives up at once, as one waiting in a collective does when its collectives are aborted.
ABORT = threading.Event()
