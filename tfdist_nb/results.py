"""What ``Cluster.run`` returns (docs/reference.md, Python API): one TaskResult per targeted
task, and their sum."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RemoteError:
    """A task's exception as the kernel reported it; ``traceback`` keeps the cell's line numbers."""

    ename: str
    evalue: str
    traceback: list[str]

    def __str__(self) -> str:
        return f"{self.ename}: {self.evalue}"


@dataclass
class TaskResult:
    task: str
    status: str
    stdout: str = ""
    stderr: str = ""
    error: RemoteError | None = None
    duration_s: float = 0.0
    stack: str | None = None
    explanation: str | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error_at: float | None = None  # the task's own clock when its error was raised

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def __repr__(self) -> str:
        what = f" {self.error}" if self.error else ""
        return f"<TaskResult {self.task} {self.status}{what} in {self.duration_s:.2f}s>"


@dataclass
class RunResult:
    cell: int
    tasks: dict[str, TaskResult]
    profile: str | None = None  # what an armed %tfdist_profile captured during this cell

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.tasks.values())

    @property
    def failed(self) -> list[TaskResult]:
        return [r for r in self.tasks.values() if not r.ok]

    def summary(self) -> str:
        """One line: which tasks failed and how, or that all finished."""
        if self.ok:
            slowest = max((r.duration_s for r in self.tasks.values()), default=0.0)
            return f"{len(self.tasks)} task(s) ok in {slowest:.2f}s"
        parts = [f"{r.task} {r.status}" + (f" ({r.error})" if r.error else "")
                 for r in self.failed]
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
