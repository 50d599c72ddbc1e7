"""Post-import hooks: run a function right after a module is imported, whichever cell does it.

The worker patches Keras (``model.fit`` step timing) and tf.distribute's input iterators (local
fetch timing) this way, so importing ``tfdist_nb.worker`` imports neither.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


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


def after_import(names: tuple[str, ...], hook: Callable[[ModuleType], Any]) -> None:
    """Call ``hook`` on each of ``names`` now if loaded, and when imported later (once)."""
    for name in names:
        if name in sys.modules:
            with contextlib.suppress(Exception):
                hook(sys.modules[name])
    if not any(isinstance(f, _AfterImport) and f.names == names and f.hook is hook
               for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(names, hook))
