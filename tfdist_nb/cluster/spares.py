"""Spare worker kernels: restart and resize without paying a TensorFlow import. When they
start, fit and stop: docs/design.md, "Spare kernels"; docs/reference.md, ``warm=``.

Everything here runs on the session's loop thread, except :meth:`SparePool.summary`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar

from tfdist_nb.cluster.agent_client import AgentClient
from tfdist_nb.cluster.environment import worker_env
from tfdist_nb.cluster.spare import (
    Held,
    NoSpare,
    NotStarting,
    Spare,
    SpareState,
    WarmOutcome,
    WhyCold,
    stop_spare,
    unless_dies,
)
from tfdist_nb.cluster.state import TaskState
from tfdist_nb.debuglog import swallowed
from tfdist_nb.launchers.base import TaskLaunch
from tfdist_nb.launchers.kernel_key import KernelKey
from tfdist_nb.topology import TaskId
from tfdist_nb.transport.channel import KernelChannel
from tfdist_nb.worker.adopt import WARM_NICE
from tfdist_nb.worker.memory_limits import TF_TASK_MB
from tfdist_nb.worker.state import SPARE_ENV

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tfdist_nb.cluster.start_steps import Setup
    from tfdist_nb.cluster.task import TaskRuntime

T = TypeVar("T")

IDLE_S = 0.0  # TFDIST_SPARE_IDLE_S
POLL_S = 0.5
#: The first look after the pool starts (right after the cluster is up): spares are wanted soon.
FIRST_LOOK_S = 0.1
WARM_TIMEOUT_S = 300.0
SUBSHELL_TIMEOUT_S = 10.0
#: After a spare failed to warm, wait this long before the next one; give up after MAX_FAILURES.
RETRY_AFTER_S = 30.0
MAX_FAILURES = 3

class SparesSummary(TypedDict):
    """The spare kernels now (``Cluster.spares()``); ``note``: why none is being started."""

    count: int
    ready: int
    warming: int
    pids: list[int]
    note: str | None


@dataclass(eq=False)
class PoolUser:
    """A cluster using the pool of its kernel key. Its ``tasks`` matter: no spare starts while
    one restarts, and those starting have not taken their memory yet."""

    setup: Setup
    count: int
    tasks: Mapping[TaskId, TaskRuntime]
    note: Callable[[str, str], None]
    base: Path | None = None

    @property
    def key(self) -> KernelKey:
        return KernelKey.of(self.setup.python, self.setup.preload, os.getcwd(), self.spare_env())

    def busy(self) -> bool:
        return any(rt.state is TaskState.RESTARTING for rt in list(self.tasks.values()))

    def starting(self) -> int:
        return sum(rt.state is TaskState.STARTING for rt in list(self.tasks.values()))

    def spare_env(self) -> dict[str, str]:
        """What a spare starts with: a task's environment without its identity."""
        setup = self.setup
        env = worker_env(TaskId("spare", 0), "", setup.extra_env, setup.python,
                         base=setup.launcher.base_environment(), local=True)
        for key in ("TF_CONFIG", "TFDIST_TASK"):
            env.pop(key, None)
        env[SPARE_ENV] = "1"
        return env


class SparePool:
    """The spares of one kernel key, owned by the session (:mod:`.session`), kept full for the
    last cluster that took the pool and has not given it back."""

    def __init__(self, user: PoolUser) -> None:
        self.idle_s = float(os.environ.get("TFDIST_SPARE_IDLE_S", IDLE_S))
        self._spares: list[Spare] = []
        self._numbers = itertools.count(1)
        self._users: list[PoolUser] = []
        self._last = user  # the last cluster served: the pool's key is its
        self._refill: asyncio.Task[None] | None = None
        self._closed = False
        self._failures = 0
        self._retry_at = 0.0
        self._warm_times: list[float] = []
        self._said: set[str] = set()
        self.skipped: NotStarting | None = None  # why no spare is being started now, or None

    # ------------------------------------------------------------------ the session's
    @property
    def key(self) -> KernelKey:
        """Which tasks its spares can become (the one rule: :mod:`~.launchers.kernel_key`)."""
        return self._last.key

    @property
    def users(self) -> int:
        return len(self._users)

    @property
    def count(self) -> int:
        return self._users[-1].count if self._users else 0

    def serve(self, user: PoolUser) -> None:
        """Keep the pool full for ``user`` from now on (until it gives it back)."""
        self._users.append(user)
        self._last = user
        self._said.clear()

    def start_refill(self) -> None:
        """Start keeping the pool full in the background (call on the loop thread)."""
        if self._closed or (self._refill is not None and not self._refill.done()):
            return
        self._refill = asyncio.ensure_future(self._keep_full())

    async def release(self, user: PoolUser, keep: bool = False) -> int:
        """``user`` gives the pool back (the previous user is served again); with none left, or
        ``keep``, no spare starts until it is taken. Returns how many still use it."""
        with contextlib.suppress(ValueError):
            self._users.remove(user)
        if not self._users or keep:
            await self._stop_refill()
        return len(self._users)

    async def close(self) -> None:
        """Stop every spare at once (SIGKILL, no grace: a spare holds nothing of the user's)."""
        self._closed = True
        await self._stop_refill()
        spares, self._spares = self._spares, []
        await asyncio.gather(*(stop_spare(s) for s in spares), return_exceptions=True)

    def __len__(self) -> int:
        """Spares ready or being warmed."""
        return len(self._spares)

    # ------------------------------------------------------------------ taking
    async def take(self, env: Mapping[str, str], python: str, preload: tuple[str, ...],
                   cwd: str | None = None) -> tuple[Spare | None, WhyCold | None]:
        """A ready spare fit for a task started with ``env`` (alive, and its kernel key the
        task's: docs/design.md, Spare kernels), or None and why not."""
        want = KernelKey.of(python, preload, cwd or os.getcwd(), env)
        reasons: list[WhyCold] = []
        # a ready spare first, else one still warming (the restart awaits its warm-up:
        # ``typical_warm_s``)
        for state in (SpareState.READY, SpareState.WARMING):
            for spare in [s for s in self._spares if s.state == state]:
                if spare not in self._spares or spare.state != state:
                    continue  # lost or stopped while an earlier one was dropped
                if state == SpareState.READY and not await self._alive(spare):
                    continue
                if why := spare.key.unfit(want):
                    reasons.append(why)
                    continue
                self._spares.remove(spare)
                spare.state = SpareState.TAKEN
                return spare, None
        if reasons:
            return None, reasons[0]
        return None, NoSpare(off=self._closed, warming=self._warming(), held=self.skipped)

    async def take_all(self, runtimes: Sequence[TaskRuntime], python: str,
                       preload: tuple[str, ...], forked: bool,
                       ) -> tuple[dict[TaskId, Spare], WarmOutcome]:
        """A spare for each of ``runtimes`` that one fits; how it went (why the rest start cold,
        ``forked``: from the fork server)."""
        taken: dict[TaskId, Spare] = {}
        cold: dict[str, WhyCold] = {}
        for rt in runtimes:
            spare, why = await self.take(rt.env, python, preload)
            if spare is not None:
                taken[rt.task] = spare
            else:
                cold[rt.name] = why or NoSpare()
        return taken, WarmOutcome(
            tasks=len(runtimes), adopted=len(taken),
            still_warming=sum(s.warm_s is None for s in taken.values()), cold=tuple(cold),
            why_cold=next(iter(cold.values()), None), forked=forked)

    # ------------------------------------------------------------------ views
    def summary(self) -> SparesSummary:
        """``{"count", "ready", "warming", "pids", "note"}`` (any thread)."""
        spares = list(self._spares)
        return {"count": self.count,
                "ready": sum(s.state == SpareState.READY for s in spares),
                "warming": self._warming(spares),
                "pids": [s.pid for s in spares if s.pid],
                "note": str(self.skipped) if self.skipped is not None else None}

    def typical_warm_s(self) -> float | None:
        """How long a spare of this pool took to warm (the median of the last few), if any did."""
        times = sorted(self._warm_times[-5:])
        return times[len(times) // 2] if times else None

    # ------------------------------------------------------------------ background
    async def _stop_refill(self) -> None:
        task, self._refill = self._refill, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError), swallowed(logger):
                await task

    async def _keep_full(self) -> None:
        host = HostCpu()
        room_since: float | None = None
        await asyncio.sleep(FIRST_LOOK_S)
        while not self._closed:
            await self._check_spares()
            idle = host.idle_cores()
            room = idle >= host.room_cores
            now = time.monotonic()
            if len(self._spares) < self.count and not self._busy():
                # say why none starts (memory first: it holds whatever the CPU does)
                if not self._memory_allows(pending=self._warming() + self._starting()):
                    room = False
                elif not room:
                    self.skipped = NotStarting(Held.CPU, f"waiting for a core to spare "
                                               f"({idle:.1f} of {host.cores} idle now)")
            if room and self.skipped is not None and self.skipped.held is Held.CPU:
                self.skipped = None
            if self._busy() or not room:
                room_since = None
            else:
                room_since = room_since if room_since is not None else now
                if now - room_since >= self.idle_s:
                    self._start_missing(now)
            await asyncio.sleep(POLL_S)

    def _start_missing(self, now: float) -> None:
        """Start every missing spare at once, each only if memory allows it."""
        if self._failures >= MAX_FAILURES or now < self._retry_at:
            return
        while len(self._spares) < self.count:
            if not self._memory_allows(pending=self._warming() + self._starting()):
                return
            spare = self._new_spare()
            # its own task: a handover (cancelling this loop) leaves the warm-up running
            spare.warming = asyncio.ensure_future(self._warm_or_drop(spare))
            spare.warming.add_done_callback(self._warmed)

    def _warmed(self, warming: asyncio.Future[bool]) -> None:
        if warming.cancelled() or warming.exception() is not None:
            return
        if warming.result():  # a failure was counted where it happened (_warm_or_drop)
            self._failures = 0

    async def _check_spares(self) -> None:
        """Drop ready spares that died while idle, spares a task could no longer take (the
        cluster's environment changed), and spares beyond ``count``."""
        if not self._users:
            return
        wanted = self._users[-1].key
        for spare in [s for s in self._spares if s.state == SpareState.READY]:
            if spare not in self._spares or spare.state != SpareState.READY:
                continue  # taken or stopped by an earlier step of this check
            if await self._alive(spare) and (why := spare.key.unfit(wanted)):
                self._spares.remove(spare)
                self._say(f"{spare.name} no longer fits this cluster ({why}); replacing it")
                await stop_spare(spare)
        ready = [s for s in self._spares if s.state == SpareState.READY]
        while len(self._spares) > self.count and ready:  # a smaller cluster took the pool over
            spare = ready.pop()
            self._spares.remove(spare)
            await stop_spare(spare)

    def _warming(self, spares: list[Spare] | None = None) -> int:
        return sum(s.state == SpareState.WARMING for s in
                   (self._spares if spares is None else spares))

    async def _alive(self, spare: Spare) -> bool:
        """Whether a ready spare's process still runs; one that ended is dropped and said."""
        code = spare.handle.exited() if spare.handle is not None else None
        if spare.handle is not None and code is None:
            return True
        with contextlib.suppress(ValueError):
            self._spares.remove(spare)
        how = spare.handle.describe_exit(code) if spare.handle and code is not None else "is gone"
        self._note(f"{spare.name} (pid {spare.pid}) {how} while idle; it is not handed out and "
                   "a new spare replaces it", "WARNING")
        await stop_spare(spare)
        return False

    def _memory_allows(self, pending: int = 0) -> bool:
        """Whether one more spare leaves room for one TF task, counting ``pending`` spares
        and tasks still importing (their memory is not taken yet)."""
        from tfdist_nb.worker.memory_limits import available_mb as free_mb

        # a container's limit counts, not the host's memory (Binder's 2 GB)
        available_mb = free_mb() - pending * TF_TASK_MB
        if available_mb - TF_TASK_MB < TF_TASK_MB:
            self.skipped = NotStarting(
                Held.MEMORY, f"no spare started: {available_mb:.0f} MB available, a spare would "
                f"leave less than the {TF_TASK_MB} MB one TensorFlow task needs")
            self._say(str(self.skipped))
            return False
        self.skipped = None
        return True

    def _say(self, text: str, level: str = "INFO") -> None:
        """A note said once per cluster (a skip repeats every poll otherwise)."""
        if text not in self._said:
            self._said.add(text)
            self._note(text, level)

    # ------------------------------------------------------------------ one spare
    def _busy(self) -> bool:
        return not self._users or self._users[-1].busy()

    def _starting(self) -> int:
        return self._users[-1].starting() if self._users else 0

    def _note(self, text: str, level: str) -> None:
        if self._users:
            self._users[-1].note(text, level)

    def _new_spare(self) -> Spare:
        user = self._users[-1]
        assert user.base is not None
        number = next(self._numbers)
        directory = user.base / "spares" / f"spare-{number}"
        for d in (directory.parent, directory):
            d.mkdir(mode=0o700, exist_ok=True)
            os.chmod(d, 0o700)
        spare = Spare(number=number, env=user.spare_env(), python=user.setup.python,
                      preload=tuple(user.setup.preload), cwd=os.getcwd(), directory=directory,
                      launcher=user.setup.launcher)
        self._spares.append(spare)
        return spare

    async def _warm_or_drop(self, spare: Spare) -> bool:
        """Warm ``spare``; one that fails is said (with its log's last lines) and ended."""
        try:
            await self._warm(spare)
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # before any await: the refill loop must see it gone and the retry delay set
            with contextlib.suppress(ValueError):
                self._spares.remove(spare)
            self._failures += 1
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            tail = ""  # its process log's last lines
            with contextlib.suppress(OSError):
                lines = spare.log_path.read_text(errors="replace").strip().splitlines()
                tail = " | ".join(line.strip() for line in lines[-3:])
            self._say(f"{spare.name} could not be warmed ({type(exc).__name__}: {exc})"
                      + (f"; its process log ends: {tail}" if tail else "")
                      + ("; no more spares for this cluster" if self._failures >= MAX_FAILURES
                         else f"; trying again in {RETRY_AFTER_S:.0f}s"), "WARNING")
            spare.warming = None  # this task: not cancelled by the stop below
            await stop_spare(spare)
            return False

    async def _warm(self, spare: Spare) -> None:
        """Start the kernel, import ``preload`` in it at low priority, make its subshell."""
        assert spare.launcher is not None
        launch = TaskLaunch(task=TaskId("spare", spare.number), env=spare.env,
                            python=spare.python, log_path=spare.log_path,
                            connection_file=spare.directory / "kernel-connection.json",
                            cwd=spare.cwd, preload=spare.preload)
        # shielded: a close() while the process is being spawned still finds (and ends) it
        spare.starting = asyncio.ensure_future(spare.launcher.start(launch))
        spare.handle = handle = await asyncio.shield(spare.starting)
        channel = KernelChannel(spare.name, handle.client, spare.sink)
        spare.channel = channel
        await unless_dies(spare, channel.start(timeout=60))
        agent = AgentClient(spare.name, channel)
        await unless_dies(spare, agent.warm(
            preload=list(spare.preload), nice=WARM_NICE, timeout=WARM_TIMEOUT_S))
        await unless_dies(spare, asyncio.wait_for(channel.iopub_alive.wait(), 10))
        spare.subshell = await unless_dies(
            spare, channel.create_subshell(timeout=SUBSHELL_TIMEOUT_S))
        spare.warm_s = round(time.monotonic() - spare.began, 2)
        self._warm_times.append(spare.warm_s)
        if spare.state == SpareState.WARMING:  # not taken meanwhile
            spare.state = SpareState.READY
        self._note(f"{spare.name} ready (pid {spare.pid}, warmed in {spare.warm_s:.1f}s)", "INFO")


class HostCpu:
    """The host's idle CPU between two looks, in cores (``/proc/stat`` through psutil; its own
    counters, so another user of ``psutil.cpu_percent`` in this process is not disturbed)."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self.cores = psutil.cpu_count() or 1
        #: idle cores wanted before a spare is started: one core, or half of a single one
        self.room_cores = min(1.0, self.cores / 2)
        self._last = self._sample()

    def _sample(self) -> tuple[float, float]:
        t = self._psutil.cpu_times()
        idle = t.idle + getattr(t, "iowait", 0.0)
        busy = sum(getattr(t, name, 0.0) for name in
                   ("user", "nice", "system", "irq", "softirq", "steal"))
        return idle, idle + busy

    def idle_cores(self) -> float:
        """Idle cores since the last call (0 when no time passed)."""
        (idle0, total0), (idle1, total1) = self._last, self._sample()
        self._last = (idle1, total1)
        total = total1 - total0
        return (idle1 - idle0) / total * self.cores if total > 0 else 0.0
