"""How completed collectives travel: repeated calls folded into runs, unfolded on arrival (pure).

A training loop issues the same collectives every step: sent row by row that is about 200 kB a
second per task at 200 steps/s, on the cores the training needs. Consecutive completed calls
from one line are sent as one *run* (shared fields once, per call its first sequence number and
times); a call is folded only when the run's arithmetic reproduces its sequence numbers,
positions and call numbers, so ``unfold`` gives back exactly the rows.
"""

from __future__ import annotations

from typing import Any

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


def pair_key(row: dict[str, Any]) -> str:
    """What a row's ``index`` counts within: its group, under the strategy it ran in. A later
    strategy in the same process hands out instance keys from the start again (TensorFlow's
    ``CollectiveKeys`` are per strategy, its group keys the same), so its rows count anew;
    ``strategy`` is set on the rows of the second and later ones."""
    strategy = row.get("strategy")
    return f"{strategy}/{row.get('group')}" if strategy else str(row.get("group"))


def fold(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split ``rows`` (in sequence order) into rows sent as they are and runs of completed
    calls; a call is the rows one ledger entry made (same function and call number)."""
    single: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    run: dict[str, Any] | None = None
    for call in _calls(rows):
        if not _foldable(call):
            single.extend(call)
            run = None
            continue
        if run is not None and _continues(run, call):
            run["calls"].append([call[0]["seq"], call[0]["entered"], call[0]["done"]])
            continue
        run = {"ops": [{k: r.get(k) for k in SHARED} for r in call],
               **{k: call[0][k] for k in CALL if k in call[0]},
               "index": [r.get("index") for r in call], "call": call[0].get("call"),
               "calls": [[call[0]["seq"], call[0]["entered"], call[0]["done"]]]}
        runs.append(run)
    return single, runs


def unfold(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows ``fold`` made ``run`` of, in sequence order."""
    ops, first = run["ops"], run["index"]
    per_group = _per_group(ops)
    out = []
    for k, (seq, entered, done) in enumerate(run["calls"]):
        call = None if run.get("call") is None else run["call"] + k
        for j, op in enumerate(ops):
            index = None if first[j] is None else first[j] + k * per_group[str(op["group"])]
            out.append({"seq": seq + j, **op, "index": index, "function": run.get("function"),
                        "call": call, "called_at": run.get("called_at"), "state": "done",
                        "entered": entered, "done": done,
                        **({"strategy": run["strategy"]} if "strategy" in run else {})})
    return out


def _calls(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    calls: list[list[dict[str, Any]]] = []
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


def _foldable(call: list[dict[str, Any]]) -> bool:
    first = call[0]
    return all(r.get("state") == "done" and r.get("kind") not in BARRIER_KINDS
               and "members" not in r
               and "check" not in r and r.get("entered") == first.get("entered")
               and r.get("done") == first.get("done") for r in call)


def _continues(run: dict[str, Any], call: list[dict[str, Any]]) -> bool:
    """Whether ``call`` is the next call of ``run``: the same collectives from the same place,
    the next sequence numbers, positions and call number."""
    ops = run["ops"]
    k = len(run["calls"])
    if len(call) != len(ops) or any(call[0].get(f) != run.get(f) for f in CALL):
        return False
    last_seq = run["calls"][-1][0]
    if call[0]["seq"] != last_seq + len(ops):
        return False
    if run.get("call") is None:
        if call[0].get("call") is not None:
            return False
    elif call[0].get("call") != run["call"] + k:
        return False
    per_group = _per_group(ops)
    for j, (op, row) in enumerate(zip(ops, call, strict=True)):
        if any(op[f] != row.get(f) for f in SHARED):
            return False
        first = run["index"][j]
        want = None if first is None else first + k * per_group[str(op["group"])]
        if row.get("index") != want:
            return False
    return True


def _per_group(ops: list[dict[str, Any]]) -> dict[str, int]:
    """How many of a call's collectives belong to each group: a group's positions advance by
    that much per call."""
    counts: dict[str, int] = {}
    for op in ops:
        if op.get("kind") not in BARRIER_KINDS:
            counts[str(op["group"])] = counts.get(str(op["group"]), 0) + 1
    return counts
