"""The hang rules on ledgers as the tasks report them (pure): what each rule says."""

from __future__ import annotations

import time

import pytest

from tfdist_nb.diagnostics.hangs import judge
from tfdist_nb.results import Hang
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


def startup(state: str = "entered", members: tuple[str, ...] = ("worker:1",)) -> dict:
    """The wait inside MultiWorkerMirroredStrategy() as the worker's ledger reports it."""
    return {"seq": 1, "index": None, "group": None, "kind": "startup", "dtype": "",
            "shape": None, "function": "MultiWorkerMirroredStrategy", "where": "cell 2 line 3",
            "state": state, "entered": 100.0, "group_size": 2, "members": list(members),
            "check": "tfdist/startup/0"}


def test_a_task_that_raised_before_its_strategy_is_named_by_the_one_waiting_in_its_start_up(
        ) -> None:
    from tfdist_nb.diagnostics.hangs import Ended

    busy = {"worker:0": ledger(startup())}
    ended = {"worker:1": Ended("worker:1", "error", "ValueError: no data", "cell 2 line 2")}
    ledgers = {**busy, "worker:1": ledger()}
    hang = judge(ended, busy, ledgers, {"worker:0", "worker:1"}, set(), {}, now=103.0)
    assert hang is not None and (hang.rule, hang.culprit) == ("failed", "worker:1")
    assert hang.cause == (
        "worker:1 failed (ValueError: no data) at cell 2 line 2 while worker:0 waited for it in "
        "the start-up of MultiWorkerMirroredStrategy (every task of TF_CONFIG connects before "
        "it returns) at cell 2 line 3, which worker:1 never reached")
    assert hang.waiting["worker:0"].endswith("(waited 3.0s)")


def test_a_task_that_finished_without_a_strategy_is_named_and_told_to_make_one() -> None:
    from tfdist_nb.diagnostics.hangs import Ended

    busy = {"worker:0": ledger(startup())}
    ledgers = {**busy, "worker:1": ledger()}
    hang = judge({"worker:1": Ended("worker:1", "ok")}, busy, ledgers,
                 {"worker:0", "worker:1"}, set(), {}, now=101.0)
    assert hang is not None and (hang.rule, hang.culprit) == ("finished", "worker:1")
    assert "which worker:1 never made" in hang.cause
    assert "every task of TF_CONFIG must make the MultiWorkerMirroredStrategy" in hang.advice


def test_a_task_whose_strategy_is_made_is_no_culprit_of_the_others_start_up() -> None:
    """worker:1 made its strategy (its row done) and then failed: worker:0's start-up
    completes (its own row is a sample behind), so no rule speaks of the start-up."""
    from tfdist_nb.diagnostics.hangs import Ended

    busy = {"worker:0": ledger(startup())}
    ledgers = {**busy, "worker:1": ledger(startup("done", ("worker:0",)))}
    ended = {"worker:1": Ended("worker:1", "error", "ValueError: later", "cell 2 line 9")}
    assert judge(ended, busy, ledgers, {"worker:0", "worker:1"}, set(), {}, now=101.0) is None


def test_a_crashed_task_given_as_a_word_is_crashed_for_the_rules() -> None:
    """``Ended`` takes a status word as ``TaskResult`` does; the rules compare members."""
    from tfdist_nb.diagnostics.hangs import Ended
    from tfdist_nb.results import TaskStatus

    assert Ended("worker:1", "crashed").status is TaskStatus.CRASHED
    with pytest.raises(ValueError):
        Ended("worker:1", "exploded")
    busy = {"worker:0": ledger(startup())}
    ledgers = {**busy, "worker:1": ledger(startup("done", ("worker:0",)))}
    ended = {"worker:1": Ended("worker:1", "crashed", "killed by SIGKILL")}
    hang = judge(ended, busy, ledgers, {"worker:0", "worker:1"}, set(), {}, now=101.0)
    # crashed: the start-up it completed counts for nothing, its process is gone
    assert hang is not None and hang.cause.startswith("worker:1 crashed (killed by SIGKILL)")


def test_the_waiters_of_a_large_cluster_are_named_in_task_order() -> None:
    """worker:2 before worker:10 (not as strings sort them), in the cause and the fields."""
    from tfdist_nb.diagnostics.hangs import Ended

    members = {f"worker:{i}" for i in range(11)}
    row = {**all_reduce(0, 3), "group_size": len(members)}  # every worker's all-reduce
    busy = {name: ledger(row) for name in ("worker:10", "worker:2")}
    ledgers = {**busy, "worker:1": ledger()}
    ended = {"worker:1": Ended("worker:1", "error", "ValueError: bad", "cell 2 line 1")}
    hang = judge(ended, busy, ledgers, members, set(), {}, now=101.0)
    assert hang is not None and hang.waiters == ["worker:2", "worker:10"]
    assert list(hang.waited_in) == ["worker:2", "worker:10"]
    assert "while worker:2, worker:10 waited in a collective" in hang.cause


# Released because of a culprit (docs/reference.md, "Collectives and hangs"): at 8 tasks and
# more TensorFlow's own abort reaches most waiters before their rows reach the rules.
EIGHT = {f"worker:{i}" for i in range(8)}
CULPRIT_ERROR = "ValueError: worker 3 gives up"
UNAVAILABLE = "UnavailableError: [[{{node CollectiveReduceV2}}]] [Op:__inference_total_29]"


def eight_worker_hang() -> tuple[Hang, dict[str, LedgerView]]:
    """worker:3 raised after the first of two all-reduces; only worker:4's row of the second
    reached the rules before they spoke."""
    from tfdist_nb.diagnostics.hangs import Ended

    first = {**all_reduce(0, 1, "done"), "group_size": 8}
    second = {**all_reduce(1, 1, "aborted"), "group_size": 8, "done": 101.0}
    ledgers = {name: ledger(first, second) for name in EIGHT - {"worker:3", "worker:4"}}
    ledgers["worker:3"] = ledger(first)
    busy = {"worker:4": ledger(first, {**second, "state": "entered", "done": None})}
    ended = {"worker:3": Ended("worker:3", "error", CULPRIT_ERROR, "cell 1 line 8")}
    hang = judge(ended, busy, {**ledgers, **busy}, EIGHT, set(), {}, now=101.0)
    assert hang is not None and hang.waiters == ["worker:4"]
    return hang, ledgers


def results_of(statuses: dict[str, tuple[str, str]]) -> dict:
    from tfdist_nb.results import RemoteError, TaskResult

    return {name: TaskResult(name, status, error=RemoteError(*error.split(": ", 1), []))
            for name, (status, error) in statuses.items()}


def test_waiters_that_tensorflow_released_before_the_rules_are_aborted_naming_the_culprit(
        ) -> None:
    from tfdist_nb.diagnostics.hangs import release_waiters

    hang, ledgers = eight_worker_hang()
    results = results_of({"worker:3": ("error", CULPRIT_ERROR),
                          **{f"worker:{i}": ("error" if i < 3 else "interrupted", UNAVAILABLE)
                             for i in (0, 1, 2, 4, 5, 6, 7)}})
    unsure = release_waiters(hang, results, lambda n: ledgers[n].recent() if n in ledgers
                             else [], ledgers["worker:3"], EIGHT, set(), now=102.0)
    assert not unsure
    assert results["worker:3"].status == "error"
    waiters = [f"worker:{i}" for i in (0, 1, 2, 4, 5, 6, 7)]
    assert {results[w].status for w in waiters} == {"aborted"}
    assert hang.waiters == waiters  # in task order, every one of them
    assert {w: c.position for w, c in hang.waited_in.items()} == dict.fromkeys(waiters, 2)
    assert hang.cause.startswith(f"worker:3 failed ({CULPRIT_ERROR}) at cell 1 line 8 while "
                                 f"{', '.join(waiters)} waited in a collective that worker:3 "
                                 "never entered: all_reduce float32[1] #2")
    for w in waiters:
        said = results[w].explanation or ""
        assert said.startswith(hang.cause) and f"{w} was released from all_reduce" in said
        assert "TensorFlow raised UnavailableError" in said
        assert results[w].error.ename == "UnavailableError"  # what TensorFlow raised, kept


def test_a_genuine_error_beside_a_hang_stays_the_tasks_own() -> None:
    """A task's own error is not relabelled: another kind of error, or a released one in a
    collective the culprit completed (not the culprit's doing; the rows may yet change, so
    the caller is told to look again); the culprit stays 'error'; an interrupt without a row
    in the culprit's collective is the interrupt it was."""
    from tfdist_nb.diagnostics.hangs import release_waiters

    hang, ledgers = eight_worker_hang()
    completed = ledger({**all_reduce(0, 1, "aborted"), "group_size": 8, "done": 100.5})
    rows = {**ledgers, "worker:0": completed}
    results = results_of({"worker:3": ("error", CULPRIT_ERROR),
                          "worker:0": ("error", UNAVAILABLE),
                          "worker:1": ("error", "ValueError: my own bug"),
                          "worker:2": ("interrupted", "KeyboardInterrupt: "),
                          "worker:5": ("interrupted", UNAVAILABLE)})
    unsure = release_waiters(hang, results, lambda n: rows[n].recent() if n != "worker:2"
                             else [], ledgers["worker:3"], EIGHT, {"worker:2", "worker:5"},
                             now=102.0)
    assert unsure  # worker:0's error is of the released kind: its rows may still come
    assert [results[w].status for w in ("worker:3", "worker:0", "worker:1", "worker:2")] == [
        "error", "error", "error", "interrupted"]
    assert results["worker:5"].status == "aborted"  # the controller's abort released it
    assert hang.waiters == ["worker:4", "worker:5"]


def test_a_task_released_by_a_peers_abort_is_not_named_the_culprit() -> None:
    """worker:0's UnavailableError came first; worker:3's ValueError is the cause."""
    from tfdist_nb.diagnostics.hangs import Ended

    _, ledgers = eight_worker_hang()
    busy = {"worker:4": ledger({**all_reduce(0, 1, "done"), "group_size": 8},
                               {**all_reduce(1, 1), "group_size": 8})}
    ended = {"worker:0": Ended("worker:0", "error", UNAVAILABLE, "cell 1 line 9"),
             "worker:3": Ended("worker:3", "error", CULPRIT_ERROR, "cell 1 line 8")}
    hang = judge(ended, busy, {**ledgers, **busy}, EIGHT, set(), {}, now=101.0)
    assert hang is not None and hang.culprit == "worker:3"


def test_a_strategy_made_again_counts_its_collectives_anew_so_a_failure_before_one_is_named(
        ) -> None:
    """The first strategy's cell left worker:0 one collective ahead (released in one that
    worker:1 never entered). A strategy made again in the same processes pairs collectives
    from the first again (TensorFlow's instance keys are per strategy), and so do the ledgers:
    worker:0 failing before its third all-reduce under the new strategy is named while
    worker:1 waits in it; its older rows of the same position are not taken for its side."""
    from tfdist_nb.diagnostics.hangs import Ended
    from tfdist_nb.worker.ledger import Ledger, Op

    op = Op("all_reduce", 2, 1, "float32", (), 4, "cell 3 line 4")
    tasks = {"worker:0": Ledger(), "worker:1": Ledger()}
    for _ in range(3):
        for task in tasks.values():
            task.close(task.enter([op], "eager"))
    tasks["worker:0"].close(tasks["worker:0"].enter([op], "eager"), "aborted")
    for task in tasks.values():
        task.new_strategy()
        for _ in range(2):
            task.close(task.enter([op], "eager"))
    tasks["worker:1"].enter([op], "eager")  # waits: worker:0 raised before it
    views = {name: LedgerView() for name in tasks}
    for name, task in tasks.items():
        views[name].update(task.drain() or {})
    ended = {"worker:0": Ended("worker:0", "error", "ValueError: bad batch", "cell 3 line 3")}
    hang = judge(ended, {"worker:1": views["worker:1"]}, views, set(tasks), set(), {},
                 now=time.time())
    assert hang is not None and (hang.rule, hang.culprit) == ("failed", "worker:0")
    assert "in a collective that worker:0 never entered: all_reduce" in hang.cause, hang.cause
    assert "#3 eagerly at cell 3 line 4" in hang.cause, hang.cause
    # under the first strategy the positions are as before: worker:1's 4th, never entered
    assert [r.get("index") for r in views["worker:1"].recent() if not r.get("strategy")] == [
        0, 1, 2]
