"""The isolate walk without processes: which variant comes next for each outcome, what the
outcomes say (the verdict), and the cell edits (the loop bound, the prelude's settings). The
same paths run on real clusters in tests/test_isolate.py and the teaching notebook."""

from __future__ import annotations

import pytest

from tfdist_nb.diagnostics.cell_edits import (
    implementation_named,
    loop_bound,
    prelude_code,
    with_bound,
)
from tfdist_nb.diagnostics.isolate import Walk
from tfdist_nb.diagnostics.isolate_variants import (
    Failure,
    Finding,
    Outcome,
    Row,
    judge,
    signature,
)
from tfdist_nb.results import RemoteError, TaskResult
from tfdist_nb.topology import ClusterSpec

F, P = Outcome.FAILS, Outcome.PASSES


def walk(workers: int = 2, bound: int | None = None, gpus: bool = False,
         on_its_own: tuple[str, ...] = (), chief: int = 0) -> Walk:
    """A walk of a ValueError; ``on_its_own``: the tasks that raised in the cell's run (the
    others were released from the hang they left)."""
    failed = tuple(str(t) for t in ClusterSpec(workers=workers, chief=chief).tasks)
    return Walk(ClusterSpec(workers=workers, chief=chief),
                Failure("ValueError", "ValueError: bad", failed, 2.0, on_its_own=on_its_own),
                bound=bound, gpus=gpus)


def play(w: Walk, answers: dict[str, object]) -> list[str]:
    """Run the walk answering each variant from ``answers`` (a shares variant: per task);
    returns the variant keys in the order asked."""
    asked = []
    while (v := w.next()) is not None:
        asked.append(v.key)
        got = answers[v.key]
        if v.shares:
            assert isinstance(got, dict)
            w.record([Row(v, got[str(t)], 1.0, "ValueError: bad" if got[str(t)] is F else "",
                          task=str(t), steps_done=3) for t in v.spec.tasks])
        else:
            assert isinstance(got, Outcome)
            w.record([Row(v, got, 1.0, "ValueError: bad" if got is F else "", steps_done=3)])
    return asked


def test_a_failure_that_passes_again_is_flaky_and_nothing_more_runs() -> None:
    w = walk()
    assert play(w, {"same": P}) == ["same"]
    assert w.finding() is Finding.FLAKY and w.verdict().startswith("flaky:")
    assert w.smallest() is None


def test_one_tasks_data_stops_at_the_shares_then_shrinks_the_steps() -> None:
    w = walk(bound=8)
    asked = play(w, {"same": F, "tasks=1": F,
                     "shares": {"worker:0": P, "worker:1": F},
                     "share:worker:1+steps=3": F})
    assert asked == ["same", "tasks=1", "shares", "share:worker:1+steps=3"]
    assert w.finding() is Finding.TASK_DATA
    assert w.verdict().startswith("fails on worker:1's share alone: that task's data")
    assert w.smallest().variant.key == "share:worker:1+steps=3"


def test_every_share_failing_asks_whether_it_passes_eagerly() -> None:
    w = walk()
    asked = play(w, {"same": F, "tasks=1": F, "shares": {"worker:0": F, "worker:1": F},
                     "share:worker:0+eager": P})
    assert asked[-1] == "share:worker:0+eager"
    assert w.finding() is Finding.TRACED_FUNCTION
    w = walk()
    play(w, {"same": F, "tasks=1": F, "shares": {"worker:0": F, "worker:1": F},
             "share:worker:0+eager": F})
    assert w.finding() is Finding.MODEL_OR_PIPELINE


def test_passing_on_one_worker_is_a_distributed_bug_with_its_smallest_count() -> None:
    w = walk(workers=4)
    asked = play(w, {"same": F, "tasks=1": P, "tasks=2": P, "tasks=3": F, "mirrored": P,
                     "tasks=3+eager": F})
    assert asked == ["same", "tasks=1", "tasks=2", "tasks=3", "mirrored", "tasks=3+eager"]
    assert w.finding() is Finding.DISTRIBUTED
    assert w.verdict().startswith("needs 3 or more workers: a distributed bug (with 1 worker "
                                  "it passes; the 4 replicas in one process pass"), w.verdict()
    assert w.smallest().variant.key == "tasks=3"


def test_one_tasks_own_failure_runs_its_share_alone_before_anything_distributed() -> None:
    """1 worker runs as worker:0 and never reads worker:1's data: worker:1, which raised while
    worker:0 was only released, runs alone as itself, and its share failing is the answer."""
    w = walk(bound=8, on_its_own=("worker:1",))
    assert w.at_most() == 6  # as without it: same, 1 worker, its share, mirrored, eager, steps
    asked = play(w, {"same": F, "tasks=1": P, "share:worker:1": F,
                     "share:worker:1+steps=3": F})
    assert asked == ["same", "tasks=1", "share:worker:1", "share:worker:1+steps=3"]
    assert w.finding() is Finding.TASK_DATA
    assert w.verdict() == ("fails on worker:1's share alone: that task's data (or its own code "
                           "path); in your run only worker:1 failed on its own, and with 1 "
                           "worker (as worker:0) it passes")
    assert w.not_tried() == []
    smallest = w.smallest()
    assert smallest is not None and smallest.variant.key == "share:worker:1+steps=3"
    assert w.exportable(smallest).as_task == "worker:1"
    assert smallest.title == "worker:1's share alone, 3 step(s)"


def test_with_three_workers_the_failing_task_runs_alone_without_bisection() -> None:
    w = walk(workers=3, on_its_own=("worker:2",))
    asked = play(w, {"same": F, "tasks=1": P, "share:worker:2": F})
    assert asked == ["same", "tasks=1", "share:worker:2"]  # no tasks=2, no mirrored
    assert w.finding() is Finding.TASK_DATA
    assert w.verdict().startswith("fails on worker:2's share alone: that task's data")
    assert "distributed" not in w.verdict()
    smallest = w.smallest()
    assert smallest is not None and smallest.runs_as == "share:worker:2"
    assert w.exportable(smallest).prelude["as_task"][:2] == ["worker", 2]


def test_the_first_task_in_order_that_failed_on_its_own_runs_alone() -> None:
    """worker:0 released, worker:1 and worker:2 raised: worker:1 (the first) runs alone; a
    task released from a hang never runs alone; with a chief, task 0 is the chief."""
    assert walk(workers=3, on_its_own=("worker:2", "worker:1")).failing_alone() == "worker:1"
    assert walk(workers=3, on_its_own=()).failing_alone() is None
    w = walk(workers=2, chief=1, on_its_own=("worker:0",))
    assert w.failing_alone() == "worker:0"
    play(w, {"same": F, "tasks=1": P, "share:worker:0": F})
    assert w.verdict().endswith("with 1 worker (as chief:0) it passes")
    w = walk(workers=3, on_its_own=("worker:1", "worker:2"))
    play(w, {"same": F, "tasks=1": P, "share:worker:1": F})
    assert "in your run worker:1, worker:2 failed on their own" in w.verdict()


@pytest.mark.parametrize("on_its_own", [("worker:0", "worker:1"), ("worker:0",), ()])
def test_a_failure_of_task_0_or_of_none_on_its_own_is_bisected_as_before(
        on_its_own: tuple[str, ...]) -> None:
    """Both sides of a mismatched collective raise: task 0's identity already ran as 1 worker,
    and nothing runs alone."""
    w = walk(workers=4, on_its_own=on_its_own)
    asked = play(w, {"same": F, "tasks=1": P, "tasks=2": P, "tasks=3": F, "mirrored": P,
                     "tasks=3+eager": F})
    assert asked == ["same", "tasks=1", "tasks=2", "tasks=3", "mirrored", "tasks=3+eager"]
    assert w.finding() is Finding.DISTRIBUTED


def test_a_share_alone_that_passes_goes_on_to_the_distributed_questions() -> None:
    w = walk(workers=3, on_its_own=("worker:1",))
    asked = play(w, {"same": F, "tasks=1": P, "share:worker:1": P, "tasks=2": F, "mirrored": P,
                     "tasks=2+eager": F})
    assert asked == ["same", "tasks=1", "share:worker:1", "tasks=2", "mirrored",
                     "tasks=2+eager"]
    assert w.finding() is Finding.DISTRIBUTED
    assert w.verdict() == ("needs 2 or more workers: a distributed bug (with 1 worker it "
                           "passes; the 3 replicas in one process pass: it is in how the tasks "
                           "work together; worker:1's share alone passes)")
    w = walk(on_its_own=("worker:1",))
    play(w, {"same": F, "tasks=1": P, "share:worker:1": Outcome.OTHER, "mirrored": F})
    assert w.finding() is Finding.PER_REPLICA
    assert "; worker:1's share alone fails differently (no error line))" in w.verdict()


def test_a_walk_stopped_before_the_share_alone_ran_claims_nothing() -> None:
    w = walk(on_its_own=("worker:1",))
    for outcome in (F, P):  # same, 1 worker; then the budget is spent
        variant = w.next()
        assert variant is not None
        w.record([Row(variant, outcome, 1.0)])
    assert w.next() is not None and w.next().key == "share:worker:1"
    w.stopped = "the budget of 30s was spent"
    assert w.finding() is Finding.UNKNOWN
    assert w.verdict().startswith("with 1 worker it passes; worker:1 failed on its own in your "
                                  "run: the next variant, its share alone, did not run")


def test_another_collective_implementation_is_tried_only_with_gpus() -> None:
    """On GPUs AUTO runs RING (TensorFlow picks NCCL only when asked), so the other one is
    NCCL, never RING again; on CPUs the report says why none was tried, from what it saw."""
    answers = {"same": F, "tasks=1": P, "mirrored": P, "same+eager": F, "same+nccl": P}
    w = walk()
    assert "same+nccl" not in play(w, answers)
    assert w.not_tried() == ["another collective implementation was not tried: the tasks "
                             "showed no GPU, and on CPUs AUTO runs RING and NCCL needs GPUs"]
    w = walk(gpus=True)
    assert play(w, answers)[-1] == "same+nccl"
    assert w.finding() is Finding.COLLECTIVE_IMPLEMENTATION
    assert ("passes with implementation=NCCL: the collective implementation AUTO (RING on GPUs)"
            in w.verdict())
    assert w.not_tried() == []
    w = walk(gpus=True)
    w.implementation_used = "ring"
    assert play(w, {**answers, "same+nccl": F})[-1] == "same+nccl"


def test_epochs_are_halved_not_set_to_the_steps_done() -> None:
    """tw.steps_done() counts batches; an ``epochs=`` bound is halved instead."""
    w = walk(bound=6)
    w.bound_counts_steps = False
    asked = play(w, {"same": F, "tasks=1": F, "shares": {"worker:0": P, "worker:1": F},
                     "share:worker:1+steps=3": F})
    assert asked[-1] == "share:worker:1+steps=3"  # 6 // 2, not the 3 steps done (by chance)
    w = walk(bound=10)
    w.bound_counts_steps = False
    assert play(w, {"same": F, "tasks=1": F, "shares": {"worker:0": P, "worker:1": F},
                    "share:worker:1+steps=5": F})[-1] == "share:worker:1+steps=5"


def test_the_progress_count_is_the_longest_path_left() -> None:
    w = walk(bound=8)
    assert w.at_most() == 6  # same, 1 worker, shares, eager, mirrored, fewer steps
    play(w, {"same": P})
    assert w.at_most() == 1


@pytest.mark.parametrize("answers", [
    {"same": F, "tasks=1": P, "share:worker:2": F, "share:worker:2+steps=3": F},
    {"same": F, "tasks=1": P, "share:worker:2": P, "tasks=2": P, "mirrored": P,
     "same+eager": F, "same+steps=3": F},
    {"same": F, "tasks=1": P, "share:worker:2": P, "tasks=2": F, "mirrored": F,
     "mirrored+steps=3": F},
])
def test_the_progress_count_bounds_a_walk_with_a_share_alone(answers: dict[str, object]) -> None:
    """At every step the count is at least the variants the walk ends up running; with 3
    workers and worker:2 failing on its own the longest path is same, 1 worker, worker:2's
    share, 2 workers, mirrored, eager, fewer steps."""
    w = walk(workers=3, bound=8, on_its_own=("worker:2",))
    assert w.at_most() == 7
    counts = []
    while (v := w.next()) is not None:
        counts.append(w.at_most())
        got = answers[v.key]
        assert isinstance(got, Outcome)
        w.record([Row(v, got, 1.0, "ValueError: bad" if got is F else "", steps_done=3)])
    assert all(c >= len(answers) for c in counts), counts
    assert counts == sorted(counts, reverse=True) and w.at_most() == len(answers)


def test_a_hang_ended_by_the_collective_timeout_is_the_same_hang() -> None:
    hang = Failure("hang", "worker:0 stalled", (), 60.0)
    timed = TaskResult("worker:0", "error",
                       error=RemoteError("DeadlineExceededError", "Collective timed out", []))
    assert judge(hang, [timed], timed_out=False)[0] is F
    assert judge(hang, [TaskResult("worker:0", "timeout")], timed_out=True)[0] is F
    other = Failure("ValueError", "", (), 1.0)
    assert judge(other, [TaskResult("worker:0", "timeout")], timed_out=True)[0] is \
        Outcome.TIMEOUT
    assert signature([TaskResult("worker:0", "aborted"),
                      TaskResult("worker:1", "error", error=RemoteError("KeyError", "k", []))]) \
        == ("KeyError", "KeyError: k")


@pytest.mark.parametrize(("code", "value", "edited"), [
    ("for step in range(100):\n    train()\n", 100, "for step in range(7):\n    train()\n"),
    ("STEPS = 50\nfor i in range(STEPS):\n    pass\n", 50,
     "STEPS = 50\nfor i in range(7):\n    pass\n"),
    ("%time x = 1\nfor é in range(20): pass\n", 20, "%time x = 1\nfor é in range(7): pass\n"),
    ("model.fit(ds, epochs=5, steps_per_epoch=30)\n", 5,
     "model.fit(ds, epochs=7, steps_per_epoch=30)\n"),
    ("model.fit(ds, steps_per_epoch=30)\n", 30, "model.fit(ds, steps_per_epoch=7)\n"),
])
def test_the_loop_bound_is_found_and_rewritten(code: str, value: int, edited: str) -> None:
    bound = loop_bound(code)
    assert bound is not None and bound.value == value
    assert with_bound(code, bound, 7) == edited


def test_no_bound_when_the_count_is_not_a_number_here() -> None:
    assert loop_bound("for x in dataset:\n    pass\n") is None
    assert loop_bound("for i in range(n_steps()):\n    pass\n") is None
    assert loop_bound("for i in range(STEPS):\n    pass\n", ["STEPS = 12"]).value == 12


def test_the_prelude_takes_its_settings_as_a_python_literal() -> None:
    template = 'x = 1\nVARIANT = {"strategy": "multi_worker",\n  "as_task": None}\nrest()\n'
    code = prelude_code(template, {"strategy": "local", "eager": True, "as_task": None})
    assert code == ("x = 1\nVARIANT = {'strategy': 'local', 'eager': True, 'as_task': None}\n"
                    "rest()\n")


def test_the_implementation_the_cells_chose_is_read_from_their_code() -> None:
    chose = ("opts = tf.distribute.experimental.CommunicationOptions(\n"
             "    implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)")
    assert implementation_named(["x = 1", chose]) == "nccl"
    assert implementation_named(["strategy = tf.distribute.MultiWorkerMirroredStrategy()"]) \
        is None
    w = walk(gpus=True)
    w.implementation_used = "nccl"
    play(w, {"same": F, "tasks=1": P, "mirrored": P, "same+eager": F, "same+ring": P})
    assert w.finding() is Finding.COLLECTIVE_IMPLEMENTATION
    assert "the collective implementation NCCL" in w.verdict()


OTHER, TIMEOUT = Outcome.OTHER, Outcome.TIMEOUT


@pytest.mark.parametrize(("answers", "finding"), [
    ({"same": OTHER}, Finding.NOT_REPRODUCED),
    ({"same": TIMEOUT}, Finding.NOT_REPRODUCED),
    ({"same": F, "tasks=1": P, "mirrored": F}, Finding.PER_REPLICA),
    ({"same": F, "tasks=1": P, "mirrored": P, "same+eager": P}, Finding.TRACES_DIFFER),
    ({"same": F, "tasks=1": P, "mirrored": P, "same+eager": F}, Finding.DISTRIBUTED),
    ({"same": F, "tasks=1": F, "shares": {"worker:0": P, "worker:1": P},
      "tasks=1+eager": F, "mirrored": F}, Finding.DATA_AS_A_WHOLE),
    ({"same": F, "tasks=1": F, "shares": {"worker:0": P, "worker:1": P},
      "tasks=1+eager": F, "mirrored": P}, Finding.STRATEGY_CODE_PATH),
    ({"same": F, "tasks=1": F, "shares": {"worker:0": P, "worker:1": P},
      "tasks=1+eager": P}, Finding.TRACED_FUNCTION),
])
def test_each_finding_follows_from_the_outcomes_that_support_it(
        answers: dict[str, object], finding: Finding) -> None:
    w = walk()
    play(w, answers)
    assert w.finding() is finding, (w.verdict(), w.rows)
