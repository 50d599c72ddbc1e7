"""The local part of a distributed input fetch, timed apart from the synchronised part.

Under MultiWorkerMirroredStrategy ``next(distributed_iterator)`` takes this task's batch, then
all-reduces "do all tasks have data?": the whole call lasts as long on every task, hiding a slow
input pipeline. The local fetch alone shows it, and its end is when the task reached the step's
first synchronisation point. Only eager calls are timed (a traced one runs once, at trace time).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from types import ModuleType

from tfdist_nb.worker.hooks import instrument

INPUT_LIB = "tensorflow.python.distribute.input_lib"
_METHODS = ("get_next_as_optional_list", "get_next_as_list")


def _timed(method: Callable[..., object], executing_eagerly: Callable[[], bool],
           ) -> Callable[..., object]:
    from tfdist_nb.worker import state

    @functools.wraps(method)
    def timed_fetch(self: object, *args: object, **kwargs: object) -> object:
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
    instrument(PART, STOPS, {INPUT_LIB: patch_input_lib})
