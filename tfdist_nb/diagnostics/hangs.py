"""The hang rules (pure): from the tasks' collective ledgers, name a hang the moment it is certain
(docs/reference.md, "Collectives and hangs": failed, finished, absent, diverged).

A collective completes only when every task of its group enters it, so these hangs are facts
long before any timeout. Rows are paired by group and position (``index``), as TensorFlow pairs
collectives across tasks. A rule speaks only when the ledgers prove the hang, so a healthy run,
however slow, stays silent; the stall detector covers the rest.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from tfdist_nb.events import describe_tensor
from tfdist_nb.ledger_runs import BARRIER_KINDS, RELEASED_ERRORS, LedgerRow, pair_key
from tfdist_nb.results import Collective, Hang, HangRule, LikelyCause, TaskResult, TaskStatus
from tfdist_nb.topology import task_order


class LedgerView(Protocol):
    """One task's ledger as the controller keeps it (``store/collectives.py``); the rules read
    it through these calls only, so they stay pure and below the store."""

    issued: int

    def at(self, key: str, index: int) -> LedgerRow | None: ...
    def checked(self, key: str | None) -> LedgerRow | None: ...
    def count(self, key: str) -> int: ...
    def recent(self, last: int | None = None) -> list[LedgerRow]: ...
    def current(self) -> LedgerRow | None: ...
    def open_rows(self) -> list[LedgerRow]: ...


@dataclass(frozen=True)
class Ended:
    """A task whose cell ended: its status (ok, error, crashed) and, if it failed, why."""

    task: str
    status: TaskStatus
    error: str | None = None
    where: str | None = None  # the line that raised, "cell N line L"
    steps: int = 0

    def __post_init__(self) -> None:
        # a plain "ok" is taken, as TaskResult takes it; an unknown word is not
        object.__setattr__(self, "status", TaskStatus(self.status))


def collective(row: LedgerRow) -> Collective:
    """A ledger row as the typed ``Collective`` a ``Hang`` carries."""
    index = row.get("index")
    return Collective(kind=str(row.get("kind")),
                      tensor=describe_tensor(row.get("dtype", "?"), row.get("shape"))
                      if row.get("kind") not in BARRIER_KINDS else "",
                      position=None if index is None else int(index) + 1,
                      function=str(row.get("function")), where=str(row.get("where")),
                      called_at=row.get("called_at") or None)


#: what each waiter waited in: in words (with how long), and typed
_Waits = tuple[dict[str, str], dict[str, Collective]]


def _waits(rows: Mapping[str, LedgerRow], now: float) -> _Waits:
    """What each waiter (task -> the row it waits in) waited in: in words (with how long), and
    typed; in task order."""
    order = sorted(rows, key=task_order)
    return ({w: _waited(rows[w], now) for w in order}, {w: collective(rows[w]) for w in order})


def describe_row(row: LedgerRow) -> str:
    """``all_reduce float32[3] #5 in 'step' at cell 3 line 9``."""
    if row.get("kind") == "check":
        return (f"the check that tf.function '{row.get('function')}' issues the same "
                f"collectives on every task, before its first run, at {row.get('where')}")
    if row.get("kind") == "startup":
        return (f"the start-up of {row.get('function')} (every task of TF_CONFIG connects "
                f"before it returns) at {row.get('where')}")
    fn = row.get("function")
    inside = "eagerly" if fn == "eager" else f"in '{fn}'"
    index = row.get("index")
    pos = f" #{index + 1}" if index is not None else ""
    called = row.get("called_at")
    via = f", called at {called}" if called and called != row.get("where") else ""
    return (f"{row.get('kind')} {describe_tensor(row.get('dtype', '?'), row.get('shape'))}{pos} "
            f"{inside} at {row.get('where')}{via}")


def judge(ended: dict[str, Ended], busy: Mapping[str, LedgerView],
          ledgers: Mapping[str, LedgerView], members: set[str], absent: set[str],
          steps: dict[str, int], now: float) -> Hang | None:
    """The first rule the ledgers prove, or None.

    ``busy``: the tasks still running the cell; ``ledgers``: every task's; ``members``: the
    tasks MWMS groups together (chief and workers); ``absent``: members not running this cell.
    """
    found = (_failed_or_finished(ended, busy, ledgers, members, steps, now)
             or _absent(busy, ledgers, members, absent, now) or _diverged(busy, now))
    if found is not None:
        found.frozen = {w for w in found.waiting if w in busy and any(
            r.get("kind") == "startup" for r in busy[w].open_rows())}
    return found


def _needs(row: LedgerRow, task: str, ledger: LedgerView | None, members: set[str]) -> bool:
    """Whether ``row`` (another task's open collective) cannot complete without ``task``."""
    if row.get("kind") in BARRIER_KINDS:
        return task in (row.get("members") or ())
    if ledger is not None and ledger.count(pair_key(row)) > 0:
        return True
    return task in members and (row.get("group_size") or 0) >= len(members) > 1


def _never_entered(row: LedgerRow, ledger: LedgerView | None) -> str | None:
    """How the ended task stands to ``row``: None if it completed its side (the other's done
    is merely not reported yet), else 'never entered' or 'entered and failed'."""
    if row.get("kind") in BARRIER_KINDS:
        # done on the ended task: it published its manifest (connected), so the waiter's wait
        # completes (its own row here may be a sample behind)
        mine = ledger.checked(row.get("check")) if ledger is not None else None
        if mine is not None and mine.get("state") == "done":
            return None
        return "never reached"
    if ledger is None:
        return "never entered"
    index = row.get("index")
    if index is None or index >= ledger.count(pair_key(row)):
        return "never entered"
    mine = ledger.at(pair_key(row), index)
    if mine is not None and mine.get("state") in ("failed", "aborted"):
        return "entered and failed in"
    return None


def _failed_or_finished(ended: dict[str, Ended], busy: Mapping[str, LedgerView],
                        ledgers: Mapping[str, LedgerView], members: set[str],
                        steps: dict[str, int], now: float) -> Hang | None:
    # a task that ended with what a released collective raises was released (by a peer's
    # abort or death), not the cause: the others are judged first
    for name, end in sorted(ended.items(), key=lambda kv: released_error(kv[1].error)):
        ledger = ledgers.get(name)
        stuck: dict[str, tuple[LedgerRow, str]] = {}
        for waiter, view in busy.items():
            for row in view.open_rows():
                if not _needs(row, name, ledger, members):
                    continue
                how = (_never_entered(row, ledger) if end.status is not TaskStatus.CRASHED
                       else "never entered")
                if how is not None:
                    stuck[waiter] = (row, how)
                    break
        if not stuck:
            continue
        waiters = sorted(stuck, key=task_order)
        waits = _waits({w: r for w, (r, _) in stuck.items()}, now)
        if end.status in (TaskStatus.ERROR, TaskStatus.CRASHED):
            return _failed(end, waiters, stuck[waiters[0]], ledgers, waits)
        return _finished(end, waiters, stuck[waiters[0]][0], ledgers, steps, waits)
    return None


def _waited(row: LedgerRow, now: float) -> str:
    return f"{describe_row(row)} (waited {max(0.0, now - row.get('entered', now)):.1f}s)"


def released_error(error: str | None, interrupt: bool = False) -> bool:
    """Whether ``error`` (``ename: text``) is what a released collective raises (with
    ``interrupt``: or the interrupt that follows the controller's abort)."""
    name = (error or "").split(":", 1)[0]
    return name in RELEASED_ERRORS or (interrupt and name == "KeyboardInterrupt")


def released_from(hang: Hang, task: str, error: str | None, rows: list[LedgerRow],
                  culprit: LedgerView | None, culprit_crashed: bool, members: set[str],
                  aborted: bool, now: float) -> tuple[str, Collective | None] | None:
    """What ``task`` was released from because of ``hang``'s culprit (in words, and the
    collective when its row tells), or None (docs/reference.md, "The hang rules"): a waiter the
    rules named, or a task that raised what a released collective raises (``error``) in a
    collective of ``rows`` (this cell's) that the culprit never entered or failed in, whether
    TensorFlow or the controller's abort came first. ``aborted``: the controller aborted its
    collectives for the culprit, so such an error is the abort's even without a row (one not
    yet sent); a KeyboardInterrupt (which follows the abort) counts only with a row."""
    if task == hang.culprit:
        return None
    if task in hang.waiting:
        return hang.waiting[task], hang.waited_in.get(task)
    if not released_error(error, interrupt=True):
        return None
    for row in reversed(rows):
        if row.get("state") in ("entered", "aborted") and _needs(
                row, hang.culprit, culprit, members) and (
                culprit_crashed or _never_entered(row, culprit) is not None):
            return _waited(row, row.get("done") or now), collective(row)
    if aborted and released_error(error):
        return "the collective the others waited in", None
    return None


def release_waiters(hang: Hang, results: Mapping[str, TaskResult],
                    rows: Callable[[str], list[LedgerRow]], culprit: LedgerView | None,
                    members: set[str], aborted: set[str], now: float) -> bool:
    """Mark ``aborted`` every task of ``results`` that ``released_from`` finds released by the
    hang's culprit, as a waiter with the culprit's explanation (its ``error`` keeps what
    TensorFlow raised). True while a task that raised what a released collective raises is not
    found released: its ledger rows may still be on their way."""
    crashed = hang.culprit in results and results[hang.culprit].status is TaskStatus.CRASHED
    unsure, before = False, ", ".join(hang.waiters)
    for name, r in results.items():
        if r.status not in (TaskStatus.ERROR, TaskStatus.INTERRUPTED) or r.error is None:
            continue
        found = released_from(hang, name, str(r.error), rows(name), culprit, crashed, members,
                              name in aborted, now)
        if found is None:
            unsure = unsure or (name != hang.culprit
                                and released_error(str(r.error), interrupt=True))
            continue
        r.status = TaskStatus.ABORTED
        hang.waiting.setdefault(name, found[0])
        if found[1] is not None:
            hang.waited_in.setdefault(name, found[1])
    hang.waiting = dict(sorted(hang.waiting.items(), key=lambda kv: task_order(kv[0])))
    hang.waited_in = dict(sorted(hang.waited_in.items(), key=lambda kv: task_order(kv[0])))
    # the cause names every waiter, those found only now too (rules failed and finished)
    hang.cause = hang.cause.replace(f"while {before} waited",
                                    f"while {', '.join(hang.waiters)} waited", 1)
    for r in results.values():
        if r.status is TaskStatus.ABORTED:
            r.explanation = hang_said(hang, r)
    return unsure


def hang_said(hang: Hang, r: TaskResult) -> str:
    """The hang's explanation for ``r``'s task; for a released one, what TensorFlow raised in
    it on the way out."""
    said = hang.explanation(r.task)
    if r.status is TaskStatus.ABORTED and r.error is not None:
        said += f" TensorFlow raised {r.error.short(120)} in it as it was released."
    return said


def _failed(end: Ended, waiters: list[str], stuck: tuple[LedgerRow, str],
            ledgers: Mapping[str, LedgerView], waits: _Waits) -> Hang:
    how = "crashed" if end.status is TaskStatus.CRASHED else "failed"
    what = f" ({end.error})" if end.error else ""
    at = f" at {end.where}" if end.where else ""
    row, entered = stuck
    head = f"{end.task} {how}{what}{at} while {', '.join(waiters)} waited"
    cause = (f"{head} for it in {describe_row(row)}, which {end.task} {entered}"
             if row.get("kind") in BARRIER_KINDS else
             f"{head} in a collective that {end.task} {entered}: {describe_row(row)}")
    theirs = ledgers.get(end.task)
    index = row.get("index")
    mine = theirs.at(pair_key(row), index) if theirs and index is not None else None
    likely, advice = (LikelyCause.CULPRIT_ERROR,
                      f"fix {end.task}'s error; the other tasks only waited for it")
    if mine is not None and not _same(mine, row):
        likely = LikelyCause.SHAPE_PER_TASK
        advice = (f"the tensors differ: {waiters[0]} "
                  f"{describe_tensor(row.get('dtype', '?'), row.get('shape'))} at "
                  f"{row.get('where')}, {end.task} "
                  f"{describe_tensor(mine.get('dtype', '?'), mine.get('shape'))} at "
                  f"{mine.get('where')}: a shape that depends on the task (a per-task batch "
                  "size or data); every task must reduce tensors of the same shape")
    return Hang(HangRule.FAILED, end.task, cause, waits[0], advice, likely, waits[1],
                culprit_error=end.error, culprit_at=end.where,
                culprit_in=collective(mine) if mine is not None else None)


def _finished(end: Ended, waiters: list[str], row: LedgerRow,
              ledgers: Mapping[str, LedgerView], steps: dict[str, int], waits: _Waits) -> Hang:
    key = pair_key(row)
    waiting, waited_in = waits
    if row.get("kind") == "check":
        cause = (f"{end.task} finished the cell while {', '.join(waiters)} waited for it to "
                 f"reach tf.function '{row.get('function')}' at {row.get('where')}, which "
                 f"{end.task} never ran")
        return Hang(HangRule.FINISHED, end.task, cause, waiting,
                    f"a call made on some tasks only: every task must run "
                    f"'{row.get('function')}'", LikelyCause.FUNCTION_ON_SOME_TASKS, waited_in)
    if row.get("kind") == "startup":
        cause = (f"{end.task} finished the cell while {', '.join(waiters)} waited for it in "
                 f"{describe_row(row)}, which {end.task} never made")
        return Hang(HangRule.FINISHED, end.task, cause, waiting,
                    f"a strategy made on some tasks only (a branch on the task, an early "
                    f"return): every task of TF_CONFIG must make the {row.get('function')}",
                    LikelyCause.STRATEGY_ON_SOME_TASKS, waited_in)
    tasks = [end.task, *waiters]
    counts = {t: ledgers[t].count(key) if t in ledgers else 0 for t in tasks}
    how_far = ", ".join(f"{t} {steps.get(t, 0)} step(s) and {counts[t]} collective(s)"
                        for t in tasks)
    cause = (f"{end.task} finished the cell while {', '.join(waiters)} waited in "
             f"{describe_row(row)}, which {end.task} never entered; so far {how_far}")
    lines = _lines_that_differ(tasks, ledgers, key)
    likely, advice = _advice_for_uneven(end.task, waiters[0], steps, lines)
    if lines:
        cause += "; collectives per line: " + "; ".join(
            f"{where}: " + ", ".join(f"{t} {n}" for t, n in per.items())
            for where, per in lines[:3])
    return Hang(HangRule.FINISHED, end.task, cause, waiting, advice, likely, waited_in,
                steps={t: steps.get(t, 0) for t in tasks}, issued=counts, per_line=dict(lines))


def _lines_that_differ(tasks: list[str], ledgers: Mapping[str, LedgerView],
                       key: str) -> list[tuple[str, dict[str, int]]]:
    """The lines whose collectives (of ``key``, a ``pair_key``, in the rows still kept) ran
    a different number of times on different tasks, with the count per task; a traced function's
    collectives count at the line that called it (the same traced line serves every call)."""
    per_line: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for t in tasks:
        if t not in ledgers:
            continue
        for r in ledgers[t].recent():
            if r.get("index") is not None and pair_key(r) == key:
                line = r.get("called_at") or r["where"]
                per_line[line][t] = per_line[line].get(t, 0) + 1
    full = {where: {t: per.get(t, 0) for t in tasks} for where, per in per_line.items()}
    return [(where, per) for where, per in full.items() if len(set(per.values())) > 1]


def _advice_for_uneven(done: str, waiter: str, steps: dict[str, int],
                       lines: list[tuple[str, dict[str, int]]]) -> tuple[LikelyCause, str]:
    """What usually causes what was seen: collectives made at lines the finished task never
    ran (a call made on some tasks only), or the same lines run more often on the waiting task
    (a loop of another length: uneven data)."""
    only_waiter = [w for w, per in lines if per.get(done, 0) == 0]
    if only_waiter:
        return LikelyCause.CALL_ON_SOME_TASKS, (
            f"{waiter} made collectives at {', '.join(only_waiter[:3])} that {done} never "
            "made: a call made on some tasks only (a chief-only model.save, evaluate or "
            "checkpoint write issues collectives too); every task must make it (the "
            "non-chief tasks saving to a temporary path)")
    ran = (f"{done} {steps.get(done, 0)}, {waiter} {steps.get(waiter, 0)} completed"
           if steps.get(done, 0) or steps.get(waiter, 0) else "")
    return LikelyCause.LOOP_PER_TASK, (
        "the same code ran more often on " + waiter + (f" (steps: {ran})" if ran else "")
        + ": a loop whose length depends on the task, most often uneven per-task data. "
        "Distribute the data with strategy.experimental_distribute_dataset or "
        "distribute_datasets_from_function (all tasks then stop together), or make the "
        "step count the same everywhere: steps_per_epoch, dataset.repeat(), "
        "drop_remainder=True for the last partial batch")


def _absent(busy: Mapping[str, LedgerView], ledgers: Mapping[str, LedgerView],
            members: set[str], absent: set[str], now: float) -> Hang | None:
    for name in sorted(absent, key=task_order):
        for waiter, view in sorted(busy.items(), key=lambda kv: task_order(kv[0])):
            for row in view.open_rows():
                ledger = ledgers.get(name)
                if not _needs(row, name, ledger, members) or _never_entered(row, ledger) is None:
                    continue
                cause = (f"{waiter} waits in {describe_row(row)} for {name}, which is not "
                         "running this cell")
                waiting, waited_in = _waits({waiter: row}, now)
                return Hang(HangRule.ABSENT, name, cause, waiting,
                            "a cell that runs collectives must run on every task of the "
                            "strategy (drop --on, or run it with %%tfcluster on all tasks)",
                            LikelyCause.CELL_ON_SOME_TASKS, waited_in)
    return None


def _diverged(busy: Mapping[str, LedgerView], now: float) -> Hang | None:
    slots: dict[tuple[str, int], dict[str, LedgerRow]] = collections.defaultdict(dict)
    for task, view in busy.items():
        for row in view.open_rows():
            if (index := row.get("index")) is not None:
                slots[(pair_key(row), index)][task] = row
    for (_, index), rows in sorted(slots.items(), key=lambda kv: kv[0][1]):
        tasks = sorted(rows, key=task_order)
        if all(_same(rows[tasks[0]], rows[t]) for t in tasks[1:]):
            continue
        per_task = "; ".join(f"{t}: {describe_row(rows[t])}" for t in tasks)
        cause = (f"the tasks wait in different collectives at position {index + 1}: "
                 f"{per_task}")
        waiting, waited_in = _waits(rows, now)
        return Hang(HangRule.DIVERGED, tasks[-1], cause, waiting,
                    "a branch or a shape that depends on the task pairs different "
                    "collectives: every task must issue the same collectives in the same order",
                    LikelyCause.COLLECTIVES_PER_TASK, waited_in)
    return None


def _same(a: LedgerRow, b: LedgerRow) -> bool:
    """The same collective as far as the rows tell: kind, dtype, and shapes that agree where
    both are known (a traced row may have a dimension unknown at trace time)."""
    if (a.get("kind"), a.get("dtype")) != (b.get("kind"), b.get("dtype")):
        return False
    x, y = a.get("shape"), b.get("shape")
    if x is None or y is None:
        return True
    return len(x) == len(y) and all(i is None or j is None or i == j
                                    for i, j in zip(x, y, strict=True))


def ledger_overview(ledgers: Mapping[str, LedgerView], now: float) -> str:
    """For a stall report: who is in which collective since when, and who never entered it;
    empty when no task is in a collective."""
    if not any(v.current() for v in ledgers.values()):
        return ""
    stands = where_each_stands(ledgers, now)
    return "collectives: " + "; ".join(f"{t} {said}" for t, said in stands.items())


def where_each_stands(ledgers: Mapping[str, LedgerView], now: float) -> dict[str, str]:
    """Per task, in words: the collective it is in and for how long, or that it never entered
    the one the others are in, with how many it issued and its last."""
    inside = {t: v.current() for t, v in ledgers.items()}
    others = [r for r in inside.values() if r is not None and r.get("index") is not None]
    said = {}
    for task in sorted(ledgers, key=task_order):
        row = inside[task]
        if row is not None:
            said[task] = f"in {_waited(row, now)}"
            continue
        view = ledgers[task]
        last = view.recent(1)
        missing = [r for r in others
                   if (index := r.get("index")) is not None and index >= view.count(pair_key(r))]
        how = f"never entered {describe_row(missing[0])}" if missing else "in no collective"
        tail = f"; its last: {describe_row(last[0])}, {last[0].get('state')}" if last else ""
        said[task] = f"{how} ({view.issued} issued{tail})"
    return said
