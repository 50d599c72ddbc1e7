"""Fault injection for teaching (``%tfdist_inject``), acting through the user's own training path.

The hooks sit where every training loop passes: ``tw.step()`` and ``tw.timed()`` for custom
loops, the step timer tfdist_nb adds to ``model.fit``. The faults are docs/reference.md's
(``%tfdist_inject``); ``oom`` kills the task with SIGKILL past a limit of its own, as a cgroup's
would, growing in step ``at_step`` (so it dies in the training cell) or at once on a thread.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # never at run time: the worker imports TensorFlow only when the cell does
    import tensorflow as tf

KINDS = ("straggler", "hang", "raise", "uneven", "crash", "nan", "oom", "bad-shard")


class FaultParams(TypedDict, total=False):
    """A fault's parameters (``%tfdist_inject``'s flags that were given)."""

    at_step: int
    seconds: float
    where: str  # the straggler's: "input" or "step"
    limit_mb: float


_faults: dict[str, FaultParams] = {}
_oom_thread: threading.Thread | None = None
mem_limit_mb: float | None = None


def set_fault(kind: str, params: FaultParams) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r}; one of {', '.join(KINDS)}")
    _faults[kind] = params.copy()
    if kind == "oom":
        _start_oom(float(params.get("limit_mb") or 500), at_once=params.get("at_step") is None)
    if kind == "bad-shard":
        _patch_distribute_dataset()
    return f"{kind} armed {params or ''}".strip()


def clear() -> str:
    _faults.clear()
    return "cleared"


class InjectedFault(RuntimeError):
    """What the ``raise`` fault raises."""


def data_ended(steps_done: int) -> bool:
    """The ``uneven`` fault: whether this task's data has run out after ``steps_done`` steps."""
    return _step_reached("uneven", steps_done)


def _step_reached(kind: str, step: int) -> bool:
    fault = _faults.get(kind)
    return fault is not None and step >= int(fault.get("at_step") or 0)


def before_input() -> None:
    fault = _faults.get("straggler")
    if fault and fault.get("where", "input") == "input":
        time.sleep(float(fault.get("seconds") or 0.3))


def before_step(step: int, model: tf.keras.Model | None = None, timed_input: bool = False,
                ) -> None:
    """Called at the start of every step with the number of steps done so far."""
    fault = _faults.get("straggler")
    if fault and (fault.get("where") == "step" or not timed_input):
        time.sleep(float(fault.get("seconds") or 0.3))
    if _step_reached("raise", step):
        _faults.pop("raise")
        raise InjectedFault(f"tfdist_nb injected fault: this task raised at step {step}")
    if _step_reached("crash", step):
        os.kill(os.getpid(), signal.SIGKILL)
    if _step_reached("nan", step) and model is not None:
        _faults.pop("nan")
        model.set_weights([w * float("nan") for w in model.get_weights()])
    if _step_reached("hang", step):
        while "hang" in _faults:  # SIGINT (interrupt) or a clear ends it
            time.sleep(0.1)
    oom = _faults.get("oom")
    if oom is not None and oom.get("at_step") is not None and _step_reached("oom", step):
        _grow_until_killed()  # this step allocates past the limit: the task dies in it


def _start_oom(limit_mb: float, at_once: bool = True) -> None:
    """Set this task's own limit (``limit_mb`` above its RSS now); ``at_once``: start growing
    toward it now, on a thread, else when a step reaches ``at_step`` (:func:`before_step`)."""
    global _oom_thread, mem_limit_mb
    import psutil

    mem_limit_mb = psutil.Process().memory_info().rss / 2**20 + limit_mb
    if at_once:
        _oom_thread = threading.Thread(target=_grow_until_killed, name="tfdist-inject-oom",
                                       daemon=True)
        _oom_thread.start()


def _grow_until_killed() -> None:
    """Allocate 32 MB every 50 ms until the RSS passes this task's limit, then SIGKILL it (as a
    cgroup's limit would); returns only if the fault is cleared first."""
    import psutil

    proc = psutil.Process()
    hoard: list[bytearray] = []
    while "oom" in _faults:
        hoard.append(bytearray(b"x" * (32 * 2**20)))
        if proc.memory_info().rss / 2**20 > (mem_limit_mb or 0):
            _last_heartbeat()
            os.kill(os.getpid(), signal.SIGKILL)  # the limit acts like a cgroup's would
        time.sleep(0.05)


def _last_heartbeat() -> None:
    """Send one sample with the final RSS before dying, as evidence for the crash report."""
    from tfdist_nb.worker import state

    if state.telemetry is not None:
        state.telemetry.flush()
        time.sleep(0.3)  # let the iopub thread put it on the wire


def _patch_distribute_dataset() -> None:
    import tensorflow as tf

    strategy_cls = tf.distribute.Strategy
    original = strategy_cls.experimental_distribute_dataset
    if getattr(original, "_tfdist_bad_shard", False):
        return

    def without_sharding(self: tf.distribute.Strategy, dataset: tf.data.Dataset, *args: object,
                         **kwargs: object) -> object:
        if "bad-shard" in _faults:
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = (
                tf.data.experimental.AutoShardPolicy.OFF)
            dataset = dataset.with_options(options)
        return original(self, dataset, *args, **kwargs)

    without_sharding._tfdist_bad_shard = True  # type: ignore[attr-defined]
    strategy_cls.experimental_distribute_dataset = without_sharding
