"""What ``Cluster.run`` returns (docs/reference.md, Python API): one TaskResult per targeted
task, and their sum."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

from tfdist_nb.strenum import StrEnum


@dataclass(frozen=True)
class RemoteError:
    """A task's exception as the kernel reported it; ``traceback`` keeps the cell's line numbers."""

    ename: str
    evalue: str
    traceback: list[str]

    def __str__(self) -> str:
        return f"{self.ename}: {self.evalue}"

    def short(self, limit: int = 300) -> str:
        """``ename: first line``, without TensorFlow's ``{{function_node ...}}`` prefix: what a
        one-line summary shows (the full text stays in ``evalue``)."""
        lines = [line.strip() for line in _TF_NODE.sub("", self.evalue).splitlines()
                 if line.strip()]
        first = lines[0] if lines else ""
        if first.endswith(":") and len(lines) > 1:  # "in user code:" ... the error, last
            first = lines[-1]
        if first.startswith(f"{self.ename}: "):  # "in user code: ... ValueError: ..."
            first = first[len(self.ename) + 2:]
        if len(first) > limit:
            first = first[: limit - 1] + "…"
        return f"{self.ename}: {first}"


class TaskStatus(StrEnum):
    """How a task's run of a cell ended (a ``str``: ``result.status == "error"`` holds;
    docs/reference.md, Results)."""

    OK = "ok"
    ERROR = "error"  # the cell raised
    CRASHED = "crashed"  # the process ended
    ABORTED = "aborted"  # released from a hang another task caused
    TIMEOUT = "timeout"  # the cell's --timeout
    STALLED = "stalled"  # the stall detector ended it
    INTERRUPTED = "interrupted"  # the user's interrupt (or the cluster stopped)


@dataclass
class TaskResult:
    task: str
    status: TaskStatus
    stdout: str = ""
    stderr: str = ""
    error: RemoteError | None = None
    duration_s: float = 0.0
    stack: str | None = None
    explanation: str | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error_at: float | None = None  # the task's own clock when its error was raised

    def __post_init__(self) -> None:
        self.status = TaskStatus(self.status)  # a plain "ok" is taken; an unknown word is not

    @property
    def ok(self) -> bool:
        return self.status is TaskStatus.OK

    def __repr__(self) -> str:
        what = f" {self.error}" if self.error else ""
        return f"<TaskResult {self.task} {self.status}{what} in {self.duration_s:.2f}s>"


class HangRule(StrEnum):
    """Which hang rule proved a hang (docs/reference.md, "Collectives and hangs")."""

    FAILED = "failed"  # a task raised or crashed while others wait for it
    FINISHED = "finished"  # a task finished the cell while others wait for it
    ABSENT = "absent"  # a task the others wait for is not running the cell
    DIVERGED = "diverged"  # tasks wait in different collectives at one position


class LikelyCause(StrEnum):
    """What the evidence of a hang points to; ``Hang.advice`` is derived from it."""

    CULPRIT_ERROR = "culprit_error"  # the culprit's own error; the others only waited
    SHAPE_PER_TASK = "shape_per_task"  # the culprit and a waiter reduce different tensors
    CALL_ON_SOME_TASKS = "call_on_some_tasks"  # collectives at lines the culprit never ran
    LOOP_PER_TASK = "loop_per_task"  # the same lines ran more often on a waiter (uneven data)
    FUNCTION_ON_SOME_TASKS = "function_on_some_tasks"  # a tf.function the culprit never ran
    STRATEGY_ON_SOME_TASKS = "strategy_on_some_tasks"  # a strategy the culprit never made
    CELL_ON_SOME_TASKS = "cell_on_some_tasks"  # a collective cell run with --on
    COLLECTIVES_PER_TASK = "collectives_per_task"  # different collectives paired (a branch)


@dataclass(frozen=True)
class Collective:
    """One collective as a task's ledger recorded it: ``kind`` (``all_reduce``, ``startup``,
    ``check``, ...), ``tensor`` (``float32[3]``), its 1-based ``position`` in its group (None
    for a barrier), the ``function`` it ran in (``eager`` or a tf.function's name), ``where``
    it was made (``cell 2 line 4``) and ``called_at`` (the line that called the function)."""

    kind: str
    tensor: str
    position: int | None
    function: str
    where: str
    called_at: str | None = None

    @property
    def site(self) -> str:
        """The line of the cell that made it: the caller's for a traced function."""
        return self.called_at or self.where


@dataclass
class Hang:
    """A hang the collective ledgers proved (``RunResult.hang``): who caused it, who waited
    in what, and what the evidence points to. Its sentences (``cause``, ``advice``,
    ``explanation``) are made from these fields."""

    rule: HangRule
    culprit: str
    cause: str  # one sentence: the root cause (the first line of the run's summary)
    waiting: dict[str, str] = field(default_factory=dict)  # released task -> what it waited in
    advice: str = ""
    likely: LikelyCause = LikelyCause.CULPRIT_ERROR
    #: released task -> the collective it waited in
    waited_in: dict[str, Collective] = field(default_factory=dict)
    culprit_error: str | None = None  # "ValueError: ..." (rule failed)
    culprit_at: str | None = None  # the culprit's line that raised, "cell N line L"
    culprit_in: Collective | None = None  # the culprit's own row at the waited position
    steps: dict[str, int] = field(default_factory=dict)  # completed steps per task (finished)
    issued: dict[str, int] = field(default_factory=dict)  # collectives per task (finished)
    #: lines whose collectives ran a different number of times per task (finished)
    per_line: dict[str, dict[str, int]] = field(default_factory=dict)
    #: waiting tasks that cannot be released: their wait holds the GIL (a strategy's start-up)
    frozen: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rule = HangRule(self.rule)

    @property
    def waiters(self) -> list[str]:
        """The tasks released from the hang, in task order (chief, workers by index, ...)."""
        return list(self.waiting)

    def explanation(self, task: str) -> str:
        said = [self.cause]
        if task in self.frozen:
            said.append(f"{task} is still blocked in {self.waiting[task]}: TensorFlow holds the "
                        "Python lock there until its own registration timeout, so no interrupt "
                        "reaches it; restart the tasks (%tfdist_restart)")
        elif task in self.waiting:
            said.append(f"{task} was released from {self.waiting[task]}")
        if self.advice:
            first = self.advice.split(" ", 1)[0]
            said.append(self.advice if ":" in first else self.advice[:1].upper()
                        + self.advice[1:])
        return ". ".join(s.rstrip(".") for s in said) + "."


@dataclass
class RunResult:
    cell: int
    tasks: dict[str, TaskResult]
    profile: str | None = None  # what an armed %tfdist_profile captured during this cell
    hang: Hang | None = None  # what the hang rules proved (docs/reference.md)

    @property
    def cause(self) -> str | None:
        """The root cause the hang rules named, in one sentence, or None."""
        return self.hang.cause if self.hang is not None else None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.tasks.values())

    @property
    def failed(self) -> list[TaskResult]:
        return [r for r in self.tasks.values() if not r.ok]

    def summary(self) -> str:
        """One line: which tasks failed and how, or that all finished; after a hang the
        hang rules named, that root cause comes first, on a line of its own."""
        if self.cause and not self.ok:
            return f"{self.cause}\n{self._tally()}"
        return self._tally()

    def _tally(self) -> str:
        if self.ok:
            slowest = max((r.duration_s for r in self.tasks.values()), default=0.0)
            return f"{len(self.tasks)} task(s) ok in {slowest:.2f}s"
        # tasks that failed the same way are said once; a released task's error is the abort
        said: dict[str, list[str]] = {}
        for r in self.failed:
            how = r.status + (f" ({r.error.short()})"
                              if r.error and r.status is not TaskStatus.ABORTED else "")
            said.setdefault(how, []).append(r.task)
        parts = [f"{', '.join(tasks)} {how}" for how, tasks in said.items()]
        return f"{len(self.failed)} of {len(self.tasks)} task(s) failed: " + "; ".join(parts)

    def __repr__(self) -> str:
        return f"<RunResult cell {self.cell}: {self.summary()}>"

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(r.task)}</td><td>{html.escape(r.status)}</td>"
                       f"<td>{r.duration_s:.2f}</td><td>{html.escape(str(r.error or ''))}</td>"
                       "</tr>" for r in self.tasks.values())
        return (f"<table><caption>cell {self.cell}: {html.escape(self.summary())}</caption>"
                "<tr><th>task</th><th>status</th><th>duration s</th><th>error</th></tr>"
                f"{rows}</table>")


_TF_NODE = re.compile(r"^\{\{function_node [^}]*\}\}\s*")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colours
_CELL_LINE = re.compile(r"Cell In\[\d+\], line (\d+)")


def error_site(error: RemoteError | None, cell: int) -> str | None:
    """``cell N line L`` of the innermost cell frame of a task's traceback (its cell counter may
    differ from the controller's; the line is the cell's, magic line first)."""
    if error is None:
        return None
    found = _CELL_LINE.findall(ANSI.sub("", "\n".join(error.traceback)))
    return f"cell {cell} line {found[-1]}" if found else None
