"""A kernel forked from the fork server, made to look like one whose imports ran in it.

The fork server imported TensorFlow before any kernel existed (docs/design.md, "Fork server"),
and that import's set-up stays in every fork: TF's logger found no prompt (``sys.ps1``), so it
sits below INFO writing to the process's stderr (the task's log file, which no cell reads), as
does absl's handler; its warnings filters sit behind the kernel's; and what it printed (the C++
start-up lines, "failed call to cuInit") never reached the task's output. :func:`note` (the
fork's child) remembers that state, :func:`settle` (once the kernel exists) redoes it as a
spawned kernel's import would, :func:`replay` (the handshake) sends what was printed. Outside a
forked kernel they do nothing.
"""

from __future__ import annotations

import logging
import sys
import warnings
import weakref
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    import re

    #: one entry of ``warnings.filters``: action, message, category, module, line
    WarningFilter = tuple[str, re.Pattern[str] | None, type[Warning], re.Pattern[str] | None, int]

logger = logging.getLogger(__name__)


class _Before(TypedDict):
    """What the fork left: the process's own streams, and the handlers made before the fork."""

    stdout: IO[str]
    stderr: IO[str]
    handlers: weakref.WeakSet[logging.Handler]
    tf_handlers: list[logging.Handler]
    filters: list[WarningFilter]


_before: _Before | None = None
#: what the server's imports printed, not yet sent as the task's output
_said = b""
TF_LOGGING = "tensorflow.python.platform.tf_logging"


def note(preload_filters: Sequence[WarningFilter] = (), said: bytes = b"") -> None:
    """Called in a forked child before its kernel starts: what the server's imports left;
    ``preload_filters``, the warnings filters the import of ``preload`` put in front; ``said``,
    what the imports printed (already in the task's process log)."""
    global _before, _said
    _said = said
    handlers = [ref() for ref in list(getattr(logging, "_handlerList", ()))]
    tf_logger = logging.getLogger("tensorflow") if TF_LOGGING in sys.modules else None
    _before = {"stdout": sys.stdout, "stderr": sys.stderr,
               "handlers": weakref.WeakSet(h for h in handlers if h is not None),
               "tf_handlers": list(tf_logger.handlers) if tf_logger is not None else [],
               "filters": list(preload_filters)}


def settle() -> None:
    """Once the kernel's streams and prompts exist: TF's logger set up as its import does in a
    kernel, every handler made before the fork writes where it would have been made, and the
    import's warnings filters go in front."""
    global _before
    before, _before = _before, None
    if before is None:
        return
    try:
        _settle(before)
    except Exception:  # the kernel starts regardless; its logging is then the server's
        logger.debug("a forked kernel's import-time set-up could not be made again",
                     exc_info=True)


def _settle(before: _Before) -> None:
    tf_logging: Any = sys.modules.get(TF_LOGGING)
    if tf_logging is not None and getattr(tf_logging, "_logger", None) is not None:
        tf_logger = logging.getLogger("tensorflow")
        for handler in before["tf_handlers"]:
            tf_logger.removeHandler(handler)
        tf_logger.setLevel(logging.NOTSET)
        tf_logging._logger = None
        tf_logging.get_logger()  # INFO to the kernel's stdout where IPython set sys.ps1
    streams: dict[int, IO[str]] = {id(before["stdout"]): sys.stdout,
                                   id(before["stderr"]): sys.stderr}
    for handler in list(before["handlers"]):
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in streams:
            handler.setStream(streams[id(handler.stream)])
    filters: Any = warnings.filters
    lead = [item for item in before["filters"] if item in filters]
    if lead:
        filters[:] = [*lead, *(item for item in filters if item not in lead)]
        warnings._filters_mutated()  # type: ignore[attr-defined]  # what filterwarnings calls


def replay() -> None:
    """Send what the server's imports printed as this task's output, once: a spawned kernel's
    handshake prints it there while it imports ``preload`` (its process log has it already)."""
    global _said
    said, _said = _said, b""
    if said:
        sys.stderr.write(said.decode(errors="replace"))
        sys.stderr.flush()
