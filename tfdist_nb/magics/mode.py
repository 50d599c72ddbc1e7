"""Persistent mode (docs/reference.md, Magics: ``%tfdist_mode``; ipyparallel's ``%autopx``).

An input transformer in ``input_transformers_cleanup``, which runs before the cell-magic
detection, so the cell the user wrote is what the tasks run, line numbers included. Cells that
begin with a tfdist_nb magic or (un/re)load it still run here: that is how the mode is left.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

OURS = ("%tfdist_", "%tfcluster", "%%tfcluster")
#: unloading or reloading this extension is the notebook's business, never the tasks'
EXTENSION_LINES = [[magic, "tfdist_nb"] for magic in ("%unload_ext", "%reload_ext")]


class PersistentMode:
    """The mode of one notebook shell: off, or on with the ``%%tfcluster`` options to use."""

    def __init__(self) -> None:
        self.options: str | None = None  # None: off
        self._shell: InteractiveShell | None = None

    @property
    def on(self) -> bool:
        return self.options is not None

    def turn_on(self, shell: InteractiveShell, options: str) -> None:
        self.options = options
        if self._shell is None:
            shell.input_transformers_cleanup.append(self.transform)
            self._shell = shell

    def turn_off(self) -> None:
        self.options = None
        if self._shell is not None:
            with contextlib.suppress(ValueError):
                self._shell.input_transformers_cleanup.remove(self.transform)
            self._shell = None

    def transform(self, lines: list[str]) -> list[str]:
        """A cell's lines, sent to the cluster unless the mode is off or the cell begins with
        one of tfdist_nb's magics (or is empty)."""
        if self.options is None:
            return lines
        first = next((line.strip() for line in lines if line.strip()), "")
        if not first or first.startswith(OURS) or first.split()[:2] in EXTENSION_LINES:
            return lines
        return [f"%%tfcluster {self.options} --from-mode\n".replace("  ", " "), *lines]
