"""``%tfdist_check variables EXPR``: whether every task holds the same values in the same
variables, by how much they differ and the likely cause (pure: the tasks sent checksums,
:mod:`tfdist_nb.worker.variables_probe`; docs/reference.md, Checks).

A variable sent as summaries (float64 sum, sum of squares, min, max, sampled values) bounds the
max abs difference from below (``|sum_a - sum_b| / n``, ``|max_a - max_b|``, ``|min_a - min_b|``,
``| |a| - |b| | / sqrt(n)``, the sampled differences) and from above
(``max(max_a - min_b, max_b - min_a)``); differing bytes are ``diverged`` unless shown to be
within ``atol + rtol * max|a|``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import pandas as pd

from tfdist_nb.diagnostics.report import CheckReport, grouped
from tfdist_nb.strenum import StrEnum
from tfdist_nb.topology import name_tasks, task_order
from tfdist_nb.worker.replies import Checksums, Failure, VariableRow

ATOL = 1e-6
RTOL = 1e-5
QUOTED = 3

CAUSES = [
    "created outside strategy.scope(): a plain variable on each task, initialised on its own "
    "and never all-reduced (build the model and optimizer inside `with strategy.scope():`)",
    "unseeded randomness: different initial values on each task (tf.random.set_seed / "
    "keras.utils.set_random_seed with the same seed on every task, before building)",
    "a per-task code path: a branch or cell that ran on some tasks only (`if tw.task[1] == 0:`, "
    "`--on`), or an assign outside strategy.run",
    "a task that skipped a step (compare the step column of %tfdist_status --table)",
]


class VariableCause(StrEnum):
    """Why one variable differs between tasks (``report.cause_kinds[name]``). Each variable's
    line says it with that variable's details; the summary names a likely cause only when
    every differing variable has the same one."""

    SHAPE_DTYPE = "shape_dtype"  # shapes or dtypes differ
    BYTES_DIFFER = "bytes_differ"  # a non-numeric dtype whose bytes differ
    NONFINITE_WHERE = "nonfinite_where"  # NaN/Inf on some tasks, or in other numbers
    NONFINITE_BYTES = "nonfinite_bytes"  # NaN/Inf on each task: only the bytes compared
    MISSING = "missing"  # the variable exists on some tasks only
    MIXED_MIRRORING = "mixed_mirroring"  # mirrored on some tasks, a plain variable on others
    OUTSIDE_SCOPE = "outside_scope"  # plain variables while a strategy exists
    NO_STRATEGY = "no_strategy"  # no tf.distribute strategy in the tasks' namespace
    DIVERGED_AFTER_CREATION = "diverged_after_creation"  # mirrored, then diverged


#: The summary's words for a cause that every differing variable shares with other details.
SHARED_WORDS = {
    VariableCause.SHAPE_DTYPE: "shapes or dtypes differ between the tasks",
    VariableCause.BYTES_DIFFER: "non-numeric values differ (bytes)",
    VariableCause.NONFINITE_WHERE: "NaN/Inf on some tasks only",
    VariableCause.NONFINITE_BYTES: "they hold NaN/Inf, so only their bytes were compared",
    VariableCause.MISSING: "a per-task code path: the variables exist on some tasks only",
    VariableCause.MIXED_MIRRORING: "a per-task code path: mirrored on some tasks, plain "
                                   "variables on others",
}


class _Verdict(TypedDict):
    verdict: str  # "equal" | "within tolerance" | "differs" | "diverged"
    max_abs_diff: float | None
    exact: bool  # from whole values or hashes, not from summaries
    why: tuple[VariableCause, str] | None


class Verdict(_Verdict, total=False):
    """One variable across the tasks (``_compare``)."""

    bound: tuple[float, float]


def _compare(rows: dict[str, VariableRow], good: list[str], atol: float, rtol: float
             ) -> Verdict:
    """One variable across tasks: verdict, max abs difference (exact or bounds) and why;
    diverged when it is missing on some task that answered."""
    if absent := [t for t in good if t not in rows]:
        return {"verdict": "diverged", "max_abs_diff": math.inf, "exact": True,
                "why": (VariableCause.MISSING, f"missing on {name_tasks(absent)}")}
    tasks = sorted(rows, key=task_order)
    first = rows[tasks[0]]
    settled = _by_bytes(rows, tasks)
    if settled is not None:
        return settled
    tol = _tolerance(rows, atol, rtol)
    if all("values" in r for r in rows.values()):
        # "nan" / "inf" / "-inf" came as text
        diff = _max_abs_diff([[float(v) for v in rows[t]["values"]] for t in tasks])
        return {"verdict": "within tolerance" if diff <= tol else "diverged",
                "max_abs_diff": diff, "exact": True, "why": None}
    if any(r.get("nonfinite", 0) for r in rows.values()):
        return {"verdict": "differs", "max_abs_diff": None, "exact": False,
                "why": (VariableCause.NONFINITE_BYTES,
                        f"holds NaN/Inf ({first.get('nonfinite')} on each task), so only its "
                        f"bytes were compared")}
    lo, hi = _bounds(rows, tasks)
    verdict = "diverged" if lo > tol else "within tolerance" if hi <= tol else "differs"
    return {"verdict": verdict, "max_abs_diff": lo, "exact": False, "bound": (lo, hi),
            "why": None}


def _by_bytes(rows: dict[str, VariableRow], tasks: list[str]) -> Verdict | None:
    """The verdict that needs no numbers (shapes, dtypes, hashes, where NaN/Inf are), or None
    when the values must be compared."""
    first = rows[tasks[0]]
    shapes = {t: tuple(r["shape"]) for t, r in rows.items()}
    dtypes = {t: r["dtype"] for t, r in rows.items()}
    if len(set(shapes.values())) > 1 or len(set(dtypes.values())) > 1:
        return {"verdict": "diverged", "max_abs_diff": math.inf, "exact": True,
                "why": (VariableCause.SHAPE_DTYPE, "shape/dtype differ: " + ", ".join(
                    f"{t} {dtypes[t]}{list(shapes[t])}" for t in tasks))}
    if len({r["sha"] for r in rows.values()}) == 1:
        return {"verdict": "equal", "max_abs_diff": 0.0, "exact": True, "why": None}
    if "sum" not in first and "values" not in first:
        return {"verdict": "diverged", "max_abs_diff": None, "exact": False,
                "why": (VariableCause.BYTES_DIFFER,
                        f"{first['dtype']} values differ (bytes; no numeric difference)")}
    nonfinite = {t: r.get("nonfinite", 0) for t, r in rows.items()}
    if len(set(nonfinite.values())) > 1:
        return {"verdict": "diverged", "max_abs_diff": math.inf, "exact": True,
                "why": (VariableCause.NONFINITE_WHERE, "NaN/Inf on " + ", ".join(
                    f"{t} ({n})" for t, n in nonfinite.items() if n))}
    return None


def _tolerance(rows: dict[str, VariableRow], atol: float, rtol: float) -> float:
    """``atol + rtol * max|a|``, the largest magnitude from every task's min and max."""
    scale = max((abs(v) for r in rows.values() for v in (r.get("min", 0.0), r.get("max", 0.0))),
                default=0.0)
    return atol + rtol * scale


def _max_abs_diff(arrays: list[list[float]]) -> float:
    """The exact max abs difference of whole values (one list per task); NaN/Inf count only
    where the tasks disagree on them (then it is inf)."""
    diff = 0.0
    for column in zip(*arrays, strict=True):
        finite = [x for x in column if math.isfinite(x)]
        if len(finite) != len(column):
            if len({str(x) for x in column}) > 1:
                diff = math.inf
            continue
        diff = max(diff, max(finite) - min(finite))
    return diff


def _bounds(rows: dict[str, VariableRow], tasks: list[str]) -> tuple[float, float]:
    """Lower and upper bounds of the max abs difference from the summaries, over every pair of
    tasks (module docstring)."""
    lo, hi = 0.0, 0.0
    for a, b in itertools.combinations(tasks, 2):
        pair_lo, pair_hi = _pair_bounds(rows[a], rows[b])
        lo, hi = max(lo, pair_lo), max(hi, pair_hi)
    return lo, hi


def _pair_bounds(ra: VariableRow, rb: VariableRow) -> tuple[float, float]:
    """``_bounds`` of two tasks' summaries of one variable."""
    lo, hi = 0.0, 0.0
    n = max(int(ra.get("size") or 1), 1)
    if "sum" in ra and "sum" in rb:
        lo = max(lo, abs(ra["sum"] - rb["sum"]) / n, abs(ra["max"] - rb["max"]),
                 abs(ra["min"] - rb["min"]),
                 abs(math.sqrt(ra["sumsq"]) - math.sqrt(rb["sumsq"])) / math.sqrt(n))
        hi = max(hi, ra["max"] - rb["min"], rb["max"] - ra["min"])
    sb = {int(i): float(v) for i, v in rb.get("samples", [])}
    for idx, va in ra.get("samples", []):
        vb = sb.get(int(idx))
        if vb is not None and math.isfinite(float(va)) and math.isfinite(vb):
            lo = max(lo, abs(float(va) - vb))
    return lo, hi


def _record(name: str, rows: Mapping[str, VariableRow], got: Verdict,
            good: list[str]) -> dict[str, object]:
    """The variable's row of the table: what it is, its verdict, each task's hash."""
    first = rows[sorted(rows, key=task_order)[0]]
    return {"variable": name, "shape": str(tuple(first["shape"])), "dtype": first["dtype"],
            "mirrored": _mirrored_text(_mirrored(rows)), "verdict": got["verdict"],
            "max_abs_diff": got["max_abs_diff"] if got["exact"] else None,
            "bound": ("" if got["exact"] or "bound" not in got else
                      f">= {got['bound'][0]:.3g}, <= {got['bound'][1]:.3g}"),
            **{f"sha {t}": rows[t]["sha"] if t in rows else "" for t in good}}


def _mirrored(rows: Mapping[str, VariableRow]) -> dict[str, bool]:
    return {t: bool(r.get("mirrored")) for t, r in rows.items()}


@dataclass
class _Tally:
    """Every variable's verdict, gathered as the table, the fields and the lines need them."""

    good: list[str]
    strategies: dict[str, str | None]
    records: list[dict[str, object]] = field(default_factory=list)
    diverged: dict[str, float] = field(default_factory=dict)
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    within: list[str] = field(default_factory=list)
    causes: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, VariableCause] = field(default_factory=dict)
    odd_tasks: set[str] = field(default_factory=set)

    def add(self, name: str, rows: dict[str, VariableRow], got: Verdict) -> None:
        self.records.append(_record(name, rows, got, self.good))
        if got["verdict"] in ("diverged", "differs"):
            value = got["max_abs_diff"]
            self.diverged[name] = float(value) if value is not None else math.nan
            if not got["exact"] and "bound" in got:
                self.bounds[name] = got["bound"]
            self.kinds[name], self.causes[name] = got["why"] or _cause(_mirrored(rows),
                                                                       self.strategies)
            self.odd_tasks.update(_odd_ones(rows, self.good))
        elif got["verdict"] == "within tolerance":
            self.within.append(name)


def analyse(answers: Mapping[str, Checksums | Failure], atol: float = ATOL,
            rtol: float = RTOL) -> CheckReport:
    """``answers[task]``: ``{"variables": [...], "strategy": name}`` from each task's
    :func:`~tfdist_nb.worker.variables_probe.variable_checksums`, or ``{"error": why}``."""
    tasks = sorted(answers, key=task_order)
    errors = [f"{t}: {a['error']}" for t in tasks if "error" in (a := answers[t])]
    found = {t: a for t in tasks if "error" not in (a := answers[t])}
    good = list(found)
    fields: dict[str, Any] = {"errors": errors, "diverged": {}, "within_tolerance": [],
                              "atol": atol, "rtol": rtol}
    by_name = _by_name(found)
    tally = _Tally(good, {t: a.get("strategy") for t, a in found.items()})
    for name, rows in by_name.items():
        tally.add(name, rows, _compare(rows, good, atol, rtol))
    table = pd.DataFrame(tally.records).set_index("variable") if tally.records else pd.DataFrame()
    details = [*errors, *_within_note(tally.within, atol, rtol)]
    fields.update(diverged=tally.diverged, within_tolerance=tally.within, bounds=tally.bounds,
                  causes=tally.causes, cause_kinds=tally.kinds,
                  mirrored={name: _mirrored(rows) for name, rows in by_name.items()})
    if not by_name:
        summary = (errors[0] if errors else "no task answered" if not good
                   else "no variables found in the expression on " + name_tasks(good))
    elif tally.diverged:
        summary = _diverged_summary(tally, len(by_name), errors)
        details += _diverged_lines(tally)
    else:
        summary = (f"all {len(by_name)} variable(s) are the same on {name_tasks(good)}"
                   + (" (some only within the tolerance)" if tally.within else " (bitwise)"))
        summary = f"{errors[0]}; on the others: {summary}" if errors else summary
    return CheckReport("variables", bool(good) and not errors and not tally.diverged, summary,
                       table, details=details, fields=fields)


def _by_name(answers: Mapping[str, Checksums]) -> dict[str, dict[str, VariableRow]]:
    """``{variable: {task: its row}}`` of the tasks that answered."""
    by_name: dict[str, dict[str, VariableRow]] = {}
    for t, answer in answers.items():
        for row in answer.get("variables", []):
            by_name.setdefault(row["name"], {})[t] = row
    return by_name


def _within_note(within: list[str], atol: float, rtol: float) -> list[str]:
    """The line naming variables that differ bitwise but within the tolerance, if any."""
    if not within:
        return []
    return [f"{len(within)} variable(s) differ bitwise but within the tolerance "
            f"(atol {atol:g}, rtol {rtol:g}): " + ", ".join(within[:QUOTED]) +
            (" ..." if len(within) > QUOTED else "")]


def _diverged_lines(tally: _Tally) -> list[str]:
    """A line per differing variable (the first ten) with its amount and cause, then the
    usual causes."""
    lines = [f"{name}: {_amount(name, tally.diverged[name], tally.bounds)}; {why}"
             for name, why in list(tally.causes.items())[:10]]
    return [*lines, "usual causes: " + "; ".join(CAUSES)]


def _diverged_summary(tally: _Tally, variables: int, errors: list[str]) -> str:
    """How many variables differ, between which tasks, by how much and the likely cause."""
    good, diverged = tally.good, tally.diverged
    who = sorted(tally.odd_tasks or set(good), key=task_order)
    between = (f"between {name_tasks(good)}" if len(good) == 2 or len(who) == len(good)
               else f"on {name_tasks(who)} (the others agree)")
    quoted = ", ".join(f"{n} ({_amount(n, diverged[n], tally.bounds)})"
                       for n in list(diverged)[:QUOTED])
    common = _common_cause(tally)
    summary = (f"{len(diverged)} of {variables} variable(s) differ {between}: {quoted}"
               + (" ..." if len(diverged) > QUOTED else "")
               + (f"; likely cause: {common}" if common else ""))
    return summary + (f"; {errors[0]}" if errors else "")


def _mirrored_text(mirrored: Mapping[str, bool]) -> str:
    values = set(mirrored.values())
    if values == {True}:
        return "yes"
    if values == {False}:
        return "no"
    return "only on " + name_tasks([t for t, m in mirrored.items() if m])


def _cause(mirrored: Mapping[str, bool],
           strategies: Mapping[str, str | None]) -> tuple[VariableCause, str]:
    """The likely cause of a variable present on every task whose values differ."""
    values = set(mirrored.values())
    if len(values) > 1:
        return VariableCause.MIXED_MIRRORING, (
            "a per-task code path: mirrored on " + name_tasks([t for t, m in mirrored.items() if m])
            + ", a plain variable on " + name_tasks([t for t, m in mirrored.items() if not m]))
    if values == {False}:
        if any(strategies.values()):
            return VariableCause.OUTSIDE_SCOPE, (
                "created outside strategy.scope(): a plain variable on every task, each "
                "initialised on its own (unseeded random initial values differ) and never "
                "all-reduced")
        return VariableCause.NO_STRATEGY, (
            "no tf.distribute strategy in the tasks' namespace: each task's variables are its "
            "own (unseeded random initial values differ)")
    return VariableCause.DIVERGED_AFTER_CREATION, (
        "mirrored, so the copies diverged after creation: a per-task code path (an assign or "
        "update on some tasks only) or a task that skipped a step")


def _common_cause(tally: _Tally) -> str | None:
    """The cause every differing variable shares: its own words when they are the same for
    all, the cause's general words when only the kind is; None when the kinds differ."""
    kinds, texts = set(tally.kinds.values()), set(tally.causes.values())
    if len(kinds) != 1:
        return None
    return texts.pop() if len(texts) == 1 else SHARED_WORDS.get(kinds.pop())


def _odd_ones(rows: Mapping[str, VariableRow], good: list[str]) -> list[str]:
    """The tasks outside the largest group of equal hashes (none to name for two tasks)."""
    if len(good) < 3:
        return list(good)
    groups = grouped({t: rows[t]["sha"] if t in rows else "" for t in good})
    biggest = max(groups.values(), key=len)
    if len(biggest) * 2 <= len(good):
        return list(good)
    return [t for t in good if t not in biggest]


def _amount(name: str, value: float, bounds: Mapping[str, tuple[float, float]]) -> str:
    if name in bounds:
        lo, hi = bounds[name]
        return (f"max abs diff >= {lo:.3g} and <= {hi:.3g}, only summaries compared")
    if math.isnan(value):
        return "values differ"
    return f"max abs diff {value:.3g}"
