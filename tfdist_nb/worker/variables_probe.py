"""What ``%tfdist_check variables`` asks of each task (docs/reference.md, Checks): checksums of
the variables of ``EXPR`` (evaluated in the task's user namespace) as this task holds them, as
plain JSON; :mod:`tfdist_nb.diagnostics.variables_check` lines the tasks up.
"""

from __future__ import annotations

import hashlib
import sys
from typing import TYPE_CHECKING, Any

from tfdist_nb.worker.consistency import evaluate
from tfdist_nb.worker.probes import find_strategy
from tfdist_nb.worker.replies import Checksums, VariableRow

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

FULL_VALUES = 1024  # a variable this small is sent whole (exact max abs difference)
FULL_TOTAL = 16384  # at most this many values in full per task; the rest as summaries
SAMPLES = 16


def _collect(obj: object, prefix: str = "") -> list[tuple[str, object]]:
    """``(name, variable)`` of a Keras model, a tf.Module, a list/tuple or dict of variables,
    or one variable."""
    import tensorflow as tf

    if isinstance(obj, dict):  # a variable by its key; anything else by what it holds
        return [found for key, value in obj.items()
                for found in ([(f"{prefix}{key}", value)] if _is_variable(value)
                              else _collect(value, f"{prefix}{key}"))]
    if isinstance(obj, list | tuple):  # a variable by its own name, else its position
        return [found for i, value in enumerate(obj) for found in _collect(value, f"{prefix}[{i}]")]
    if _is_variable(obj):
        return [(_name(obj, prefix or "variable"), obj)]
    weights = getattr(obj, "weights", None)  # Keras 3 and tf_keras models and layers
    if weights is None and isinstance(obj, tf.Module):
        weights = obj.variables
    if weights is None:
        weights = getattr(obj, "variables", None)
    if weights is None:
        raise TypeError(f"{type(obj).__name__} is not a model, a tf.Module, a variable or a "
                        "list/dict of variables")
    return [(_name(v, f"{prefix}[{i}]"), v) for i, v in enumerate(list(weights))]


def _is_variable(value: object) -> bool:
    import tensorflow as tf

    if isinstance(value, tf.Variable):
        return True
    keras_variable = getattr(sys.modules.get("keras"), "Variable", None)  # Keras 3
    return isinstance(keras_variable, type) and isinstance(value, keras_variable)


def _name(var: object, fallback: str) -> str:
    for attr in ("path", "name"):
        value = getattr(var, attr, None)
        if isinstance(value, str) and value:
            return value
    return fallback


def _summary(name: str, var: object, budget: list[int], full_values: int) -> VariableRow:
    """``summarise`` of this task's own copy of ``var`` (no collective: a mirrored or
    sync-on-read variable's first local component), and whether it is a distributed variable
    (made in a strategy's scope)."""
    import numpy as np
    import tensorflow as tf

    inner: Any = var if isinstance(var, tf.Variable) else getattr(var, "_value", None)
    inner = var if inner is None else inner  # a Keras 3 variable holds its tf.Variable
    mirrored = isinstance(inner, tf.distribute.DistributedValues)
    local = inner.values[0] if mirrored else inner
    arr = np.asarray(local.numpy() if hasattr(local, "numpy") else local)
    out = summarise(name, arr, budget, full_values)
    out.update({"mirrored": mirrored, "variable_type": type(inner).__name__})
    return out


def summarise(name: str, arr: ArrayLike, budget: list[int], full_values: int) -> VariableRow:
    """One array's checksums (numpy only): exact hash, float64 sum / sum of squares / min /
    max, values at fixed positions, and all values when it is small enough (``budget[0]``:
    how many values this task may still send whole)."""
    import numpy as np

    arr = np.asarray(arr)
    out: VariableRow = {
        "name": name, "dtype": str(arr.dtype), "shape": list(arr.shape), "size": int(arr.size),
        "sha": hashlib.sha256(f"{arr.dtype.str}{arr.shape}".encode() +
                              np.ascontiguousarray(arr).tobytes()).hexdigest()[:16],
    }
    if arr.dtype.kind not in "fiub":
        return out
    flat = arr.astype(np.float64).ravel()
    finite = flat[np.isfinite(flat)]
    out["nonfinite"] = int(flat.size - finite.size)
    if finite.size:
        out.update({"sum": float(finite.sum()), "sumsq": float((finite * finite).sum()),
                    "min": float(finite.min()), "max": float(finite.max())})
    if flat.size:
        idx = np.unique(np.linspace(0, flat.size - 1, min(SAMPLES, flat.size)).astype(int))
        out["samples"] = [(int(i), _num(flat[i])) for i in idx]
    if flat.size <= full_values and flat.size <= budget[0]:
        budget[0] -= flat.size
        out["values"] = [_num(x) for x in flat]
    return out


def _num(x: float) -> float | str:
    import math

    return float(x) if math.isfinite(x) else str(x)  # JSON has no NaN / Infinity


def variable_checksums(expr: str, full_values: int = FULL_VALUES) -> Checksums:
    """Per variable of EXPR on this task: name, dtype, shape, whether it is mirrored, an exact
    hash of its bytes, float64 sum / sum of squares / min / max, a few values at fixed
    positions, and the whole value when it has at most ``full_values`` elements (and the
    task's total stays within 16 times that)."""
    try:
        found = _collect(evaluate(expr))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    seen: dict[str, int] = {}
    budget = [max(FULL_TOTAL, 16 * full_values)]
    rows = []
    for name, var in found:
        seen[name] = seen.get(name, 0) + 1
        key = name if seen[name] == 1 else f"{name} #{seen[name]}"
        rows.append(_summary(key, var, budget, full_values))
    strategy = find_strategy()
    return {"variables": rows,
            "strategy": type(strategy).__name__ if strategy is not None else None}
