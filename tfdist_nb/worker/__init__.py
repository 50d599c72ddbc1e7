"""What user code inside a worker kernel can import (docs/reference.md, Worker side):
``import tfdist_nb.worker as tw``.

Runs inside worker kernels only; it imports nothing of the controller and not TensorFlow itself
(Keras is imported lazily by :class:`StepTimer`), so loading it costs nothing before the user's
``import tensorflow``.
"""

from __future__ import annotations

import contextlib
import sys
import time
import types
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

from tfdist_nb.worker import inject as _inject
from tfdist_nb.worker import state as _state

T = TypeVar("T")

__all__ = ["StepTimer", "set_total_steps", "step", "steps_done", "task", "timed"]

if TYPE_CHECKING:
    import tensorflow as tf

    #: this task's ``(role, index)``, e.g. ``("worker", 1)``; None in a spare not yet adopted
    task: tuple[str, int] | None


class _WorkerModule(types.ModuleType):
    """This module, whose ``task`` attribute is the identity held in :mod:`.state` (its one
    owner): read as ``tw.task``, and an assignment to ``tw.task`` (the isolate prelude's)
    changes it for the whole worker side."""

    @property
    def task(self) -> tuple[str, int] | None:
        return _state.get_task()

    @task.setter
    def task(self, value: tuple[str, int] | None) -> None:
        _state.set_task(value)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), "task"})


sys.modules[__name__].__class__ = _WorkerModule


def steps_done() -> int:
    """How many steps this task has completed (``tw.step()`` blocks and Keras batches)."""
    return _state.steps


def set_total_steps(total: int | None) -> None:
    """Tell the dashboard how many steps to expect, for a progress bar."""
    if _state.telemetry is not None:
        _state.telemetry.total_steps = total


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


def StepTimer(**kwargs: object) -> tf.keras.callbacks.Callback:
    """A Keras callback counting and timing each training batch on this task.

    Built lazily against whichever Keras the task runs (tf_keras or Keras 3), so importing this
    module never imports Keras.
    """
    from tfdist_nb.worker._keras import make_step_timer

    return make_step_timer(None, **kwargs)
