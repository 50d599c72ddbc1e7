"""Keras inside a worker: the step-timing callback, added to every ``model.fit`` automatically.

Works for tf_keras and Keras 3. The callback is added through a post-import hook on ``keras`` /
``tf_keras``, so it is in place whichever cell imports Keras first, and importing this module
imports no Keras.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

KERAS_PACKAGES = ("keras", "tf_keras")


def keras_module() -> Any:
    """The Keras that ``tf.keras`` resolves to in this process (tf_keras when legacy is asked)."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes"):
        import tf_keras

        return tf_keras
    import keras

    return keras


def make_step_timer(keras: Any = None, **kwargs: Any) -> Any:
    from tfdist_nb import worker

    base = (keras or keras_module()).callbacks.Callback

    class StepTimer(base):  # type: ignore[misc, valid-type]
        """Counts and times every training batch of this task for tfdist_nb."""

        _tfdist_step_timer = True

        def on_train_begin(self, logs: Any = None) -> None:
            params = getattr(self, "params", None) or {}
            steps, epochs = params.get("steps"), params.get("epochs")
            if steps and epochs:
                worker.set_total_steps(worker.steps_done() + int(steps) * int(epochs))

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            from tfdist_nb.worker import inject

            if inject._faults:
                inject.before_step(worker.steps_done(), model=self.model)
            self._t0 = time.perf_counter()
            self._begin = time.time()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            t0 = getattr(self, "_t0", None)
            duration = time.perf_counter() - t0 if t0 is not None else 0.0
            worker._record_step(getattr(self, "_begin", time.time()), duration, None)

    return StepTimer(**kwargs)


def patch_fit(keras: ModuleType) -> bool:
    """Make ``keras.Model.fit`` add a StepTimer unless the caller passed one."""
    model = getattr(keras, "Model", None)
    fit = getattr(model, "fit", None)
    if fit is None or getattr(fit, "_tfdist_patched", False):
        return False

    @functools.wraps(fit)
    def fit_with_step_timer(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) <= 5:  # callbacks is fit's 6th positional parameter in both Kerases
            callbacks = list(kwargs.get("callbacks") or [])
            if not any(getattr(cb, "_tfdist_step_timer", False) for cb in callbacks):
                callbacks.append(make_step_timer(keras))
            kwargs["callbacks"] = callbacks
        return fit(self, *args, **kwargs)

    fit_with_step_timer._tfdist_patched = True  # type: ignore[attr-defined]
    model.fit = fit_with_step_timer
    return True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hook(module)`` right after one of ``names`` has been imported."""

    def __init__(self, names: tuple[str, ...], hook: Callable[[ModuleType], Any]) -> None:
        self.names = names
        self.hook = hook
        self._busy: set[str] = set()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.names or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _HookedLoader(spec.loader, self.hook)
        return spec


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: Callable[[ModuleType], Any]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with contextlib.suppress(Exception):  # never break the user's import
            self._hook(module)


def install() -> None:
    """Patch Keras now if it is loaded, and whenever it is imported later."""
    for name in KERAS_PACKAGES:
        if name in sys.modules:
            patch_fit(sys.modules[name])
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(KERAS_PACKAGES, patch_fit))
