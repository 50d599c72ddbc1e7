"""What every magic shares: reading its line, finding the cluster it acts on, and answering the
user's mistakes (the Cluster API's errors for what was asked included) with one UsageError and an
example, never a traceback from deep inside.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import shlex
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic
from IPython.core.magic_arguments import argument, magic_arguments

from tfdist_nb.cluster.registry import current, last_cluster
from tfdist_nb.cluster.state import CannotRun
from tfdist_nb.errors import AgentError, ClusterNotRunningError, SpecError
from tfdist_nb.magics.request import EXAMPLE

if TYPE_CHECKING:
    from tfdist_nb.cluster.facade import Cluster

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")
N = TypeVar("N", int, float)
M = TypeVar("M", bound=Magics)
#: What the Cluster API raises for what the user asked; the magics answer it as a UsageError.
USER_ERRORS: tuple[type[Exception], ...] = (SpecError, ClusterNotRunningError, CannotRun,
                                            AgentError)
NO_CLUSTER = "no cluster is running; start one with\n  %%tfcluster 2 workers"


#: words of a message that already says what to type: the examples would bury it
_SAYS_THE_FIX = ("did you mean", "e.g.", "choose ", "example:")


def usage(exc: Exception | str, example: str = EXAMPLE) -> UsageError:
    """The UsageError a user sees: the message, then ``example`` unless the message already
    names the fix (a typo's "did you mean", a list to choose from)."""
    text = str(exc)
    if any(words in text.lower() for words in _SAYS_THE_FIX):
        return UsageError(text)
    return UsageError(f"{text}\n{example}")


def user_errors(example: str = EXAMPLE,
                *more: type[Exception]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A magic whose user errors (``USER_ERRORS``, and ``more``) end as one UsageError with
    ``example``."""
    caught = USER_ERRORS + more

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def magic(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except caught as exc:
                raise usage(exc, example) from None
        return magic
    return wrap


def magic(example: str, *more: type[Exception]
          ) -> Callable[[Callable[[M, argparse.Namespace], R]], Callable[[M, str], R]]:
    """A line magic called with its line parsed by the ``@argument`` lines under this one; a
    mistake in the line, and the user errors of :func:`user_errors`, are a UsageError with
    ``example``."""
    def wrap(fn: Callable[[M, argparse.Namespace], R]) -> Callable[[M, str], R]:
        @functools.wraps(fn)
        def parsed(self: M, line: str) -> R:
            return fn(self, parse_line(line, outer.parser.parse_args, example))

        outer: Any = magic_arguments()(user_errors(example, *more)(parsed))  # IPython's: untyped
        line_magic(outer)  # records it as a line magic; used bare, it returns it unchanged
        return outer
    return wrap


def parse_line(line: str, parse: Callable[[list[str]], R], example: str = EXAMPLE) -> R:
    """Split like a POSIX shell (quotes group words and are removed), then ``parse`` (a magic's
    parser's); a mistake is a UsageError with ``example``."""
    try:
        return parse(shlex.split(line))
    except ValueError as exc:  # unbalanced quotes
        raise usage(f"cannot read the line: {exc}", example) from None
    except UsageError as exc:
        raise usage(exc, example) from None


def number(kind: type[N], least: float, inclusive: bool = False) -> Callable[[str], N]:
    """An argparse type: a finite number of ``kind`` above ``least`` (or equal to it with
    ``inclusive``); anything else is the option's usage error, not a failure deep inside."""
    bound = f"{'at least' if inclusive else 'above'} {least:g}"

    def read(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < least or (value == least and not inclusive):
            raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number {bound}")
        return value

    read.__name__ = kind.__name__  # argparse names the type in its messages
    return read


POSITIVE_S = number(float, 0.0)
POSITIVE_N = number(int, 1, inclusive=True)
NOT_NEGATIVE = number(float, 0.0, inclusive=True)
NOT_NEGATIVE_N = number(int, 0, inclusive=True)


on_option = argument("--on", metavar="TASKS", default=None,
                     help="tasks to act on: 0,1 | worker:0,ps:0 | all (default)")


def notebook_asks() -> Callable[[str, str, bool], str] | None:
    """What answers the tasks' prompts in this cell: the notebook's input box when the frontend
    takes input for it (ipykernel's ``allow_stdin``: JupyterLab and Notebook do, nbclient does
    not), a terminal's without a kernel; else None (docs/reference.md, Input from the tasks)."""
    from IPython import get_ipython

    from tfdist_nb.cluster.cells import ask_here

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is not None:
        allowed = bool(getattr(kernel, "_allow_stdin", False))
    else:
        allowed = sys.stdin is not None and sys.stdin.isatty()
    return ask_here if allowed else None


def answers_from(commands: str) -> Callable[[str, str, bool], str]:
    """Answers to a task's prompts from ``commands`` instead of a person (``%tfdist_debug
    --commands``): one ``;``-separated command per prompt, shown after it as if typed (``;;``
    stays in its command: pdb's own separator), then end-of-file, which quits pdb."""
    left = [c.strip() for c in re.split(r"(?<!;);(?!;)", commands) if c.strip()]

    def answer(task: str, prompt: str, password: bool) -> str:
        said = left.pop(0) if left else None
        print(f"[{task}] {prompt}{'' if said is None else said}", flush=True)
        if said is None:
            raise EOFError  # the task's prompt reads end-of-file
        return said
    return answer


def require() -> Cluster:
    """The active cluster, or a UsageError saying how to start one."""
    cluster = current()
    if cluster is None:
        raise UsageError(NO_CLUSTER)
    return cluster


def require_any() -> Cluster:
    """The active cluster, or the last one that ran (export works after a stop too)."""
    cluster = current() or last_cluster()
    if cluster is None:
        raise UsageError("no cluster has run here yet; start one with\n  %%tfcluster 2 workers")
    return cluster
