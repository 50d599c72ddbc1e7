"""The SPEC and task-list grammar (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist_nb.errors import SpecError
from tfdist_nb.topology import ClusterSpec, TaskId, name_tasks, parse_spec, parse_targets


@pytest.mark.parametrize(("text", "expected"), [
    ("2 workers", ClusterSpec(workers=2)),
    ("1 worker", ClusterSpec(workers=1)),
    ("1 chief 2 workers 1 ps", ClusterSpec(workers=2, chief=1, ps=1)),
    ("2 ps 3 workers", ClusterSpec(workers=3, ps=2)),
    ("1 Chief", ClusterSpec(chief=1)),
])
def test_parse_spec(text: str, expected: ClusterSpec) -> None:
    assert parse_spec(text) == expected


def test_spec_str_round_trips() -> None:
    spec = parse_spec("1 ps 2 workers 1 chief")
    assert str(spec) == "1 chief 2 workers 1 ps"
    assert parse_spec(str(spec)) == spec
    assert [str(t) for t in spec.tasks] == ["chief:0", "worker:0", "worker:1", "ps:0"]


@pytest.mark.parametrize(("text", "needle"), [
    ("two workers", "expected a number"),
    ("0 workers", "0 workers is not a cluster"),
    ("2 wrokers", "Did you mean 'workers'"),
    ("2", "pairs of"),
    ("", "no cluster SPEC"),
    ("2 workers 3 workers", "given twice"),
    ("2 chiefs", "at most 1 chief"),
    ("1 ps", "ps tasks need workers"),
    ("-1 workers", "expected a number"),
])
def test_bad_specs_say_why(text: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        parse_spec(text)


def test_targets() -> None:
    spec = parse_spec("1 chief 2 workers 1 ps")
    assert parse_targets(None, spec) == spec.tasks
    assert parse_targets("all", spec) == spec.tasks
    assert parse_targets("1", spec) == [TaskId("worker", 1)]
    assert parse_targets("0,worker:1,ps:0", spec) == [
        TaskId("worker", 0), TaskId("worker", 1), TaskId("ps", 0)]
    assert parse_targets([1, "chief:0"], spec) == [TaskId("worker", 1), TaskId("chief", 0)]
    assert parse_targets("1,1", spec) == [TaskId("worker", 1)]


@pytest.mark.parametrize(("text", "needle"), [
    ("worker:7", "no task worker:7 in a cluster of 2 workers"),
    ("ps:0", "no task ps:0"),
    ("gpu:1", "cannot read task"),
    ("w1", "cannot read task"),
    (",", "empty task list"),
])
def test_bad_targets(text: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        parse_targets(text, parse_spec("2 workers"))


def test_one_task_order_for_the_collectives_table_and_the_lab_panes(tmp_path: Path) -> None:
    """``topology.task_order`` everywhere tasks are listed: chief, workers by index (worker:2
    before worker:10), ps, evaluator; in ``cluster.collectives()`` at one position, and in
    the lab panes of a run directory without its state file."""
    from tfdist_nb.lab.model import ClusterWatch
    from tfdist_nb.store.collectives import LedgerView
    from tfdist_nb.store.ledger_frame import collectives_frame

    names = ["worker:10", "ps:0", "worker:2", "chief:0"]
    in_order = ["chief:0", "worker:2", "worker:10", "ps:0"]
    ledgers = {}
    for name in names:
        ledgers[name] = view = LedgerView()
        view.update({"issued": 2, "rows": [
            {"seq": seq, "kind": "all_reduce", "state": "done", "entered": 1.0, "done": 2.0}
            for seq in (1, 2)]})
    frame = collectives_frame(ledgers, last=None, now=3.0)
    assert list(zip(frame["seq"], frame["task"], strict=True)) == [
        (seq, task) for seq in (1, 2) for task in in_order]
    for name in names:
        (tmp_path / "tasks" / name.replace(":", "-")).mkdir(parents=True)
    summary = ClusterWatch("c1", tmp_path).summary()
    assert [t["task"] for t in summary["tasks"]] == in_order
    assert summary["spec"] == "1 chief 2 workers 1 ps"
    # the spec read from the task directories is written as a SPEC is: "2 ps", not "2 pss"
    (tmp_path / "tasks" / "ps-1").mkdir()
    assert ClusterWatch("c1", tmp_path).summary()["spec"] == "1 chief 2 workers 2 ps"


def test_task_names_in_a_sentence_stay_short_at_any_size() -> None:
    assert name_tasks(["worker:1", "chief:0"]) == "chief:0 and worker:1"  # in task order
    assert name_tasks([f"worker:{i}" for i in range(8)]).count("worker:") == 8  # in full
    many = [f"worker:{i}" for i in range(1023)] + ["ps:1", "ps:0", "chief:0"]
    assert name_tasks(many) == "chief:0, worker:0-1022 and ps:0-1 (1,026 tasks)"
    gaps = [f"worker:{i}" for i in (0, 1, 2, 5, 7, 8, 9, 10, 11)]
    assert name_tasks(gaps) == "worker:0-2, worker:5 and worker:7-11 (9 tasks)"
