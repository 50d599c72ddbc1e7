"""Keras integration inside a worker: the step-timing callback, for tf_keras or Keras 3."""

from __future__ import annotations

import os
import time
from typing import Any


def keras_module() -> Any:
    """The Keras that ``tf.keras`` resolves to in this process (tf_keras when legacy is asked)."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes"):
        import tf_keras

        return tf_keras
    import keras

    return keras


def make_step_timer(**kwargs: Any) -> Any:
    from tfdist_nb import worker

    base = keras_module().callbacks.Callback

    class StepTimer(base):  # type: ignore[misc, valid-type]
        """Counts and times every training batch; tfdist_nb reads the counts."""

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            worker._record_step(time.perf_counter() - getattr(self, "_t0", time.perf_counter()))

    return StepTimer(**kwargs)
