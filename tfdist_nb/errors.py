"""One error hierarchy, so callers can catch tfdist_nb's failures apart from their own."""

from __future__ import annotations


class TfdistError(Exception):
    """Base class of every error tfdist_nb raises on purpose."""


class SpecError(TfdistError, ValueError):
    """A cluster SPEC or task list that cannot be understood (the user's mistake)."""


class ClusterStartError(TfdistError, RuntimeError):
    """A task could not be started; everything already started has been stopped."""


class ClusterNotRunningError(TfdistError, RuntimeError):
    """An operation needs a running cluster and there is none."""


class AgentError(TfdistError, RuntimeError):
    """A call into a task's worker agent raised there (or got no usable answer)."""


class TaskError(TfdistError, RuntimeError):
    """One or more tasks of a run did not finish cleanly: raised by ``%%tfcluster`` so "Run
    All" stops, rendered as one line since the tasks' tracebacks were shown already."""

    def __init__(self, message: str, result: object = None) -> None:
        super().__init__(message)
        self.result = result

    def _render_traceback_(self) -> list[str]:
        return [f"TaskError: {self}"]


#: why this platform cannot run a cluster, said at %load_ext and Cluster(): the package is
#: built on POSIX processes, Unix sockets and /proc (docs/reference.md, Platforms)
WINDOWS = ("tfdist_nb runs on Linux and macOS, not on native Windows (it needs POSIX "
           "processes and Unix sockets): install WSL2 (wsl --install), then follow the README's "
           "two commands in its Ubuntu shell")


def platform_refusal(platform: str | None = None) -> str | None:
    """What to say on a platform the package does not run on, else None."""
    import sys

    return WINDOWS if (platform or sys.platform) == "win32" else None
