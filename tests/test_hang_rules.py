"""The hang rules on ledgers as the tasks report them (pure): what each rule says."""

from __future__ import annotations

from tfdist_nb.diagnostics.hangs import judge
from tfdist_nb.store.collectives import LedgerView


def ledger(*rows: dict) -> LedgerView:
    view = LedgerView()
    view.update({"issued": len(rows), "counts": {"1": len(rows)}, "rows": list(rows)})
    return view


def all_reduce(seq: int, size: int, state: str = "entered") -> dict:
    return {"seq": seq, "index": seq, "group": 1, "kind": "all_reduce", "dtype": "float32",
            "shape": [size], "function": "eager", "where": "cell 2 line 2", "state": state,
            "entered": 100.0, "group_size": 2}


def test_two_tasks_waiting_in_one_position_with_different_shapes_are_diverged() -> None:
    # what an eager per-task shape gives when both tasks are in before TensorFlow compares
    busy = {"worker:0": ledger(all_reduce(0, 3)), "worker:1": ledger(all_reduce(0, 2))}
    hang = judge({}, busy, busy, {"worker:0", "worker:1"}, set(), {}, now=101.5)
    assert hang is not None and hang.rule == "diverged"
    assert hang.cause == (
        "the tasks wait in different collectives at position 1: worker:0: all_reduce "
        "float32[3] #1 eagerly at cell 2 line 2; worker:1: all_reduce float32[2] #1 eagerly "
        "at cell 2 line 2")


def test_two_tasks_waiting_in_the_same_collective_is_no_hang() -> None:
    busy = {"worker:0": ledger(all_reduce(0, 3)), "worker:1": ledger(all_reduce(0, 3))}
    assert judge({}, busy, busy, {"worker:0", "worker:1"}, set(), {}, now=101.5) is None
