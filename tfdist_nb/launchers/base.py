"""The one launcher contract: where a task's kernel runs and how it is started and ended.

The core knows launchers only through it, by name (:mod:`.registry`); members and defaults:
docs/reference.md, Launchers. The coroutines run on the cluster's event loop thread.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from tfdist_nb.debuglog import swallowed
from tfdist_nb.gpu_plan import Placement
from tfdist_nb.strenum import StrEnum
from tfdist_nb.topology import TaskId

if TYPE_CHECKING:
    from jupyter_client.asynchronous import AsyncKernelClient

logger = logging.getLogger(__name__)

#: how often the one watcher of a task's process asks ``poll`` (every launcher's is cheap)
EXIT_POLL_S = 0.2


@dataclass
class TaskLaunch:
    """What the core asks a launcher to start for one task."""

    task: TaskId
    env: dict[str, str]
    python: str
    log_path: Path
    connection_file: Path
    cwd: str | None = None
    #: modules the task imports at start (TensorFlow): a launcher may import them ahead of time
    preload: tuple[str, ...] = ()


class StopPath(StrEnum):
    """The shutdown step that ended a task (a ``str``: ``report.path == "kill"`` holds)."""

    REQUEST = "request"  # it exited when asked
    KILL = "kill"  # SIGKILL after the grace
    ALREADY_DEAD = "already-dead"  # it was gone before the stop


@dataclass
class StopReport:
    """How a task ended: ``path`` is the shutdown step that worked."""

    task: str
    path: StopPath
    exit_code: int | None
    duration_s: float


@dataclass
class TaskHandle(abc.ABC):
    """A started task: its process and a kernel client for its channels."""

    task: TaskId
    host: str
    pid: int | None
    client: AsyncKernelClient = field(repr=False)
    _exit: asyncio.Future[int] | None = field(default=None, init=False, repr=False,
                                              compare=False)
    #: its kernel was forked from a fork server (docs/design.md, "Fork server"), not spawned
    forked: bool = field(default=False, init=False, compare=False)
    #: what the launcher has to say about how this start went (a WARNING note each, said once)
    notes: list[str] = field(default_factory=list, init=False, repr=False, compare=False)
    #: its ``poll`` reads the kernel's heartbeat channel, which then runs (a thread per task:
    #: docs/performance.md, "The controller at 1,024 tasks")
    heartbeat: ClassVar[bool] = False

    @abc.abstractmethod
    async def poll(self) -> int | None:
        """The exit code (negative: killed by that signal) once the process is gone, else None."""

    def exit_future(self) -> asyncio.Future[int]:
        """The exit code once the process is gone, from one watcher shared by all who wait on
        it. Call it on the loop thread; a stop ends the watch."""
        if self._exit is None:
            self._exit = asyncio.get_running_loop().create_future()
            _WATCHERS.setdefault(asyncio.get_running_loop(), _ExitWatcher()).add(self)
        return self._exit

    def exited(self) -> int | None:
        """The exit code if the watcher has seen the process end, else None (never waits)."""
        future = self.exit_future()
        return future.result() if future.done() else None

    async def check_exit(self) -> int | None:
        """The exit code as of now, asked at once for a decision that cannot wait for the
        watcher's next look; the shared future learns it too."""
        future = self.exit_future()
        return future.result() if future.done() else await self._look(future)

    async def _look(self, exit_code: asyncio.Future[int]) -> int | None:
        """One ``poll``; an exit it finds resolves ``exit_code``."""
        try:
            code = await self.poll()
        except asyncio.CancelledError:
            raise
        except Exception:  # a launcher that cannot tell now; the next look asks again
            logger.debug("%s: poll failed", self.task, exc_info=True)
            return None
        if code is not None and not exit_code.done():
            exit_code.set_result(code)
        return code

    @abc.abstractmethod
    async def interrupt(self) -> None:
        """Deliver the notebook's interrupt (SIGINT) to the task."""

    @abc.abstractmethod
    async def stop(self, grace_s: float) -> StopReport:
        """End the task: shutdown request, at most ``grace_s`` to exit, then SIGKILL."""

    def close_channels(self) -> float:
        """Every stop's first step: close the channels and end the exit watch; the time (a
        stop report's duration counts from it)."""
        for watcher in list(_WATCHERS.values()):  # any thread may stop a task
            watcher.discard(self)
        with swallowed(logger):
            self.client.stop_channels()
        return time.monotonic()

    def describe_exit(self, code: int) -> str:
        """How the task ended, in words (a launcher may know more than the exit code)."""
        from tfdist_nb.diagnostics.crash import describe_exit

        return describe_exit(code)


class _ExitWatcher:
    """One loop per event loop asking every watched ``poll`` each ``EXIT_POLL_S``: a timer per
    task cost more than the polls at 1,024 tasks (docs/performance.md)."""

    def __init__(self) -> None:
        self.handles: dict[int, TaskHandle] = {}
        self.job: asyncio.Future[None] | None = None

    def add(self, handle: TaskHandle) -> None:
        self.handles[id(handle)] = handle
        if self.job is None or self.job.done():
            self.job = asyncio.ensure_future(self._run())

    def discard(self, handle: TaskHandle) -> None:
        self.handles.pop(id(handle), None)

    async def _run(self) -> None:
        while self.handles:
            for key, handle in list(self.handles.items()):
                future = handle._exit
                if (future is None or future.done()
                        or await handle._look(future) is not None):
                    self.handles.pop(key, None)
            await asyncio.sleep(EXIT_POLL_S)


_WATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _ExitWatcher] = \
    weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class LauncherOption:
    """One ``%%tfcluster`` flag a launcher takes, so a plugin's flags need no change to the
    magic (fields: docs/reference.md, Launchers)."""

    flag: str  # "--hosts"
    option: str  # ``hosts`` is ``Cluster(hosts=)``, any other a key of launcher_options
    help: str = ""
    metavar: str = "VALUE"
    required: bool = False
    missing: str = ""  # said when a required flag is missing
    parse: Callable[[str], object] = str  # raises SpecError (said as is) or ValueError
    dashed: bool = False  # its value may begin with "-": read as FLAG=VALUE

    @property
    def dest(self) -> str:
        """Its attribute in the parsed line: ``--connection-dir`` is ``connection_dir``."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class NetTrouble:
    """Why the launcher's own choice took the tasks' outbound network, and the cure.
    ``sudden``: it went while they ran (said once as an alert)."""

    cause: str
    cure: str
    sudden: bool = False


class Launcher(abc.ABC):
    """Chooses addresses for the tasks and starts their kernels."""

    name: str = "abstract"
    remote: bool = False  # the worker interpreter is looked up on the tasks' hosts
    #: False: the core sends the environment to the worker agent before any cell
    env_at_launch: bool = True
    restartable: bool = True  # attached tasks belong to their scheduler
    restart_instead: str = "restart them where they were started, then attach again"
    line_options: tuple[LauncherOption, ...] = ()
    gpu_placement: Placement = Placement.HERE  # docs/reference.md, GPUs
    #: the refusal of ``hosts=`` (only the ssh launcher takes it); "": the general one
    no_hosts: str = ""

    # ------------------------------------------------------------------ capabilities
    @property
    def spares(self) -> bool:
        """Whether spare kernels warmed here can become its tasks (docs/design.md)."""
        return False

    def forks(self, preload: tuple[str, ...]) -> bool:
        """Whether its tasks are forked from a process that imported ``preload`` already."""
        return False

    @property
    def confined(self) -> bool:
        """Whether its tasks' TF ports are reachable by the tasks alone (a private network)."""
        return False

    @property
    def why_not_confined(self) -> str | None:
        """Why the tasks' TF ports are open beyond them where the launcher could have confined
        them; None: it could not."""
        return None

    @classmethod
    def cluster_options(cls, hosts: list[str] | None, python: str | None,
                        options: dict[str, object]) -> dict[str, object]:
        """Its constructor options from ``Cluster``'s arguments; SpecError, with an example,
        for what it does not take (the default: hosts)."""
        if hosts:
            from tfdist_nb.errors import SpecError

            raise SpecError(cls.no_hosts or f"hosts= is for launcher='ssh'; the {cls.name} "
                            "launcher does not use it")
        return options

    def line_values(self) -> dict[str, object]:
        """What it runs with for each of its ``line_options``: a line that changes one
        replaces the cluster."""
        return {}

    def network(self) -> str:
        """Who can reach the TensorFlow ports of the tasks it starts, one line (TensorFlow
        serves them on every interface, unauthenticated: docs/security.md)."""
        return ("the TF ports listen on every interface of the tasks' hosts, without "
                "authentication: whoever reaches those hosts on them can run TensorFlow ops as "
                "the tasks' user; keep the hosts on a private network (docs/security.md)")

    def network_trouble(self) -> NetTrouble | None:
        """Why its tasks have no outbound network, by its own doing; None. Polled every
        second between cells: keep it cheap."""
        return None

    def taken(self, addresses: Mapping[TaskId, str]) -> dict[TaskId, str]:
        """Which of ``addresses`` (of tasks not running now) another program holds, where the
        launcher can tell."""
        return {}

    def held_by_another(self, address: str) -> bool:
        """Whether a port ``taken`` found is listened on by another program, not only held by
        the last process's closing connections; True where it cannot tell."""
        return True

    def base_environment(self) -> Mapping[str, str] | None:
        """What each task's environment starts from; None: this process's own environment."""
        return None

    def env_rows(self) -> dict[str, tuple[str, dict[str, str]]]:
        """What ``%tfdist_env`` adds: ``{property: (notebook's value, {task: its value})}``."""
        return {}

    @abc.abstractmethod
    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        """``host:port`` for every task's TensorFlow server, none of ``avoid`` (found taken).
        It may block; the core calls it off its loop."""

    def task_hosts(self, tasks: Sequence[TaskId]) -> dict[TaskId, str]:
        """The host each task will run on, where decided before the start (GPUs are placed
        per host)."""
        return {t: "" for t in tasks}

    def ask_gpus(self, per_task: int) -> bool:
        """Ask the scheduler for ``per_task`` GPUs per task; False: it cannot be asked."""
        return False

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Make or mend what its tasks share before a start or restart, spares or not;
        blocking, called off the loop."""

    @abc.abstractmethod
    async def start(self, launch: TaskLaunch) -> TaskHandle:
        """Start one task's kernel; return once its process exists (not yet ready)."""

    def release(self) -> None:  # noqa: B027 - optional hook
        """Give back what ``tf_addresses`` reserved (called when the cluster stops)."""
