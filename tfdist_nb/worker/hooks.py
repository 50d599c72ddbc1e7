"""Post-import hooks: run a function right after a module is imported, whichever cell does it.

So importing ``tfdist_nb.worker`` imports neither Keras nor TensorFlow. A hook that fails (a
private name moved in another release) never breaks the user's import: ``on_error`` tells the
user once (docs/design.md, "Findings from inside the task").
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from tfdist_nb.debuglog import swallowed

logger = logging.getLogger(__name__)

OnError = Callable[[BaseException], None]
#: set on every method tfdist_nb put in place of TensorFlow's or Keras's own
PATCHED = "_tfdist_patched"


def replace_method(module: ModuleType, cls_name: str, name: str,
                   wrap: Callable[[Callable[..., object]], Callable[..., object]]) -> bool:
    """Put ``wrap(method)`` (it keeps the method's name and docstring, and is marked as
    tfdist_nb's) in place of ``module.cls_name.name``: True; False when tfdist_nb replaced it
    already. Raises AttributeError, naming what is missing, when this release has no such
    method (said to the user by the hook's ``on_error``)."""
    cls = getattr(module, cls_name, None)
    method = getattr(cls, name, None)
    if method is None:
        raise AttributeError(f"{module.__name__}.{cls_name}.{name} not found")
    if getattr(method, PATCHED, False):
        return False
    replacement = functools.wraps(method)(wrap(method))
    setattr(replacement, PATCHED, True)
    setattr(cls, name, replacement)
    return True


def _run(hook: Callable[[ModuleType], object], module: ModuleType, on_error: OnError) -> None:
    try:
        hook(module)
    except Exception as exc:  # never break the user's import; say it instead
        with swallowed(logger):  # reporting must not break the import either
            on_error(exc)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hook(module)`` right after module ``name`` has been imported."""

    def __init__(self, name: str, hook: Callable[[ModuleType], object],
                 on_error: OnError) -> None:
        self.name = name
        self.hook = hook
        self.on_error = on_error
        self._busy = False

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if name != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _HookedLoader(spec.loader, self.hook, self.on_error)
        return spec


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, hook: Callable[[ModuleType], object],
                 on_error: OnError) -> None:
        self._loader = loader
        self._hook = hook
        self._on_error = on_error

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run(self._hook, module, self._on_error)


def instrument(part: str, stops: str, hooks: dict[str, Callable[[ModuleType], object]]) -> None:
    """Call each hook on its module now if loaded, and when it is imported later (once); what
    one raises is said once as ``part`` not instrumented on this task, ``stops`` what is lost
    (:func:`tfdist_nb.worker.state.instrumentation_failed`)."""
    from tfdist_nb.worker import state

    on_error = functools.partial(state.instrumentation_failed, part, stops)
    for name, hook in hooks.items():
        if name in sys.modules:
            _run(hook, sys.modules[name], on_error)
        if not any(isinstance(f, _AfterImport) and f.name == name and f.hook is hook
                   for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(name, hook, on_error))
