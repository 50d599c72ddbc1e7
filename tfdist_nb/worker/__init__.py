"""What user code inside a worker kernel can import (SPEC 2.3): ``import tfdist_nb.worker as tw``.

Runs inside worker kernels only; it imports nothing of the controller and not TensorFlow itself
(Keras is imported lazily by :class:`StepTimer`), so loading it costs nothing before the user's
``import tensorflow``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["StepTimer", "step", "steps_done", "task"]


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
_last_step_s: float | None = None


def steps_done() -> int:
    """How many steps this task has completed (``tw.step()`` blocks and Keras batches)."""
    return _steps


def _record_step(duration_s: float) -> None:
    global _steps, _last_step_s
    _steps += 1
    _last_step_s = duration_s


@contextlib.contextmanager
def step() -> Iterator[None]:
    """Mark one training step of a custom loop: ``with tw.step(): strategy.run(...)``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        _record_step(time.perf_counter() - start)


def StepTimer(**kwargs: Any) -> Any:
    """A Keras callback counting and timing each training batch on this task.

    Built lazily against whichever Keras the task runs (tf_keras or Keras 3), so importing this
    module never imports Keras.
    """
    from tfdist_nb.worker._keras import make_step_timer

    return make_step_timer(**kwargs)
