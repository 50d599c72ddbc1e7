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


def test_every_state_answers_every_event() -> None:
    """Total: no combination is an internal error; observations that do not apply (a late
    reply, progress of a task that is not stalled) leave the state as it is."""
    for state in S:
        for event in E:
            if event is E.RUN and state in (S.DEAD, S.STALLED, S.STARTING, S.RESTARTING,
                                            S.STOPPED):
                continue  # refused with advice (above)
            assert isinstance(next_state(state, event), S)
    assert next_state(S.IDLE, E.PROGRESS) is S.IDLE
    assert next_state(S.DEAD, E.DONE) is S.DEAD
    assert next_state(S.STOPPED, E.READY) is S.STOPPED
    assert next_state(S.STOPPED, E.STOP) is S.STOPPED
