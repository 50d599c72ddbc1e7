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


@dataclass
class RunResult:
    cell: int
    tasks: dict[str, TaskResult]
    profile: str | None = None  # what an armed %tfdist_profile captured during this cell
    cause: str | None = None  # the root cause the hang rules named (docs/reference.md)

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
            how = r.status + (f" ({r.error.short()})" if r.error and r.status != "aborted"
                              else "")
            said.setdefault(how, []).append(r.task)
        parts = [f"{', '.join(tasks)} {how}" for how, tasks in said.items()]
        return f"{len(self.failed)} of {len(self.tasks)} task(s) failed: " + "; ".join(parts)

    def __repr__(self) -> str:
        return f"<RunResult cell {self.cell}: {self.summary()}>"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(r.task)}</td><td>{html.escape(r.status)}</td>"
            f"<td>{r.duration_s:.2f}</td><td>{html.escape(str(r.error or ''))}</td></tr>"
            for r in self.tasks.values()
        )
        return (f"<table><caption>cell {self.cell}: {html.escape(self.summary())}</caption>"
                "<tr><th>task</th><th>status</th><th>duration s</th><th>error</th></tr>"
                f"{rows}</table>")


_TF_NODE = re.compile(r"^\{\{function_node [^}]*\}\}\s*")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CELL_LINE = re.compile(r"Cell In\[\d+\], line (\d+)")


def error_site(error: RemoteError | None, cell: int) -> str | None:
    """``cell N line L`` of the innermost cell frame of a task's traceback (its cell counter may
    differ from the controller's; the line is the cell's, magic line first)."""
    if error is None:
        return None
    found = _CELL_LINE.findall(_ANSI.sub("", "\n".join(error.traceback)))
    return f"cell {cell} line {found[-1]}" if found else None
