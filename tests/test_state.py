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


def test_dead_task_cannot_run() -> None:
    with pytest.raises(ValueError, match="dead; restart"):
        next_state(S.DEAD, E.RUN)


def test_stopped_is_final() -> None:
    with pytest.raises(ValueError, match="stopped"):
        next_state(S.STOPPED, E.READY)
    assert next_state(S.STOPPED, E.STOP) is S.STOPPED
