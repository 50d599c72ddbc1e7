"""The SPEC and task-list grammar (pure)."""

from __future__ import annotations

import pytest

from tfdist_nb.errors import SpecError
from tfdist_nb.topology import ClusterSpec, TaskId, parse_spec, parse_targets


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
