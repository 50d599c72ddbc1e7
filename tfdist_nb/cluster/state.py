"""The task state machine (states: docs/reference.md, Status columns), pure: events in, the
next state out.

Both the controller and the tests drive it without processes; an impossible transition is a bug in
the caller and raises.
"""

from __future__ import annotations

import enum


class TaskState(str, enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    STALLED = "stalled"
    DEAD = "dead"
    RESTARTING = "restarting"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


class TaskEvent(str, enum.Enum):
    READY = "ready"            # kernel answered and the worker agent is loaded
    RUN = "run"                # a cell was sent
    DONE = "done"              # the cell's execute_reply arrived
    NO_PROGRESS = "no_progress"  # a detector found no step, output or CPU for stall_timeout
    PROGRESS = "progress"      # a stalled task moved again
    EXITED = "exited"          # the process is gone without being asked to stop
    RESTART = "restart"
    STOP = "stop"


_S, _E = TaskState, TaskEvent
_TRANSITIONS: dict[tuple[TaskState, TaskEvent], TaskState] = {
    (_S.STARTING, _E.READY): _S.IDLE,
    (_S.IDLE, _E.RUN): _S.BUSY,
    (_S.BUSY, _E.RUN): _S.BUSY,
    (_S.BUSY, _E.DONE): _S.IDLE,
    (_S.IDLE, _E.DONE): _S.IDLE,
    (_S.BUSY, _E.NO_PROGRESS): _S.STALLED,
    (_S.STALLED, _E.PROGRESS): _S.BUSY,
    (_S.STALLED, _E.DONE): _S.IDLE,
    (_S.RESTARTING, _E.READY): _S.IDLE,
}


def next_state(state: TaskState, event: TaskEvent) -> TaskState:
    """The state after ``event``; exits, restarts and stops are accepted from any live state."""
    if event is TaskEvent.STOP:
        return TaskState.STOPPED
    if state is TaskState.STOPPED:
        raise ValueError(f"task is stopped; cannot handle {event.value}")
    if event is TaskEvent.EXITED:
        return TaskState.DEAD
    if event is TaskEvent.RESTART:
        return TaskState.RESTARTING
    try:
        return _TRANSITIONS[(state, event)]
    except KeyError:
        if state is TaskState.DEAD:
            raise ValueError(f"task is dead; restart it before {event.value}") from None
        raise ValueError(f"no transition from {state.value} on {event.value}") from None
