"""The task state machine (pure)."""

from __future__ import annotations

import pytest

from tfdist_nb.cluster.state import TaskEvent as E
from tfdist_nb.cluster.state import TaskState as S
from tfdist_nb.cluster.state import next_state


def test_normal_life() -> None:
    s = S.STARTING
    for event, expected in [(E.READY, S.IDLE), (E.RUN, S.BUSY), (E.DONE, S.IDLE),
                            (E.RUN, S.BUSY), (E.NO_PROGRESS, S.STALLED), (E.PROGRESS, S.BUSY),
                            (E.EXITED, S.DEAD), (E.RESTART, S.RESTARTING), (E.READY, S.IDLE),
                            (E.STOP, S.STOPPED)]:
        s = next_state(s, event)
        assert s is expected


def test_a_task_that_cannot_run_a_cell_refuses_it_with_advice() -> None:
    from tfdist_nb.cluster.state import CannotRun

    for state, advice in [(S.DEAD, "%tfdist_restart"), (S.STALLED, "%tfdist_interrupt"),
                          (S.STARTING, "in a moment"), (S.STOPPED, "%%tfcluster SPEC")]:
        with pytest.raises(CannotRun, match=advice):
            next_state(state, E.RUN)


def test_a_cell_that_asks_for_input_is_at_a_prompt_until_answered() -> None:
    """docs/reference.md, Input from the tasks: ``prompt`` while its cell waits for a line."""
    from tfdist_nb.cluster.state import CannotRun

    s = next_state(S.BUSY, E.PROMPTED)
    assert s is S.PROMPT
    assert next_state(s, E.NO_PROGRESS) is S.PROMPT  # a person is asked: never stalled
    with pytest.raises(CannotRun, match="input prompt"):
        next_state(s, E.RUN)
    assert next_state(s, E.ANSWERED) is S.BUSY
    assert next_state(s, E.DONE) is S.IDLE  # interrupted at the prompt, the cell ended
    assert next_state(S.STALLED, E.PROMPTED) is S.PROMPT
    assert next_state(S.IDLE, E.ANSWERED) is S.IDLE  # a late answer changes nothing


def test_every_state_answers_every_event() -> None:
    """Total: no combination is an internal error; observations that do not apply (a late
    reply, progress of a task that is not stalled) leave the state as it is."""
    for state in S:
        for event in E:
            if event is E.RUN and state in (S.DEAD, S.STALLED, S.PROMPT, S.STARTING,
                                            S.RESTARTING, S.STOPPED):
                continue  # refused with advice (above)
            assert isinstance(next_state(state, event), S)
    assert next_state(S.IDLE, E.PROGRESS) is S.IDLE
    assert next_state(S.DEAD, E.DONE) is S.DEAD
    assert next_state(S.STOPPED, E.READY) is S.STOPPED
    assert next_state(S.STOPPED, E.STOP) is S.STOPPED


def test_a_task_in_a_collective_while_a_peer_is_at_a_prompt_waits_for_it() -> None:
    """``waits-for-prompt`` (docs/reference.md, Input from the tasks): a busy task inside a
    collective while a chief or worker of the group waits at an input prompt."""
    from tfdist_nb.cluster.task import TaskRuntime
    from tfdist_nb.cluster.views import status_frame, waiting_for_prompt
    from tfdist_nb.store.tails import LiveStore
    from tfdist_nb.topology import TaskId

    tasks = [TaskRuntime(TaskId("worker", i), f"localhost:{2000 + i}", "{}", {})
             for i in range(3)]
    live = LiveStore()
    for rt, state in zip(tasks, (S.BUSY, S.PROMPT, S.BUSY), strict=True):
        rt.state = state
    assert waiting_for_prompt(tasks, live) == {}  # nobody is inside a collective yet
    live.view("worker:0").ledger.update({"issued": 1, "rows": [
        {"seq": 1, "kind": "all_reduce", "group": "g", "index": 0, "state": "entered"}]})
    assert waiting_for_prompt(tasks, live) == {"worker:0": ["worker:1"]}
    flags = dict(zip(*[status_frame(tasks, live, ())[c] for c in ("task", "flags")],
                     strict=True))
    assert flags == {"worker:0": "waits-for-prompt", "worker:1": "", "worker:2": ""}
    tasks[1].state = S.BUSY  # answered
    assert waiting_for_prompt(tasks, live) == {}
