"""Edits of a cell's code for ``%tfdist_isolate`` (docs/shrink-and-isolate.md): where its step
count is written, the same cell with fewer steps, and the variant's prelude with its settings.
Pure."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_MAGIC = re.compile(r"^\s*[%!]")


@dataclass(frozen=True)
class LoopBound:
    """Where the failing cell's step count is written: the argument of ``range(...)`` in its
    longest top-level ``for`` loop, or ``epochs=`` / ``steps_per_epoch=`` of a call."""

    line: int  # 1-based
    col: int  # utf-8 byte offsets, as ast gives them
    end_col: int
    value: int
    what: str  # "range" | "epochs" | "steps_per_epoch"

    @property
    def counts_steps(self) -> bool:
        """Whether the bound is a number of steps (``tw.steps_done()`` counts the same)."""
        return self.what != "epochs"


def parseable(code: str) -> str:
    """``code`` with IPython-only lines blanked (same lines, same columns elsewhere)."""
    return "\n".join("pass" if _MAGIC.match(line) else line for line in code.splitlines())


def loop_bound(code: str, before: Iterable[str] = ()) -> LoopBound | None:
    """The step count of ``code``: a ``for ... in range(N)`` loop (N a number, or a name set to
    a number in ``code`` or the ``before`` cells), outermost and largest; else a call's
    ``steps_per_epoch=N`` or ``epochs=N``. None when there is none to shrink."""
    try:
        tree = ast.parse(parseable(code))
    except SyntaxError:
        return None
    names = _int_names([*before, code])
    written: list[tuple[ast.expr, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and _is_range(node.iter):
            written.append((node.iter.args[0], "range"))  # type: ignore[attr-defined]
        elif isinstance(node, ast.Call):
            written += [(kw.value, kw.arg) for kw in node.keywords
                        if kw.arg in ("steps_per_epoch", "epochs")]
    found = [_bound(node, value, what) for node, what in written
             if (value := _int_value(node, names)) is not None and value >= 2]
    if ranges := [b for b in found if b.what == "range"]:
        return max(ranges, key=lambda b: (b.value, -b.line))
    # epochs first: with it, steps_per_epoch is not the number of steps the task ran
    return min(found, key=lambda b: b.what) if found else None


def with_bound(code: str, bound: LoopBound, value: int) -> str:
    """``code`` with the loop bound replaced by ``value``."""
    lines = code.splitlines(keepends=True)
    raw = lines[bound.line - 1].encode()
    lines[bound.line - 1] = (raw[:bound.col] + str(value).encode() + raw[bound.end_col:]).decode()
    return "".join(lines)


def _is_range(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "range" and len(node.args) == 1 and not node.keywords)


def _int_names(cells: Iterable[str]) -> dict[str, int]:
    names: dict[str, int] = {}
    for code in cells:
        try:
            tree = ast.parse(parseable(code))
        except SyntaxError:
            continue
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)):
                value = _int_value(node.value, {})
                if value is not None:
                    names[node.targets[0].id] = value
                else:
                    names.pop(node.targets[0].id, None)
    return names


def _int_value(node: ast.expr, names: dict[str, int]) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    return None


def _bound(node: ast.expr, value: int, what: str) -> LoopBound:
    assert node.end_lineno == node.lineno and node.end_col_offset is not None
    return LoopBound(node.lineno, node.col_offset, node.end_col_offset, value, what)


def implementation_named(cells: Iterable[str]) -> str | None:
    """The collective implementation the cells ask MultiWorkerMirroredStrategy for
    (``CommunicationImplementation.RING`` / ``NCCL`` / ``AUTO`` in their code), if any."""
    found = re.findall(r"CommunicationImplementation\.(RING|NCCL|AUTO)", "\n".join(cells))
    return found[-1].lower() if found else None


def prelude_code(template: str, variant: dict[str, Any]) -> str:
    """The prelude (tfdist_nb/worker/isolate_prelude.py) with its VARIANT line set to
    ``variant`` (a Python literal: strings, numbers, booleans, None, lists and dicts)."""
    head, sep, rest = template.partition("VARIANT = {")
    if not sep:
        raise ValueError("the isolate prelude has no VARIANT line")
    _, _, tail = rest.partition("}\n")
    return f"{head}VARIANT = {variant!r}\n{tail}"
