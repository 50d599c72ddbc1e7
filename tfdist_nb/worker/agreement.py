"""The manifest check (docs/reference.md, "Collectives and hangs"): before a traced function
first runs, the tasks compare its collectives through TensorFlow's coordination service.

TensorFlow pairs collectives by keys handed out in the order they run, not by what they are, so
one extra all-reduce on one task pairs with another task's next step and computes wrong numbers
before anything hangs. The wait is a ``check`` ledger row, so the hang rules see a task stuck in
it; it gives up after ``WAIT_S`` (the function may run on one task only) or on an abort.
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

from tfdist_nb.events import describe_tensor
from tfdist_nb.topology import task_order
from tfdist_nb.worker import state
from tfdist_nb.worker.ledger import ABORT, LEDGER, CollectiveMismatchError, Op

if TYPE_CHECKING:  # never at run time: the worker imports TensorFlow only when the cell does
    import tensorflow as tf
    from tensorflow.python.eager.context import Context

logger = logging.getLogger(__name__)
WAIT_S = 30.0
POLL_MS = 250
_counts: dict[str, int] = {}  # functions of each name checked so far (the same on every task)
_checked: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()  # tf.functions
_disabled: list[str] = []  # why the check is off on this task (no coordination service)


class Entry(NamedTuple):
    """One collective of a function's manifest, as the tasks compare it (a JSON array through
    the coordination service)."""

    kind: str
    dtype: str
    shape: list[int | None] | None  # None: rank unknown
    group_size: int | None
    where: str  # cell N line L


def _entries(payload: str) -> list[Entry]:
    return [Entry(*e) for e in json.loads(payload)]


def members() -> list[str]:
    """The tasks MWMS runs collectives among: the chief and the workers of TF_CONFIG."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", ""))["cluster"]
    except (ValueError, KeyError, TypeError):
        return []
    # built in task_order already (chief first, then the workers by index); the roles are MWMS's
    # own, not topology.ROLES: ps and evaluator tasks take part in no collective
    return [f"{role}:{i}" for role in ("chief", "worker")
            for i in range(len(cluster.get(role, [])))]


def check(graph: tf.Graph, name: str, ops: list[Op],
          owner: tf.types.experimental.PolymorphicFunction | None = None) -> None:
    """Compare ``ops`` (the manifest of ``name`` at its first run) with the other tasks';
    raises CollectiveMismatchError on a difference. Only the first trace of ``owner`` (the
    ``tf.function``) is compared: a retrace (a short last batch) can happen on one task alone,
    and waiting for the others' would stall a healthy run."""
    everyone, mine = members(), state.task_name()
    if _disabled or mine not in everyone or len(everyone) < 2:
        return
    if not any(op.group_size and op.group_size > 1 for op in ops):
        return
    if owner is not None:
        if owner in _checked:
            return
        _checked[owner] = True
    nth = _counts.get(name, 0)
    _counts[name] = nth + 1
    key = f"tfdist/manifest/{name}/{nth}"
    from tensorflow.python.eager import context

    ctx = context.context()
    payload = json.dumps([[*op.signature(), op.where] for op in ops])
    try:
        ctx.set_config_key_value(f"{key}/{mine}", payload)
    except Exception as exc:  # no coordination service here: nothing to compare through
        logger.debug("the manifest check is off on this task", exc_info=True)
        _disabled.append(f"{type(exc).__name__}: {exc}")
        return
    others = [t for t in everyone if t != mine]
    from tfdist_nb.worker import cellmap

    row = LEDGER.enter([Op("check", len(everyone), None, "", None, None,
                           cellmap.main_thread_site())], name, members=others, check=key)
    try:
        theirs = _collect(ctx, key, others)
    except BaseException:
        LEDGER.close(row, "failed")
        raise
    LEDGER.close(row)
    manifests = {mine: _entries(payload), **theirs}
    LEDGER.traced(ops, name, key, difference_at(manifests))
    if (said := first_difference(name, manifests)) is not None:
        raise CollectiveMismatchError(said)


def _collect(ctx: Context, key: str, others: list[str]) -> dict[str, list[Entry]]:
    import time

    from tensorflow.python.framework import errors

    found: dict[str, list[Entry]] = {}
    deadline = time.monotonic() + WAIT_S
    while len(found) < len(others) and time.monotonic() < deadline:
        if ABORT.is_set():
            raise RuntimeError("tfdist_nb: the collectives were aborted while this task "
                               "waited for the others to reach the same tf.function")
        for task in others:
            if task in found:
                continue
            try:
                found[task] = _entries(ctx.get_config_key_value(f"{key}/{task}",
                                                                timeout_in_ms=POLL_MS))
            except errors.DeadlineExceededError:
                continue
            except errors.OpError:  # the service is gone (the chief died): others will say it
                return found
    return found


def difference_at(manifests: dict[str, list[Entry]]) -> int | None:
    """The first position (from 0) where the tasks' manifests differ, or None."""
    tasks = sorted(manifests, key=task_order)
    for i in range(max(len(m) for m in manifests.values())):
        got = [manifests[t][i] if i < len(manifests[t]) else None for t in tasks]
        if not all(_agree(got[0], e) for e in got):
            return i
    return None


def first_difference(name: str, manifests: dict[str, list[Entry]]) -> str | None:
    """The sentence naming where the tasks' manifests of ``name`` first differ, or None; the
    same on every task. Entries are ``[kind, dtype, shape, group_size, where]``."""
    tasks = sorted(manifests, key=task_order)
    i = difference_at(manifests)
    if i is not None:
        got = {t: manifests[t][i] if i < len(manifests[t]) else None for t in tasks}
        per_task = "; ".join(
            f"{t}: " + (f"{e[0]} {describe_tensor(e[1], e[2])} at {e[4]}" if e else
                        f"none (it issues {len(manifests[t])})") for t, e in got.items())
        counts = {len(m) for m in manifests.values()}
        shapes = {json.dumps(e[2]) for e in got.values() if e}
        if len(counts) > 1 or any(e is None for e in got.values()):
            cause = ("a Python branch that depends on the task (tw.task, TF_CONFIG, the task's "
                     "data) adds or drops a collective on some tasks")
        elif len(shapes) > 1:
            cause = ("a shape that depends on the task (a per-task batch size or data) makes "
                     "the tensors differ")
        else:
            cause = "the function traces different collectives on different tasks"
        return (f"tf.function '{name}' issues different collectives on different tasks: "
                f"collective {i + 1} — {per_task}. Likely cause: {cause}; every task must "
                "trace the same collectives in the same order. Found before its first run, "
                "so none of them ran.")
    return None


def _agree(a: Entry | None, b: Entry | None) -> bool:
    """Same kind, dtype and group, and shapes that can be the same at run time (a dimension
    unknown at trace time matches any)."""
    if a is None or b is None:
        return a is b
    if a[0] != b[0] or a[1] != b[1] or a[3] != b[3]:
        return False
    if a[2] is None or b[2] is None:
        return True
    return len(a[2]) == len(b[2]) and all(x is None or y is None or x == y
                                          for x, y in zip(a[2], b[2], strict=True))
