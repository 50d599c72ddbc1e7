"""The ledger's wire format, without processes: what a task's ledger drains is what the
controller's copy then holds, row for row, while a training loop's completed calls travel as
runs (tfdist_nb/ledger_runs.py)."""

from __future__ import annotations

import json

from tfdist_nb.store.collectives import LedgerView
from tfdist_nb.worker.ledger import Ledger, Op

STEP = (Op("all_reduce", 2, 1, "float32", (128, 256), 131072, "cell 3 line 9"),
        Op("all_reduce", 2, 1, "float32", (256, 1), 1024, "cell 3 line 9"),
        Op("all_reduce", 2, 2, "float32", (), 4, "cell 3 line 11"))
EAGER = Op("all_reduce", 2, 2, "float32", (3,), 12, "cell 4 line 2")


def _send(ledger: Ledger, view: LedgerView) -> int:
    """One telemetry drain through JSON, as the kernel's iopub carries it; its size."""
    drained = ledger.drain()
    if drained is None:
        return 0
    text = json.dumps(drained)
    view.update(json.loads(text))
    return len(text)


def test_the_controller_holds_every_row_the_task_drained_in_a_mixed_history() -> None:
    ledger, view = Ledger(), LedgerView()
    for call in range(1, 6):
        ledger.close(ledger.enter(STEP, "train_step", call=call, called_at="cell 3 line 20"))
    for _ in range(3):  # an eager loop from one line
        ledger.close(ledger.enter([EAGER], "eager"))
    ledger.close(ledger.enter([Op("check", 2, None, "", None, None, "cell 5 line 1")],
                              "step", check="k1", members=["worker:0", "worker:1"]))
    failed = ledger.enter(STEP, "train_step", call=6, called_at="cell 3 line 20")
    ledger.close(failed[:1], "failed")
    _send(ledger, view)
    waiting = ledger.enter(STEP, "train_step", call=7, called_at="cell 3 line 20")
    _send(ledger, view)
    assert [r["seq"] for r in view.open_rows()] == [r["seq"] for r in failed[1:] + waiting]
    ledger.close(waiting)  # sent open, now done: the controller's row is closed too
    ledger.close(failed[1:])
    for call in range(8, 12):
        ledger.close(ledger.enter(STEP, "train_step", call=call, called_at="cell 3 line 21"))
    _send(ledger, view)

    assert view.recent() == ledger.recent()
    assert view.open_rows() == []
    assert view.count("1") == 2 * 11 and view.count("2") == 11 + 3
    assert view.at("1", 7)["call"] == 4 and view.at("2", 9)["function"] == "train_step"
    assert view.checked("k1")["state"] == "done"


def test_a_strategy_made_again_counts_anew_and_its_runs_keep_which_strategy() -> None:
    ledger, view = Ledger(), LedgerView()
    for call in range(1, 4):
        ledger.close(ledger.enter(STEP, "train_step", call=call, called_at="cell 3 line 20"))
    ledger.new_strategy()
    for call in range(1, 5):
        ledger.close(ledger.enter(STEP, "train_step", call=call, called_at="cell 6 line 20"))
    _send(ledger, view)
    assert view.recent() == ledger.recent()  # the runs of the second strategy keep its mark
    assert (view.count("1"), view.count("1/1"), view.count("1/2")) == (6, 8, 4)
    assert view.at("1/1", 0)["called_at"] == "cell 6 line 20"
    assert view.at("1", 0)["called_at"] == "cell 3 line 20"


def test_a_training_loops_ledger_travels_in_a_tenth_of_the_row_by_row_size() -> None:
    ledger, view = Ledger(), LedgerView()
    for call in range(1, 201):  # one second of a 5 ms step
        ledger.close(ledger.enter(STEP, "train_step", call=call, called_at="cell 3 line 20"))
    row_by_row = len(json.dumps({"rows": ledger.recent()}))
    sent = _send(ledger, view)
    assert view.recent() == ledger.recent()
    assert sent * 10 < row_by_row, (sent, row_by_row)


def test_calls_from_another_line_or_with_other_shapes_start_a_new_run() -> None:
    ledger, view = Ledger(), LedgerView()
    other = (STEP[0], STEP[1], Op("all_reduce", 2, 2, "float32", (2,), 8, "cell 3 line 11"))
    for call, ops, line in ((1, STEP, "cell 3 line 20"), (2, STEP, "cell 3 line 20"),
                            (3, STEP, "cell 3 line 22"), (4, other, "cell 3 line 22")):
        ledger.close(ledger.enter(ops, "train_step", call=call, called_at=line))
    drained = json.loads(json.dumps(ledger.drain()))
    assert [len(run["calls"]) for run in drained["runs"]] == [2, 1, 1]
    view.update(drained)
    assert view.recent() == ledger.recent()
