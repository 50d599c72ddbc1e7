"""What the code decided quietly, for a maintainer to see: module loggers under ``tfdist_nb``,
written to stderr only when ``$TFDIST_LOG`` is set (docs/reference.md, Environment); the tasks
inherit it. An exception swallowed on purpose goes through :class:`swallowed`, so it is logged.
"""

from __future__ import annotations

import logging
import os
from types import TracebackType

ROOT = "tfdist_nb"
_configured: list[str] = []


def configure_from_env() -> None:
    """Attach a stderr handler to the ``tfdist_nb`` loggers at ``$TFDIST_LOG``'s level, once."""
    level = os.environ.get("TFDIST_LOG", "").strip().upper()
    if not level or _configured:
        return
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        level = "DEBUG"
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("tfdist_nb %(levelname)s %(name)s "
                                           "(%(filename)s:%(lineno)d): %(message)s"))
    root = logging.getLogger(ROOT)
    root.addHandler(handler)
    root.setLevel(level)
    _configured.append(level)


class swallowed:
    """``contextlib.suppress`` that logs what it swallows at DEBUG, naming the line."""

    def __init__(self, logger: logging.Logger,
                 *types: type[BaseException]) -> None:
        self.logger = logger
        self.types = types or (Exception,)

    def __enter__(self) -> swallowed:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if kind is None or not issubclass(kind, self.types):
            return False
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("swallowed %s: %s", kind.__name__, exc,
                              exc_info=(kind, exc, tb) if exc is not None else None,
                              stacklevel=2)
        return True


configure_from_env()
