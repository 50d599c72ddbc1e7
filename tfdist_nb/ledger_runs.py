"""How completed collectives travel: repeated calls folded into runs, unfolded on arrival (pure).

A training loop issues the same collectives every step: sent row by row that is about 200 kB a
second per task at 200 steps/s, on the cores the training needs. Consecutive completed calls
from one line are sent as one *run* (shared fields once, per call its first sequence number and
times); a call is folded only when the run's arithmetic reproduces its sequence numbers,
positions and call numbers, so ``unfold`` gives back exactly the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, cast

#: Ledger rows that are waits for other tasks, not TensorFlow collectives (no group, no
#: position): ``check`` compares a tf.function's collectives before its first run, ``startup``
#: is the making of a MultiWorkerMirroredStrategy (docs/reference.md, "Collectives and hangs").
BARRIER_KINDS = frozenset({"check", "startup"})

#: what TensorFlow raises in a collective that was released (aborted, a peer gone, cancelled),
#: not failed
RELEASED_ERRORS = ("UnavailableError", "CancelledError", "AbortedError")

# The fields a row's collective shares with the same collective in the next call of the run.
SHARED = ("kind", "group", "group_size", "dtype", "shape", "bytes", "where", "in_control_flow")
CALL = ("function", "called_at", "strategy")  # strategy: set from the second one on


class LedgerRow(TypedDict, total=False):
    """One collective execution (or barrier, or traced collective) in a task's ledger;
    ``cluster.collectives()`` shows most fields (docs/reference.md, "Collectives and hangs")."""

    seq: int  # this task's sequence number, from 1
    kind: str  # all_reduce | all_gather | broadcast | check | startup (BARRIER_KINDS)
    group: int | None  # TensorFlow's group key
    group_size: int | None
    dtype: str
    shape: list[int | None] | None  # None: rank unknown
    bytes: int | None
    function: str  # the tf.function it ran in, or "eager"
    in_control_flow: bool
    index: int | None  # position among the pair_key's collectives; None for a barrier
    call: int | None  # the function's call number
    where: str  # cell N line L
    called_at: str | None  # the line that called the traced function
    state: str  # entered | done | failed | aborted | traced | differs
    entered: float
    done: float | None
    strategy: int  # the strategy it ran under, from the second one in the process on
    members: list[str]  # a barrier's tasks
    check: str  # a manifest check's key
    traced_for: str  # a traced row's check
    position: int  # a traced row's place in its function's manifest


class LedgerRun(TypedDict, total=False):
    """Consecutive completed calls of one line folded into one message (``fold``)."""

    ops: list[LedgerRow]  # the SHARED fields of each collective of a call
    index: list[int | None]  # each collective's index in the first call
    call: int | None
    calls: list[tuple[int, float, float | None]]  # per call: first seq, entered, done
    function: str
    called_at: str | None
    strategy: int


class LedgerDrain(TypedDict, total=False):
    """What a task's ledger sends with a telemetry sample (``worker.ledger.Ledger.drain``)."""

    rows: list[LedgerRow]
    runs: list[LedgerRun]
    issued: int  # rows made so far: fewer than last time means a new process
    counts: dict[str, int]  # per pair_key
    more: bool  # rows left for the next message


def pair_key(row: LedgerRow) -> str:
    """What a row's ``index`` counts within: its group, under the strategy it ran in. A later
    strategy in the same process hands out instance keys from the start again (TensorFlow's
    ``CollectiveKeys`` are per strategy, its group keys the same), so its rows count anew;
    ``strategy`` is set on the rows of the second and later ones."""
    strategy = row.get("strategy")
    return f"{strategy}/{row.get('group')}" if strategy else str(row.get("group"))


def fold(rows: list[LedgerRow]) -> tuple[list[LedgerRow], list[LedgerRun]]:
    """Split ``rows`` (in sequence order) into rows sent as they are and runs of completed
    calls; a call is the rows one ledger entry made (same function and call number)."""
    single: list[LedgerRow] = []
    runs: list[LedgerRun] = []
    run: LedgerRun | None = None
    for call in _calls(rows):
        if not _foldable(call):
            single.extend(call)
            run = None
            continue
        first = call[0]
        if run is not None and _continues(run, call):
            run["calls"].append((first["seq"], first["entered"], first.get("done")))
            continue
        run = cast(LedgerRun, {
            "ops": [{k: _field(r, k) for k in SHARED} for r in call],
            **{k: _field(first, k) for k in CALL if k in first},
            "index": [r.get("index") for r in call], "call": first.get("call"),
            "calls": [(first["seq"], first["entered"], first.get("done"))]})
        runs.append(run)
    return single, runs


def unfold(run: LedgerRun) -> list[LedgerRow]:
    """The rows ``fold`` made ``run`` of, in sequence order."""
    ops, first, start = run["ops"], run["index"], run.get("call")
    per_group = _per_group(ops)
    out: list[LedgerRow] = []
    for k, (seq, entered, done) in enumerate(run["calls"]):
        for j, op in enumerate(ops):
            at = first[j]
            row: LedgerRow = {
                "seq": seq + j, **op,
                "index": None if at is None else at + k * per_group[str(op["group"])],
                "function": run["function"], "call": None if start is None else start + k,
                "called_at": run.get("called_at"), "state": "done", "entered": entered,
                "done": done}
            if "strategy" in run:
                row["strategy"] = run["strategy"]
            out.append(row)
    return out


def _calls(rows: list[LedgerRow]) -> list[list[LedgerRow]]:
    calls: list[list[LedgerRow]] = []
    for row in rows:
        last = calls[-1][-1] if calls else None
        if (last is not None and row.get("function") != "eager" and row.get("call") is not None
                and (last.get("function"), last.get("call")) == (row.get("function"),
                                                                 row.get("call"))
                and row["seq"] == last["seq"] + 1):
            calls[-1].append(row)
        else:
            calls.append([row])
    return calls


def _foldable(call: list[LedgerRow]) -> bool:
    first = call[0]
    return all(r.get("state") == "done" and r.get("kind") not in BARRIER_KINDS
               and "members" not in r
               and "check" not in r and r.get("entered") == first.get("entered")
               and r.get("done") == first.get("done") for r in call)


def _continues(run: LedgerRun, call: list[LedgerRow]) -> bool:
    """Whether ``call`` is the next call of ``run``: the same collectives from the same place,
    the next sequence numbers, positions and call number."""
    ops, start = run["ops"], run.get("call")
    k = len(run["calls"])
    if len(call) != len(ops) or any(_field(call[0], f) != _field(run, f) for f in CALL):
        return False
    last_seq = run["calls"][-1][0]
    if call[0]["seq"] != last_seq + len(ops):
        return False
    if call[0].get("call") != (None if start is None else start + k):
        return False
    per_group = _per_group(ops)
    for j, (op, row) in enumerate(zip(ops, call, strict=True)):
        if any(_field(op, f) != _field(row, f) for f in SHARED):
            return False
        first = run["index"][j]
        want = None if first is None else first + k * per_group[str(op["group"])]
        if row.get("index") != want:
            return False
    return True


def _field(row: LedgerRow | LedgerRun, name: str) -> object:
    """A field named at run time (one of SHARED or CALL)."""
    return cast(Mapping[str, object], row).get(name)


def _per_group(ops: list[LedgerRow]) -> dict[str, int]:
    """How many of a call's collectives belong to each group: a group's positions advance by
    that much per call."""
    counts: dict[str, int] = {}
    for op in ops:
        if op.get("kind") not in BARRIER_KINDS:
            counts[str(op["group"])] = counts.get(str(op["group"]), 0) + 1
    return counts
