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


def patch_cross_device_utils(module: ModuleType) -> bool:
    launcher = getattr(module, "CollectiveReplicaLauncher", None)
    method = getattr(launcher, "all_reduce", None)
    if method is None or getattr(method, "_tfdist_stamped", False):
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
    after_import((CROSS_DEVICE_UTILS,), patch_cross_device_utils)
