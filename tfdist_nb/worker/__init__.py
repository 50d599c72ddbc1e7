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
from tfdist_nb.worker import state as _state

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


def steps_done() -> int:
    """How many steps this task has completed (``tw.step()`` blocks and Keras batches)."""
    return _state.steps


def set_total_steps(total: int | None) -> None:
    """Tell the dashboard how many steps to expect, for a progress bar."""
    if _state.telemetry is not None:
        _state.telemetry.set_total(total)


@contextlib.contextmanager
def step() -> Iterator[None]:
    """Mark one training step of a custom loop: ``with tw.step(): strategy.run(...)``.

    Time spent fetching the batch through :func:`timed` just before counts as its input wait.
    """
    wait, _state.input_wait_s = _state.input_wait_s, None
    entry, _state.input_entry = _state.input_entry, None
    if _inject._faults:
        _inject.before_step(_state.steps, timed_input=wait is not None)
    begin = time.time()
    start = time.perf_counter()
    try:
        yield
    finally:
        _state.record_step(begin, time.perf_counter() - start, wait, entry)


def timed(iterable: Iterable[T]) -> Iterator[T]:
    """Iterate ``iterable`` measuring the time each ``next()`` takes: the step's input wait.

    ``for x, y in tw.timed(dist_dataset): with tw.step(): train_step(x, y)``
    """
    iterator = iter(iterable)
    while True:
        if _inject._faults:
            if _inject.data_ended(_state.steps):
                return
            _inject.before_input()
        _state.input_entry = time.time()
        start = time.perf_counter()
        try:
            item = next(iterator)
        except StopIteration:
            return
        _state.input_wait_s = time.perf_counter() - start
        yield item


def StepTimer(**kwargs: Any) -> Any:
    """A Keras callback counting and timing each training batch on this task.

    Built lazily against whichever Keras the task runs (tf_keras or Keras 3), so importing this
    module never imports Keras.
    """
    from tfdist_nb.worker._keras import make_step_timer

    return make_step_timer(None, **kwargs)
