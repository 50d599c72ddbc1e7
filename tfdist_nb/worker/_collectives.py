"""When this task enters each collective of a step, for the straggler finder.

The task the others wait for is the one that enters the collectives last, whatever made it late
(a sleep, a slower GPU, a busy host, its input). Each eager all-reduce launch
(``CollectiveReplicaLauncher.all_reduce``, which every MWMS reduce and batch reduce goes through)
stamps its entry time; the controller lines the stamps up across tasks by their order in the
step. Inside a ``tf.function`` the launch happens at trace time only, so a compiled step shows
just its input fetch's stamp (see ``_tfdata``).
"""

from __future__ import annotations

import functools
import time
from types import ModuleType
from typing import Any

from tfdist_nb.worker.hooks import after_import

CROSS_DEVICE_UTILS = "tensorflow.python.distribute.cross_device_utils"


PART = "collectives"
STOPS = "straggler detection from collective entry times in eager custom loops"


def patch_cross_device_utils(module: ModuleType) -> bool:
    """Stamp each eager all-reduce launch; False if already done. Raises AttributeError when
    ``CollectiveReplicaLauncher.all_reduce`` is gone (another TensorFlow release)."""
    launcher = getattr(module, "CollectiveReplicaLauncher", None)
    method = getattr(launcher, "all_reduce", None)
    if method is None:
        raise AttributeError(f"{module.__name__}.CollectiveReplicaLauncher.all_reduce not found")
    if getattr(method, "_tfdist_stamped", False):
        return False
    from tensorflow.python.eager import context

    from tfdist_nb import worker

    @functools.wraps(method)
    def stamped_all_reduce(self: Any, *args: Any, **kwargs: Any) -> Any:
        if context.executing_eagerly():
            worker._entered_collective(time.time())
        return method(self, *args, **kwargs)

    stamped_all_reduce._tfdist_stamped = True  # type: ignore[attr-defined]
    launcher.all_reduce = stamped_all_reduce
    return True


def install() -> None:
    from tfdist_nb import worker

    after_import((CROSS_DEVICE_UTILS,), patch_cross_device_utils,
                 on_error=functools.partial(worker._instrumentation_failed, PART, STOPS))
