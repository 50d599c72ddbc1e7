"""What user code inside a worker kernel can import (docs/reference.md, Worker side):
``import tfdist_nb.worker as tw``.

Runs inside worker kernels only; it imports nothing of the controller and not TensorFlow itself
(Keras is imported lazily by :class:`StepTimer`), so loading it costs nothing before the user's
``import tensorflow``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tfdist_nb.worker import inject as _inject

T = TypeVar("T")

__all__ = ["StepTimer", "set_total_steps", "step", "steps_done", "task", "timed"]


def _task_from_env() -> tuple[str, int] | None:
    """This process's ``(role, index)``: from TFDIST_TASK (set by every launcher) or TF_CONFIG."""
    named = os.environ.get("TFDIST_TASK")
    if named and ":" in named:
        role, _, index = named.partition(":")
        return role, int(index)
    try:
        cfg = json.loads(os.environ.get("TF_CONFIG", ""))
        return cfg["task"]["type"], int(cfg["task"]["index"])
    except (ValueError, KeyError, TypeError):
        return None


task: tuple[str, int] | None = _task_from_env()
_steps = 0
_input_wait_s: float | None = None
_input_entry: float | None = None  # wall time at which the step's batch was asked for
_fetch_s = 0.0  # this step's local tf.data fetch time so far (see worker._tfdata)
_fetch_done: float | None = None  # wall time at which the last local fetch returned
_syncs: list[float] = []  # when this step's eager collectives were entered (see _collectives)
MAX_SYNCS = 16
_telemetry: Any = None  # set by tfdist_nb.worker.agent when running inside a worker kernel
# what could not be instrumented on this task, "part" -> "ExcType: message" (agent.describe and
# every telemetry sample carry it, so the controller can flag the task)
instrumentation_errors: dict[str, str] = {}


def steps_done() -> int:
    """How many steps this task has completed (``tw.step()`` blocks and Keras batches)."""
    return _steps


def set_total_steps(total: int | None) -> None:
    """Tell the dashboard how many steps to expect, for a progress bar."""
    if _telemetry is not None:
        _telemetry.set_total(total)


def _note(text: str, level: str = "INFO") -> None:
    """Tell the controller something this task found (it becomes an alert for WARNING)."""
    if _telemetry is not None:
        _telemetry.note(text, level)


def _instrumentation_failed(part: str, stops: str, exc: BaseException) -> None:
    """A patch of TensorFlow or Keras could not be installed (a private name moved in another
    release): said once per task and part, as a WARNING note (an alert in the controller), since
    the detection that needs it silently stops otherwise (docs/design.md, "Findings from inside
    the task")."""
    if part in instrumentation_errors:
        return
    error = f"{type(exc).__name__}: {exc}"
    instrumentation_errors[part] = error
    _note(f"tfdist_nb could not instrument {part} on this task ({error}); not available on this "
          f"task: {stops} (training itself is unaffected)", "WARNING")


def _local_fetch(seconds: float) -> None:
    """A distributed iterator took this task's batch from its own pipeline in ``seconds``."""
    global _fetch_s, _fetch_done
    _fetch_s += seconds
    _fetch_done = time.time()


def _entered_collective(at: float) -> None:
    if len(_syncs) < MAX_SYNCS:
        _syncs.append(at)


def _record_step(begin: float, duration_s: float, input_wait_s: float | None = None,
                 entry: float | None = None) -> None:
    """``entry``: when this task arrived at the step's first synchronisation point (it asked
    for the batch, or began the step); the straggler is the task that arrives last. When a
    distributed iterator fetched the batch, the arrival is when the local fetch returned: the
    all-reduce that follows it is the first synchronisation point."""
    global _steps, _fetch_s, _fetch_done, _syncs
    _steps += 1
    fetch_s, fetch_done, syncs = _fetch_s, _fetch_done, _syncs
    _fetch_s, _fetch_done, _syncs = 0.0, None, []
    if _telemetry is not None:
        arrival = fetch_done if fetch_done is not None else (entry or begin)
        _telemetry.record_step(begin, duration_s, input_wait_s, arrival,
                               fetch_s if fetch_done is not None else None, syncs)


@contextlib.contextmanager
def step() -> Iterator[None]:
    """Mark one training step of a custom loop: ``with tw.step(): strategy.run(...)``.

    Time spent fetching the batch through :func:`timed` just before counts as its input wait.
    """
    global _input_wait_s, _input_entry
    wait, _input_wait_s = _input_wait_s, None
    entry, _input_entry = _input_entry, None
    if _inject._faults:
        _inject.before_step(_steps, timed_input=wait is not None)
    begin = time.time()
    start = time.perf_counter()
    try:
        yield
    finally:
        _record_step(begin, time.perf_counter() - start, wait, entry)


def timed(iterable: Iterable[T]) -> Iterator[T]:
    """Iterate ``iterable`` measuring the time each ``next()`` takes: the step's input wait.

    ``for x, y in tw.timed(dist_dataset): with tw.step(): train_step(x, y)``
    """
    global _input_wait_s, _input_entry
    iterator = iter(iterable)
    while True:
        if _inject._faults:
            if _inject.data_ended(_steps):
                return
            _inject.before_input()
        _input_entry = time.time()
        start = time.perf_counter()
        try:
            item = next(iterator)
        except StopIteration:
            return
        _input_wait_s = time.perf_counter() - start
        yield item


def StepTimer(**kwargs: Any) -> Any:
    """A Keras callback counting and timing each training batch on this task.

    Built lazily against whichever Keras the task runs (tf_keras or Keras 3), so importing this
    module never imports Keras.
    """
    from tfdist_nb.worker._keras import make_step_timer

    return make_step_timer(None, **kwargs)
