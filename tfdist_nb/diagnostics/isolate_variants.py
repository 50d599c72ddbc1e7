"""The records of ``%tfdist_isolate``'s walk (docs/reference.md, Isolate): what a variant of the
failing cell is, how one of its runs turned out, the failure being chased, and the variants
themselves (the same cell unchanged, fewer workers, each task's share, MirroredStrategy,
eagerly, another collective implementation, fewer steps). Pure; the walk that picks among them
is :mod:`tfdist_nb.diagnostics.isolate`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tfdist_nb.results import RunResult, TaskResult, TaskStatus
from tfdist_nb.strenum import StrEnum
from tfdist_nb.topology import ClusterSpec, TaskId

#: The prelude's defaults (its VARIANT line: tfdist_nb/worker/isolate_prelude.py)
PLAIN = {"strategy": "multi_worker", "devices": 1, "eager": False, "implementation": None,
         "collective_timeout_s": None, "as_task": None}
#: What a variant's collective timeout raises (its prelude sets one)
COLLECTIVE_TIMEOUT = "DeadlineExceededError"
HANG = "hang"  # the signature of a run that ended stalled, timed out or released from a hang
#: How a task fails on its own: it raised, or its process ended. A task released from a hang
#: another task caused (ABORTED) did not, nor did one that only waited (STALLED, TIMEOUT).
ON_ITS_OWN = (TaskStatus.ERROR, TaskStatus.CRASHED)


class Outcome(StrEnum):
    """How a variant ended, against the failure being isolated."""

    FAILS = "fails"  # the same way as the cell did (same exception type, or a hang again)
    PASSES = "passes"
    OTHER = "fails differently"
    SETUP = "set-up failed"  # a cell before the failing one failed: no answer
    TIMEOUT = "out of time"  # the variant's time ran out before it ended
    NO_START = "did not start"
    INTERRUPTED = "interrupted"


    @property
    def verb(self) -> str:
        """The outcome in a sentence: "with 1 worker it <verb>"."""
        return {Outcome.FAILS: "fails the same way", Outcome.PASSES: "passes",
                Outcome.OTHER: "fails differently", Outcome.SETUP: "fails in a set-up cell",
                Outcome.TIMEOUT: "runs out of time", Outcome.NO_START: "does not start",
                Outcome.INTERRUPTED: "was interrupted"}[self]


class Finding(StrEnum):
    """What a walk's outcomes support (``IsolateReport.finding``); the verdict's sentence says
    it with the evidence."""

    NO_ANSWER = "no_answer"  # no variant ran
    FLAKY = "flaky"  # failed in the user's run, passed re-run unchanged
    NOT_REPRODUCED = "not_reproduced"  # re-run unchanged it ended another way
    DISTRIBUTED = "distributed"  # needs several workers; no narrower cause shown
    PER_REPLICA = "per_replica"  # also with the replicas in one process (MirroredStrategy)
    TRACES_DIFFER = "traces_differ"  # needs several workers, passes eagerly
    COLLECTIVE_IMPLEMENTATION = "collective_implementation"  # passes with the other one
    TASK_DATA = "task_data"  # fails on some tasks' shares alone
    TRACED_FUNCTION = "traced_function"  # fails as a tf.function, passes eagerly
    MODEL_OR_PIPELINE = "model_or_pipeline"  # fails on one task, also eagerly
    DATA_AS_A_WHOLE = "data_as_a_whole"  # one task with all the data, on no share alone
    STRATEGY_CODE_PATH = "strategy_code_path"  # MWMS on 1 worker fails, MirroredStrategy not
    UNKNOWN = "unknown"  # the variant that would tell did not run or ended another way


@dataclass(frozen=True)
class Variant:
    """One way to run the cells again. ``shares``: every task runs alone (no multi-worker
    collectives), each judged on its own; ``as_task``: a one-task variant taking that task's
    identity (its share) when exported."""

    key: str
    title: str
    spec: ClusterSpec
    prelude: dict[str, Any] = field(default_factory=lambda: dict(PLAIN))
    steps: int | None = None  # the failing cell's loop bound, rewritten
    shares: bool = False
    as_task: str | None = None

    @property
    def tasks(self) -> int:
        return len(self.spec.tasks)


@dataclass
class Row:
    """One line of the report's table: a variant (or one task of ``shares``) and its outcome."""

    variant: Variant
    outcome: Outcome
    seconds: float
    error: str = ""  # the first error line, or why there is no answer
    task: str | None = None  # the task a ``shares`` row is about
    run_dir: str | None = None
    steps_done: int | None = None  # steps the failing task completed in the failing cell

    @property
    def title(self) -> str:
        return f"{self.task}'s share alone" if self.task else self.variant.title

    @property
    def tasks(self) -> int:
        return 1 if self.task else self.variant.tasks

    @property
    def runs_as(self) -> str:
        """The key of the variant that reruns this row alone (``Walk.exportable``)."""
        return share_alone_key(self.task) if self.task else self.variant.key


@dataclass(frozen=True)
class Failure:
    """The failure being isolated: its signature (the first failing task's exception type, or
    ``hang``), the first error line, which tasks did not end ok (those released from a hang
    included), how long the cell ran, and which tasks failed on their own (``ON_ITS_OWN``):
    where the walk looks for one task's data (``Walk.failing_alone``)."""

    signature: str
    first_line: str
    tasks: tuple[str, ...]
    seconds: float
    steps_done: int | None = None
    on_its_own: tuple[str, ...] = ()


def signature(tasks: Iterable[TaskResult]) -> tuple[str, str]:
    """How a run failed, comparable across variants: the exception type of the first task that
    raised (a named hang's culprit raised), ``crashed``, ``hang``, or ``ok``; and its first line."""
    results = list(tasks)
    for r in results:
        if r.status is TaskStatus.ERROR and r.error is not None:
            return r.error.ename, r.error.short(200)
    for sig, ended in (("crashed", {TaskStatus.CRASHED}),
                       (HANG, {TaskStatus.STALLED, TaskStatus.TIMEOUT, TaskStatus.ABORTED}),
                       ("interrupted", {TaskStatus.INTERRUPTED})):
        if said := next((f"{r.task} {r.status}" for r in results if r.status in ended), None):
            return sig, said
    return "ok", ""


def failure_of(result: RunResult, steps_done: int | None = None) -> Failure:
    sig, line = signature(result.tasks.values())
    return Failure(sig, line, tuple(r.task for r in result.failed),
                   max((r.duration_s for r in result.tasks.values()), default=0.0), steps_done,
                   on_its_own=tuple(r.task for r in result.failed if r.status in ON_ITS_OWN))


def judge(failure: Failure, tasks: Iterable[TaskResult], timed_out: bool) -> tuple[Outcome, str]:
    """A variant's outcome against ``failure``. A variant stopped by its own time limit fails
    the same way only when the failure was a hang."""
    sig, line = signature(tasks)
    if sig == "ok":
        return Outcome.PASSES, ""
    if sig == "interrupted":
        return Outcome.INTERRUPTED, line
    if sig == HANG and timed_out and failure.signature != HANG:
        return Outcome.TIMEOUT, line
    if {sig, failure.signature} == {HANG, COLLECTIVE_TIMEOUT}:
        return Outcome.FAILS, line  # a hang, ended by the variant's collective timeout
    return (Outcome.FAILS if sig == failure.signature else Outcome.OTHER), line


# ---------------------------------------------------------------------------- the variants
def count_title(spec: ClusterSpec, tasks: int) -> str:
    if spec.chief:
        return f"{tasks} task{'s' if tasks > 1 else ''} (chief and {tasks - 1} worker(s))"
    return f"{tasks} worker{'s' if tasks > 1 else ''}"


def same(spec: ClusterSpec) -> Variant:
    return Variant("same", f"{spec} as run", spec)


def fewer(spec: ClusterSpec, tasks: int) -> Variant:
    # the chief stays, workers go
    return Variant(f"tasks={tasks}", count_title(spec, tasks),
                   ClusterSpec(workers=tasks - spec.chief, chief=spec.chief))


def shares(spec: ClusterSpec) -> Variant:
    return Variant("shares", "each task's share alone (MirroredStrategy, no multi-worker "
                   "collectives)", spec, {**PLAIN, "strategy": "local"}, shares=True)


def share_alone_key(task: str) -> str:
    return f"share:{task}"


def share_alone(spec: ClusterSpec, task: str) -> Variant:
    """One task taking ``task``'s identity and share, alone (what ``shares`` ran for it)."""
    tid = TaskId.parse(task)
    layout = {role: [f"localhost:{20000 + i}" for i in range(n)]
              for role, n in (("chief", spec.chief), ("worker", spec.workers)) if n}
    return Variant(share_alone_key(task), f"{task}'s share alone", ClusterSpec(workers=1),
                   {**PLAIN, "strategy": "local", "as_task": [tid.role, tid.index, layout]},
                   as_task=task)


def mirrored(spec: ClusterSpec) -> Variant:
    n = len(spec.tasks)
    return Variant("mirrored", f"1 task, MirroredStrategy on {n} CPU devices (the job's "
                   f"{n} replicas in one process, all the data)", ClusterSpec(workers=1),
                   {**PLAIN, "strategy": "mirrored", "devices": n})


def eager(of: Variant) -> Variant:
    return replace(of, key=f"{of.key}+eager", title=f"{of.title}, functions run eagerly",
                   prelude={**of.prelude, "eager": True})


def implementation(of: Variant, name: str) -> Variant:
    return replace(of, key=f"{of.key}+{name}",
                   title=f"{of.title}, collectives with implementation={name.upper()}",
                   prelude={**of.prelude, "implementation": name})


def fewer_steps(of: Variant, steps: int) -> Variant:
    return replace(of, key=f"{of.key}+steps={steps}", title=f"{of.title}, {steps} step(s)",
                   steps=steps)
