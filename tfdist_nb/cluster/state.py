"""The task state machine (states: docs/reference.md, Status columns), pure: events in, the
next state out. It is total, so a cell sent to a task that cannot run it is refused with advice
(``CannotRun``), never an internal error.
"""

from __future__ import annotations

from tfdist_nb.errors import TfdistError
from tfdist_nb.strenum import StrEnum


class TaskState(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    PROMPT = "prompt"  # busy, and its cell waits for a line of input (input(), getpass, pdb)
    STALLED = "stalled"
    DEAD = "dead"
    RESTARTING = "restarting"
    STOPPED = "stopped"


class TaskEvent(StrEnum):
    READY = "ready"            # kernel answered and the worker agent is loaded
    RUN = "run"                # a cell was sent
    DONE = "done"              # the cell's execute_reply arrived
    NO_PROGRESS = "no_progress"  # a detector found no step, output or CPU for stall_timeout
    PROGRESS = "progress"      # a stalled task moved again
    PROMPTED = "prompted"      # its cell asks for input (an input_request arrived)
    ANSWERED = "answered"      # the answer went back to it
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
    (_S.BUSY, _E.PROMPTED): _S.PROMPT,
    (_S.STALLED, _E.PROMPTED): _S.PROMPT,
    (_S.PROMPT, _E.ANSWERED): _S.BUSY,
    (_S.PROMPT, _E.DONE): _S.IDLE,
    (_S.RESTARTING, _E.READY): _S.IDLE,
}


# What a task in each state says when asked to run a cell it cannot run (the refusal's advice)
_CANNOT_RUN = {
    _S.DEAD: "it is dead; bring it back with %tfdist_restart",
    _S.STALLED: ("it is still in an earlier cell that did not answer the interrupt (stalled); "
                 "%tfdist_interrupt it, or %tfdist_restart it"),
    _S.PROMPT: ("it waits at an input prompt of a cell still running; answer it, or "
                "%tfdist_interrupt it"),
    _S.STARTING: "it is still starting; run the cell again in a moment",
    _S.RESTARTING: "it is restarting; run the cell again in a moment",
    _S.STOPPED: "the cluster was stopped; start one with %%tfcluster SPEC",
}


class CannotRun(TfdistError, ValueError):
    """A task asked to run a cell in a state that cannot (the message says what to do)."""


def next_state(state: TaskState, event: TaskEvent) -> TaskState:
    """The state after ``event``; total: every state answers every event. Exits, restarts and
    stops are accepted from any live state; a cell sent to a task that cannot run it is a
    ``CannotRun`` naming why and what to do; an observation that does not apply (a late reply,
    progress of a task not stalled) leaves the state as it is."""
    if event is TaskEvent.STOP:
        return TaskState.STOPPED
    if event is TaskEvent.RUN and state in _CANNOT_RUN:
        raise CannotRun(_CANNOT_RUN[state])
    if state is TaskState.STOPPED:
        return state  # final: whatever arrives late
    if event is TaskEvent.EXITED:
        return TaskState.DEAD
    if event is TaskEvent.RESTART:
        return TaskState.RESTARTING
    return _TRANSITIONS.get((state, event), state)
