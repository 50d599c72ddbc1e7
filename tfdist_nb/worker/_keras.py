"""Keras inside a worker: the step-timing callback, added to every ``model.fit`` automatically.

Works for tf_keras and Keras 3. The callback is added through a post-import hook on ``keras`` /
``tf_keras``, so it is in place whichever cell imports Keras first, and importing this module
imports no Keras.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfdist_nb.worker.hooks import instrument, replace_method

if TYPE_CHECKING:  # never at run time: the worker imports TensorFlow only when the cell does
    import tensorflow as tf

KERAS_PACKAGES = ("keras", "tf_keras")


def keras_module() -> ModuleType:
    """The Keras that ``tf.keras`` resolves to in this process (tf_keras when legacy is asked)."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes"):
        import tf_keras

        return tf_keras
    import keras

    return keras


def make_step_timer(keras: ModuleType | None = None, **kwargs: object,
                    ) -> tf.keras.callbacks.Callback:
    from tfdist_nb.worker import state

    base = (keras or keras_module()).callbacks.Callback

    class StepTimer(base):  # type: ignore[misc, valid-type]
        """Counts and times every training batch of this task for tfdist_nb."""

        _tfdist_step_timer = True

        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, **kw)
            # It never reads ``logs``: so Keras need not convert them each batch, and
            # ParameterServerStrategy (whose logs are RemoteValues) accepts the callback.
            self._supports_tf_logs = True
            self._coordinated = False

        def on_train_begin(self, logs: Mapping[str, object] | None = None) -> None:
            params = getattr(self, "params", None) or {}
            steps, epochs = params.get("steps"), params.get("epochs")
            if steps and epochs and state.telemetry is not None:  # the progress bar
                state.telemetry.total_steps = state.steps + int(steps) * int(epochs)
            import tensorflow as tf

            # With a ClusterCoordinator, fit only schedules the steps on the workers: the time
            # from one batch's end to the next is the step rate (the coordinator's queue makes
            # scheduling wait for the workers), its begin-to-end only the scheduling.
            self._coordinated = bool(getattr(tf.distribute.get_strategy(),
                                             "_should_use_with_coordinator", False))
            self._last_end: float | None = None

        def on_train_batch_begin(self, batch: int, logs: Mapping[str, object] | None = None,
                                 ) -> None:
            from tfdist_nb.worker import inject

            if inject._faults:
                inject.before_step(state.steps, model=self.model)
            self._t0 = time.perf_counter()
            self._begin = time.time()

        def on_train_batch_end(self, batch: int, logs: Mapping[str, object] | None = None,
                               ) -> None:
            t0 = getattr(self, "_t0", None)
            if self._coordinated:
                now, last = time.perf_counter(), getattr(self, "_last_end", None)
                self._last_end = now
                duration = now - (last if last is not None else t0 or now)
            else:
                duration = time.perf_counter() - t0 if t0 is not None else 0.0
            state.record_step(getattr(self, "_begin", time.time()), duration, None)
            from tfdist_nb.worker import inject

            if inject._faults and inject.data_ended(state.steps):
                self.model.stop_training = True  # this task's data ran out (teaching fault)

    return StepTimer(**kwargs)


PART = "keras"
STOPS = "step counting, step times and progress of model.fit (and straggler detection in fit)"


def patch_fit(keras: ModuleType) -> bool:
    """Make ``keras.Model.fit`` add a StepTimer unless the caller passed one; False if it
    already does. Raises AttributeError if this Keras has no ``Model.fit`` to patch."""
    def wrap(fit: Callable[..., object]) -> Callable[..., object]:
        def fit_with_step_timer(self: tf.keras.Model, *args: object, **kwargs: Any) -> object:
            if len(args) <= 5:  # callbacks is fit's 6th positional parameter in both Kerases
                callbacks = list(kwargs.get("callbacks") or [])
                if not any(getattr(cb, "_tfdist_step_timer", False) for cb in callbacks):
                    callbacks.append(make_step_timer(keras))
                kwargs["callbacks"] = callbacks
            return fit(self, *args, **kwargs)
        return fit_with_step_timer

    return replace_method(keras, "Model", "fit", wrap)


def install() -> None:
    """Patch Keras now if it is loaded, and whenever it is imported later."""
    instrument(PART, STOPS, dict.fromkeys(KERAS_PACKAGES, patch_fit))
