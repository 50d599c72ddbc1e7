"""What a task that a run left early is told about where it stood (from its stacks), and which
tasks wait in a collective for which. A hang's waiters beyond ``WAITER_STACKS`` are not asked:
their ledgers already say where they wait, and a stack RPC to each of 1,023 waiters cost seconds
(docs/performance.md).
"""

from __future__ import annotations

from tfdist_nb.results import TaskResult, TaskStatus
from tfdist_nb.worker.replies import Stacks, Where

#: a hang's waiters whose stacks are read (every other task left running is read too)
WAITER_STACKS = 16
RESTART = ("Collectives were aborted to release the tasks: restart all tasks (%tfdist_restart) "
           "before training again")


def stack_targets(names: list[str], waiting: set[str] | None) -> list[str]:
    """Whose stacks to read: all of ``names``, or with a hang's ``waiting`` only the first
    ``WAITER_STACKS`` of its waiters."""
    if waiting is None:
        return names
    waiters = [n for n in names if n in waiting]
    return [n for n in names if n not in waiting] + waiters[:WAITER_STACKS]


def who_waits(stacks: dict[str, Stacks | None]) -> str:
    """One line naming the tasks inside a TensorFlow op and those elsewhere (the likely
    cause when the others wait in a collective)."""
    inside = [t for t, s in stacks.items() if s and s["main"]["kind"] == "tensorflow"]
    elsewhere = {t: main_at(s["main"]) for t, s in stacks.items()
                 if s and s["main"]["kind"] in ("python", "idle")}
    if not inside or not elsewhere:
        return ""
    away = "; ".join(f"{t} at {at}" for t, at in elsewhere.items())
    return (f"waiting inside a TensorFlow op (collective): {', '.join(inside)}; elsewhere, "
            f"likely the cause: {away}")


def explain_early(res: TaskResult, stack: Stacks | None, detected: bool,
                  stall_timeout: float | None, skipped: bool = False) -> None:
    """Add where ``res``'s task stood to its explanation; ``detected``: a detector ended the
    run (its collectives were aborted); ``skipped``: a waiter whose stack was not read."""
    if stack is None:
        if skipped and detected:
            said = f"{RESTART}."
            res.explanation = f"{res.explanation}\n{said}" if res.explanation else said
        return
    threads = stack["threads"]
    if res.status is not TaskStatus.ABORTED:  # a released task's report is the culprit's
        res.stack = threads.get("MainThread") or next(iter(threads.values()), None)
    main = stack["main"]
    where = {"tensorflow": "inside a TensorFlow op (a collective, if the others wait too)",
             "python": "running Python code", "idle": "idle"}.get(main.get("kind"), "?")
    said = f"main thread {where} at {main_at(main)}"
    if res.status is TaskStatus.STALLED:
        said = (f"{res.task} made no progress (no step, no output, no CPU of its own) for "
                f"{stall_timeout:.0f}s; {said}")
    if detected:
        said += f". {RESTART}"
    res.explanation = f"{said}." if not res.explanation else f"{res.explanation}\n{said}."


def main_at(main: Where) -> str:
    """The user's line first (``cell 5 line 3``), the innermost frame after it: a frame in
    TensorFlow's own code says where it waits, not which of the user's lines led there."""
    line, at = main.get("line"), main.get("at")
    if line and line != "?" and main.get("kind") != "idle":
        return f"{line} ({at})" if at else str(line)
    return str(at)
