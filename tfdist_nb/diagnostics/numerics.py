"""Where NaN/Inf came from first (pure): with ``%tfdist_numerics on`` every task's first op
whose output holds NaN or Inf raises, naming the op; the task that raised first (by its own
clock) is the origin, the others usually got it through a collective."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tfdist_nb.results import TaskResult

_DETECTED = re.compile(r"Detected (Infinity or NaN|NaN|Infinity) in output (\d+) of "
                       r"(eagerly-executing|graph) op \"([^\"]+)\"")
_GRAPH_NAME = re.compile(r"\(name: ([^)]+)\)")
_STACK = "Stack trace of op's creation:"


@dataclass(frozen=True)
class NanFinding:
    task: str
    op: str
    mode: str  # "eagerly-executing" or "graph"
    at: float | None
    stack: str  # a few frames of where the op was created (graph ops), else ""

    def describe(self) -> str:
        where = f"op {self.op} ({'eager' if self.mode.startswith('eager') else 'in a graph'})"
        return f"NaN/Inf first produced on {self.task} by {where}"


def finding(result: TaskResult) -> NanFinding | None:
    """The op a task's check_numerics error names, if its error is one."""
    if result.error is None:
        return None
    m = _DETECTED.search(result.error.evalue)
    if m is None:
        return None
    op = m.group(4)
    if name := _GRAPH_NAME.search(result.error.evalue[m.end():m.end() + 200]):
        op = f"{op} ({name.group(1)})"
    stack = ""
    if _STACK in result.error.evalue:
        lines = result.error.evalue.split(_STACK, 1)[1].strip().splitlines()
        stack = "\n".join(line.rstrip() for line in lines[:6])
    return NanFinding(result.task, op, m.group(3), result.error_at, stack)


def first_nan(results: Iterable[TaskResult]) -> str | None:
    """One paragraph naming the first task and op that produced NaN/Inf, or None."""
    found = [f for r in results if (f := finding(r)) is not None]
    if not found:
        return None
    found.sort(key=lambda f: (f.at is None, f.at or 0.0))
    first = found[0]
    text = first.describe()
    began = first.at
    later = [(f, f.at) for f in found[1:] if f.at is not None]
    if later and began is not None:
        text += "; then " + ", ".join(f"{f.task} ({at - began:.2f} s later, op {f.op})"
                                      for f, at in later)
    if first.stack:
        text += f"\nwhere {first.op} was created:\n{first.stack}"
    return text
