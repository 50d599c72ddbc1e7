"""``%tfdist_check variables EXPR``: whether every task holds the same values in the same
variables, and for those that differ by how much and the likely cause (pure: the tasks sent
checksums, :mod:`tfdist_nb.worker.consistency`).

Each variable is compared exactly (a hash of its bytes) and with a tolerance
(``|a - b| <= atol + rtol * max|a|``). A small variable travels whole, so its max abs difference
is exact; a larger one travels as float64 sum, sum of squares, min, max and values at fixed
positions, which bound the max abs difference from below (``|sum_a - sum_b| / n``,
``|max_a - max_b|``, ``|min_a - min_b|``, ``| |a| - |b| | / sqrt(n)``, the sampled differences)
and from above (``max(max_a - min_b, max_b - min_a)``). A variable whose bytes differ is
``diverged`` unless its difference is shown to be within the tolerance; ``diverged`` maps its
name to the exact max abs difference, or to the proven lower bound when only summaries were
compared (the table says which and gives both bounds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from tfdist_nb.diagnostics.report import CheckReport
from tfdist_nb.topology import name_tasks, task_order

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


def _floats(values: list[Any]) -> list[float]:
    return [float(v) for v in values]  # "nan" / "inf" / "-inf" came as text


def _compare(rows: dict[str, dict[str, Any]], atol: float, rtol: float) -> dict[str, Any]:
    """One variable across tasks: verdict, max abs difference (exact or bounds) and why."""
    tasks = sorted(rows, key=task_order)
    first = rows[tasks[0]]
    shapes = {t: tuple(r["shape"]) for t, r in rows.items()}
    dtypes = {t: r["dtype"] for t, r in rows.items()}
    if len(set(shapes.values())) > 1 or len(set(dtypes.values())) > 1:
        return {"verdict": "diverged", "max_abs_diff": math.inf, "exact": True,
                "why": "shape/dtype differ: " + ", ".join(
                    f"{t} {dtypes[t]}{list(shapes[t])}" for t in tasks)}
    shas = {t: r["sha"] for t, r in rows.items()}
    if len(set(shas.values())) == 1:
        return {"verdict": "equal", "max_abs_diff": 0.0, "exact": True, "why": ""}
    if "sum" not in first and "values" not in first:
        return {"verdict": "diverged", "max_abs_diff": None, "exact": False,
                "why": f"{first['dtype']} values differ (bytes; no numeric difference)"}
    nonfinite = {t: r.get("nonfinite", 0) for t, r in rows.items()}
    if len(set(nonfinite.values())) > 1:
        return {"verdict": "diverged", "max_abs_diff": math.inf, "exact": True,
                "why": "NaN/Inf on " + ", ".join(f"{t} ({n})" for t, n in nonfinite.items()
                                                  if n)}
    scale = max((abs(r.get(k, 0.0)) for r in rows.values() for k in ("min", "max")),
                default=0.0)
    tol = atol + rtol * scale
    if all("values" in r for r in rows.values()):
        arrays = [_floats(rows[t]["values"]) for t in tasks]
        diff = 0.0
        for column in zip(*arrays, strict=True):
            finite = [x for x in column if math.isfinite(x)]
            if len(finite) != len(column):
                if len({str(x) for x in column}) > 1:
                    diff = math.inf
                continue
            diff = max(diff, max(finite) - min(finite))
        return {"verdict": "within tolerance" if diff <= tol else "diverged",
                "max_abs_diff": diff, "exact": True, "tolerance": tol, "why": ""}
    if any(nonfinite.values()):
        return {"verdict": "differs", "max_abs_diff": None, "exact": False,
                "why": f"holds NaN/Inf ({first.get('nonfinite')} on each task), so only its "
                       f"bytes were compared"}
    lo, hi = 0.0, 0.0
    for i, a in enumerate(tasks):
        for b in tasks[i + 1:]:
            ra, rb = rows[a], rows[b]
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
    verdict = "diverged" if lo > tol else "within tolerance" if hi <= tol else "differs"
    return {"verdict": verdict, "max_abs_diff": lo, "exact": False, "bound": (lo, hi),
            "tolerance": tol, "why": ""}


def analyse(answers: Mapping[str, Mapping[str, Any]], atol: float = ATOL,
            rtol: float = RTOL) -> CheckReport:
    """``answers[task]``: ``{"variables": [...], "strategy": name}`` from each task's
    :func:`~tfdist_nb.worker.consistency.variable_checksums`, or ``{"error": why}``."""
    tasks = sorted(answers, key=task_order)
    errors = [f"{t}: {answers[t]['error']}" for t in tasks if "error" in answers[t]]
    good = [t for t in tasks if "error" not in answers[t]]
    fields: dict[str, Any] = {"errors": errors, "diverged": {}, "within_tolerance": [],
                              "atol": atol, "rtol": rtol}
    if not good:
        return CheckReport("variables", False, errors[0] if errors else "no task answered",
                           details=errors, fields=fields)
    by_name: dict[str, dict[str, dict[str, Any]]] = {}
    for t in good:
        for row in answers[t].get("variables", []):
            by_name.setdefault(row["name"], {})[t] = row
    strategies = {t: answers[t].get("strategy") for t in good}
    records = []
    diverged: dict[str, float] = {}
    bounds: dict[str, tuple[float, float]] = {}
    within: list[str] = []
    causes: dict[str, str] = {}
    odd_tasks: set[str] = set()
    for name, rows in by_name.items():
        absent = [t for t in good if t not in rows]
        mirrored = {t: bool(r.get("mirrored")) for t, r in rows.items()}
        record: dict[str, Any] = {"variable": name}
        first = rows[sorted(rows, key=task_order)[0]]
        record.update(shape=str(tuple(first["shape"])), dtype=first["dtype"],
                      mirrored=_mirrored_text(mirrored))
        got: dict[str, Any]
        if absent:
            got = {"verdict": "diverged", "max_abs_diff": math.inf, "exact": True,
                   "why": f"missing on {name_tasks(absent)}"}
        else:
            got = _compare(rows, atol, rtol)
        record.update(verdict=got["verdict"],
                      max_abs_diff=got["max_abs_diff"] if got["exact"] else None,
                      bound=("" if got["exact"] or "bound" not in got else
                             f">= {got['bound'][0]:.3g}, <= {got['bound'][1]:.3g}"))
        for t in good:
            record[f"sha {t}"] = rows[t]["sha"] if t in rows else ""
        records.append(record)
        if got["verdict"] in ("diverged", "differs"):
            value = got["max_abs_diff"]
            diverged[name] = float(value) if value is not None else math.nan
            if not got["exact"] and "bound" in got:
                bounds[name] = got["bound"]
            causes[name] = got["why"] or _cause(mirrored, strategies, absent)
            odd_tasks.update(_odd_ones(rows, good))
        elif got["verdict"] == "within tolerance":
            within.append(name)
    table = pd.DataFrame(records).set_index("variable") if records else pd.DataFrame()
    details = list(errors)
    fields.update(diverged=diverged, within_tolerance=within, bounds=bounds, causes=causes,
                  mirrored={name: {t: bool(r.get("mirrored")) for t, r in rows.items()}
                            for name, rows in by_name.items()})
    if within:
        details.append(f"{len(within)} variable(s) differ bitwise but within the tolerance "
                       f"(atol {atol:g}, rtol {rtol:g}): " + ", ".join(within[:QUOTED]) +
                       (" ..." if len(within) > QUOTED else ""))
    if not by_name:
        return CheckReport("variables", not errors, (errors[0] if errors else
                           "no variables found in the expression on " + name_tasks(good)),
                           table, details=details, fields=fields)
    if diverged:
        for name, why in list(causes.items())[:10]:
            details.append(f"{name}: {_amount(name, diverged[name], bounds)}; {why}")
        details.append("usual causes: " + "; ".join(CAUSES))
        who = sorted(odd_tasks or set(good), key=task_order)
        between = (f"between {name_tasks(good)}" if len(good) == 2 or len(who) == len(good)
                   else f"on {name_tasks(who)} (the others agree)")
        quoted = ", ".join(f"{n} ({_amount(n, diverged[n], bounds)})"
                           for n in list(diverged)[:QUOTED])
        common = _common_cause(causes)
        summary = (f"{len(diverged)} of {len(by_name)} variable(s) differ {between}: {quoted}"
                   + (" ..." if len(diverged) > QUOTED else "")
                   + (f"; likely cause: {common}" if common else ""))
        if errors:
            summary += f"; {errors[0]}"
        return CheckReport("variables", False, summary, table, details=details, fields=fields)
    summary = (f"all {len(by_name)} variable(s) are the same on {name_tasks(good)}"
               + (" (some only within the tolerance)" if within else " (bitwise)"))
    if errors:
        return CheckReport("variables", False, f"{errors[0]}; on the others: {summary}", table,
                           details=details, fields=fields)
    return CheckReport("variables", True, summary, table, details=details, fields=fields)


def _mirrored_text(mirrored: Mapping[str, bool]) -> str:
    values = set(mirrored.values())
    if values == {True}:
        return "yes"
    if values == {False}:
        return "no"
    return "only on " + name_tasks([t for t, m in mirrored.items() if m])


def _cause(mirrored: Mapping[str, bool], strategies: Mapping[str, Any],
           absent: list[str]) -> str:
    if absent:
        return "a per-task code path: the variable exists on some tasks only"
    values = set(mirrored.values())
    if len(values) > 1:
        return ("a per-task code path: mirrored on " +
                name_tasks([t for t, m in mirrored.items() if m]) + ", a plain variable on " +
                name_tasks([t for t, m in mirrored.items() if not m]))
    if values == {False}:
        if any(strategies.values()):
            return ("created outside strategy.scope(): a plain variable on every task, each "
                    "initialised on its own (unseeded random initial values differ) and "
                    "never all-reduced")
        return ("no tf.distribute strategy in the tasks' namespace: each task's variables are "
                "its own (unseeded random initial values differ)")
    return ("mirrored, so the copies diverged after creation: a per-task code path (an "
            "assign or update on some tasks only) or a task that skipped a step")


def _common_cause(causes: Mapping[str, str]) -> str | None:
    heads = {why.split(":")[0] for why in causes.values()}
    if len(heads) == 1:
        return next(iter(causes.values()))
    return None


def _odd_ones(rows: Mapping[str, Mapping[str, Any]], good: list[str]) -> list[str]:
    """The tasks outside the largest group of equal hashes (none to name for two tasks)."""
    if len(good) < 3:
        return list(good)
    groups: dict[str, list[str]] = {}
    for t in good:
        groups.setdefault(rows[t]["sha"] if t in rows else "", []).append(t)
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
