"""The local part of a distributed input fetch, timed apart from the synchronised part.

Under MultiWorkerMirroredStrategy ``next(distributed_iterator)`` first takes this task's batch
from its own tf.data pipeline, then all-reduces "do all tasks have data?" with the others. The
whole call lasts equally long on every task (the fast ones wait in the all-reduce for the slow
one), so a task with a slow input pipeline is invisible in the input wait. Timing the local fetch
alone shows it, and when it finished is when this task really reached the step's first
synchronisation point. Only eager calls are timed (the usual ``next(iterator)`` outside
``tf.function``); inside a traced function the patched method runs once, at trace time.
"""

from __future__ import annotations

import functools
import time
from types import ModuleType
from typing import Any

from tfdist_nb.worker.hooks import after_import

INPUT_LIB = "tensorflow.python.distribute.input_lib"
_METHODS = ("get_next_as_optional_list", "get_next_as_list")


def _timed(method: Any, executing_eagerly: Any) -> Any:
    from tfdist_nb.worker import state

    @functools.wraps(method)
    def timed_fetch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not executing_eagerly():
            return method(self, *args, **kwargs)
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            state.local_fetch(time.perf_counter() - start)

    timed_fetch._tfdist_timed = True  # type: ignore[attr-defined]
    return timed_fetch


PART = "tfdata"
STOPS = ("timing this task's own tf.data fetch apart from the all-reduce (input-bound "
         "stragglers of distributed datasets)")


def patch_input_lib(module: ModuleType) -> bool:
    """Time the per-worker iterators' fetches in ``input_lib``. Raises AttributeError when
    ``input_lib`` no longer has the class or methods (another TensorFlow release)."""
    base = getattr(module, "_SingleWorkerDatasetIteratorBase", None)
    if base is None:
        raise AttributeError(f"{module.__name__}._SingleWorkerDatasetIteratorBase not found")
    from tensorflow.python.eager import context

    found = [name for name in _METHODS if getattr(base, name, None) is not None]
    if not found:
        raise AttributeError(f"{module.__name__}._SingleWorkerDatasetIteratorBase has none of "
                             f"{', '.join(_METHODS)}")
    for name in found:
        method = getattr(base, name)
        if not getattr(method, "_tfdist_timed", False):
            setattr(base, name, _timed(method, context.executing_eagerly))
    return True


def install() -> None:
    from tfdist_nb.worker import state

    after_import((INPUT_LIB,), patch_input_lib,
                 on_error=functools.partial(state.instrumentation_failed, PART, STOPS))
