"""Starting, restarting and stopping a cluster's tasks, every step bounded (docs/design.md,
Start-up): a task that fails on the way is noticed within a poll, started once more on fresh
endpoints, else reported with its process log's tail; ``start_timeout`` bounds the whole start.

A start or restart first takes the pool's spares (:mod:`.spares`; adopted by
:func:`.spare.adopt`), the rest start cold (forked where the launcher can), said in one line
(``warm``). A restart kills the old processes at once: nothing of theirs is kept, and
TensorFlow only logs SIGTERM. One of every task from spares moves to fresh, verified TF ports so
nothing waits for the old ones to be freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from typing import TypeVar

from tfdist_nb.cluster.agent_client import AgentClient
from tfdist_nb.cluster.environment import telemetry_env, worker_env
from tfdist_nb.cluster.hub import RUN_DIRECTORY, EventHub
from tfdist_nb.cluster.spare import Spare, WarmOutcome, adopt
from tfdist_nb.cluster.spares import SparePool
from tfdist_nb.cluster.start_steps import Setup, StartFailed, late, log_size, unless_it_dies
from tfdist_nb.cluster.state import TaskEvent, TaskState
from tfdist_nb.cluster.task import TaskRuntime, end_kernel
from tfdist_nb.cluster.tfconfig import build_tf_config
from tfdist_nb.debuglog import swallowed
from tfdist_nb.errors import ClusterStartError
from tfdist_nb.events import CameBack, Restart
from tfdist_nb.launchers.base import NetTrouble, StopReport, TaskHandle, TaskLaunch
from tfdist_nb.store.rundir import RunDirectory
from tfdist_nb.topology import ClusterSpec, TaskId
from tfdist_nb.transport.channel import KernelChannel

logger = logging.getLogger(__name__)
T = TypeVar("T")

PORT_ATTEMPTS = 3
WATCH_S = 1.0  # how often the exits of idle tasks are looked for between cells
STOP_GRACE_S = 1.0
#: what a whole stop (every task and spare at once) may take, waited for from the caller
STOP_TIMEOUT_S = 30.0
SUBSHELL_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 20
#: what a failed start adds: how to check what the tasks need before they start
START_HINT = ("tfdist_nb: check what the tasks need before they start: tfdist_nb."
              "check_tf_config(...) for a TF_CONFIG of your own; once a cluster runs, "
              "%tfdist_check all (TF_CONFIG, network, environment)")


def start_error(exc: BaseException, spec: ClusterSpec) -> ClusterStartError:
    """What a failed start of the cluster raises: why, and how to check before a start."""
    text = (str(exc) if isinstance(exc, ClusterStartError) else
            f"cluster of {spec} did not start: {exc}")
    return ClusterStartError(f"{text}\n{START_HINT}")


class Lifecycle:
    """Starts and stops the task runtimes in ``tasks`` (the cluster's own dict, kept current)."""

    def __init__(self, setup: Setup, rundir: RunDirectory, hub: EventHub,
                 tasks: dict[TaskId, TaskRuntime], spares: SparePool | None = None) -> None:
        self.setup = setup
        self.rundir = rundir
        self.hub = hub
        self.tasks = tasks
        self.spares = spares
        #: finds tasks that die between cells (``watch_exits``, once the cluster is up)
        self._exit_watch: asyncio.Future[None] | None = None
        self._trouble_said: NetTrouble | None = None
        #: how the last start or restart used spares (why a task started cold); None: no pool
        self.warm: WarmOutcome | None = None
        #: how long the cluster's own start took (what a spare still warming is measured by)
        self.start_s: float | None = None
        #: the old processes of a restart being killed: a cold start waits for them (it reuses
        #: their directory's connection file and socket names, which their clean-up removes)
        self._killing: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ whole cluster
    async def start_all(self) -> None:
        began = time.monotonic()
        deadline = began + self.setup.start_timeout
        tasks = self.setup.spec.tasks
        for note in self.setup.gpus.notes:  # where the GPUs went, in the run's log
            self.hub.note("cluster", note.text, note.level)
        avoid: dict[TaskId, str] = {}
        for attempt in range(1, PORT_ATTEMPTS + 1):
            addresses = await asyncio.to_thread(self.setup.launcher.tf_addresses, tasks, avoid)
            self.tasks.clear()
            self.tasks.update({t: self.runtime(t, addresses) for t in tasks})
            await self.launch(list(self.tasks.values()), deadline)
            clashes = {rt.task: rt.address for rt in self.tasks.values()
                       if rt.info.get("port_free") is False}
            if not clashes:
                self.start_s = time.monotonic() - began
                if self.setup.spec.ps:
                    await self.serve_parameter_servers(list(self.tasks.values()))
                return
            for task, addr in clashes.items():
                self.hub.note(str(task), f"TF port {addr} was taken before start; choosing "
                              f"another (attempt {attempt})", "WARNING")
            await self.stop(list(self.tasks.values()))
            avoid.update(clashes)
        raise ClusterStartError(f"TF ports kept being taken: {sorted(map(str, avoid))}")

    async def restart(self, targets: list[TaskRuntime]) -> None:
        """Fresh processes for ``targets``. A restart that fails leaves no process of theirs
        behind (``launch`` stops what it started) and says so: each task without a process is
        dead, and a cell sent to it is refused with what to do. One that succeeds is kept with
        the events as a ``Restart`` (how each task came back, its ports, how long it took)."""
        began, at = time.monotonic(), time.time()
        if remade := self.rundir.ensure():
            self.hub.note(RUN_DIRECTORY, remade, "WARNING")
        # what the launcher can check first (a deleted working directory, the private
        # network's holder gone) refuses the restart before any task is killed; it also makes
        # a new slirp4netns where the last one ended (spares do not start anew)
        await asyncio.to_thread(self.setup.launcher.prepare)
        for rt in targets:
            rt.transition(TaskEvent.RESTART)
            self.hub.live.view(rt.name).new_process()
        try:
            came, moved = await self._restart(targets)
        except Exception as exc:
            await self.stop(targets)  # a task adopted before the failure goes too
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            for rt in targets:
                rt.transition(TaskEvent.EXITED)
                self.hub.note(rt.name, f"the restart failed ({said}); no process runs for it: "
                              "%tfdist_restart to try again, %tfdist_stop to end the cluster",
                              "ERROR")
            raise
        self.hub.sink([Restart(at, came, {rt.name: rt.address for rt in targets} if moved else {},
                               round(time.monotonic() - began, 2))])

    async def _restart(self, targets: list[TaskRuntime]) -> tuple[dict[str, str], bool]:
        """How each task came back, and whether they moved to fresh TF ports."""
        deadline = time.monotonic() + self.setup.start_timeout
        spares = await self.take_spares(targets)
        old = [(rt.handle, rt.channel) for rt in targets]
        for rt in targets:
            rt.handle, rt.channel, rt.agent = None, None, None
        moved = every = {rt.task for rt in targets} == set(self.tasks)
        if not spares:
            # SIGKILL at once: nothing of a process being replaced is kept, and a kernel left
            # in an aborted collective (the usual reason to restart) took the whole grace
            await self._kill(old)
            taken = {} if not every else await asyncio.to_thread(
                self.setup.launcher.taken, {rt.task: rt.address for rt in targets})
            if moved := bool(taken):  # held by another program, or still closing: fresh ports
                for task, address in taken.items():
                    other = self.setup.launcher.held_by_another(address)
                    why = ("another program holds it, perhaps another notebook's cluster"
                           if other else "the last process's connections on it are still "
                           "closing (TIME_WAIT, up to a minute)")
                    self.hub.note(str(task), f"TF port {address} is taken on its host ({why}): "
                                  "every task moves to fresh TF ports",
                                  "WARNING" if other else "INFO")
                await self.readdress(targets)
            came = await self.launch(targets, deadline, spares)
        else:
            if every:
                # every task: fresh ports, so the old processes are killed while the spares are
                # adopted, and nothing waits for their ports to be freed. Their exit is awaited:
                # returning while they die made the next strategy's start-up retry about one
                # time in three (+1 s, docs/performance.md)
                await self.readdress(targets)
                if self.warm is not None:
                    self.warm = replace(self.warm, fresh_ports=True)
                killed = self._killing = asyncio.ensure_future(self._kill(old))
                try:
                    came = await self.launch(targets, deadline, spares)
                finally:
                    self._killing = None
                    await killed
            else:  # the others know these addresses: the old processes go first
                await self._kill(old)
                came = await self.launch(targets, deadline, spares)
            # a TF port found taken at adoption (another program took it meanwhile): the
            # strategy would fail to bind it (a restart of every task picks new ones)
            for rt in targets:
                if rt.info.get("port_free") is False:
                    self.hub.note(rt.name, f"TF port {rt.address} is taken on its host; restart "
                                  "every task to move to fresh ports", "WARNING")
        if self.setup.spec.ps:
            await self.serve_parameter_servers(targets)
        return came, moved

    async def take_spares(self, runtimes: list[TaskRuntime],
                          quiet_when_empty: bool = False) -> dict[TaskId, Spare]:
        """Spares fit for ``runtimes``; ``warm`` says how it went (nothing for a pool that never
        had spares when ``quiet_when_empty``)."""
        self.warm = None
        if self.spares is None or (quiet_when_empty and not len(self.spares)):
            return {}
        taken, self.warm = await self.spares.take_all(
            runtimes, self.setup.python, self.setup.preload,
            self.setup.launcher.forks(self.setup.preload))
        if self.warm.cold:
            self.hub.note("spares", str(self.warm))
        return taken

    async def readdress(self, runtimes: list[TaskRuntime]) -> None:
        """Fresh TF addresses for ``runtimes`` (every task of the cluster): new TF_CONFIGs and
        environments, written to the run directory."""
        addresses = await asyncio.to_thread(self.setup.launcher.tf_addresses,
                                            list(self.tasks), {})
        for rt in runtimes:
            fresh = self.runtime(rt.task, addresses)
            rt.address, rt.tf_config, rt.env = fresh.address, fresh.tf_config, fresh.env

    async def _kill(self, old: list[tuple[TaskHandle | None, KernelChannel | None]]) -> None:
        """The old processes of a restart from spares: SIGKILL at once, in parallel."""
        ended = await asyncio.gather(*(end_kernel(h, c, 0.0) for h, c in old),
                                     return_exceptions=True)
        for exc in ended:
            if isinstance(exc, BaseException):
                logger.debug("an old process of a restart did not stop cleanly: %r", exc)

    def runtime(self, task: TaskId, addresses: Mapping[TaskId, str]) -> TaskRuntime:
        tf_config = build_tf_config(task, addresses)
        self.rundir.write_json(task.slug, "tf_config.json", json.loads(tf_config))
        return TaskRuntime(task=task, address=addresses[task], tf_config=tf_config,
                           env=self._env(task, tf_config))

    def refresh_env(self) -> None:
        """Rebuild every task's environment after ``extra_env`` changed (applies at restart)."""
        for rt in self.tasks.values():
            rt.env = self._env(rt.task, rt.tf_config)

    def _env(self, task: TaskId, tf_config: str) -> dict[str, str]:
        """The task's environment (its GPUs included), as written to its ``env.json``."""
        setup, launcher = self.setup, self.setup.launcher
        env = worker_env(task, tf_config, {**telemetry_env(setup.spec.size, setup.extra_env),
                                           **setup.gpus.env(task), **setup.extra_env},
                         setup.python, base=launcher.base_environment(),
                         local=not launcher.remote)
        self.rundir.write_json(task.slug, "env.json", env)
        return env

    async def launch(self, runtimes: list[TaskRuntime], deadline: float,
                     spares: dict[TaskId, Spare] | None = None) -> dict[str, str]:
        """Start ``runtimes`` in parallel (from ``spares`` where given, else the spares the
        pool has); on any failure stop them all and raise one error. Returns how each came
        (name -> ``CameBack``)."""
        if spares is None:
            spares = await self.take_spares(runtimes, quiet_when_empty=True)
        outcomes = await asyncio.gather(*(self._launch_or_retry(rt, deadline, spares.get(rt.task))
                                          for rt in runtimes), return_exceptions=True)
        failed = [(rt, exc) for rt, exc in zip(runtimes, outcomes, strict=True)
                  if isinstance(exc, BaseException)]
        if not failed:
            return {rt.name: str(how) for rt, how in zip(runtimes, outcomes, strict=True)}
        await self.stop(runtimes)
        rt, exc = failed[0]
        others = f" ({len(failed) - 1} other task(s) failed too)" if len(failed) > 1 else ""
        tail = "\n".join(rt.kernel_log_tail(LOG_TAIL_LINES))
        raise ClusterStartError(
            f"{rt.name} failed to start: {exc}{others}"
            + (f"\n--- last lines of {rt.name}'s process log ---\n{tail}" if tail else ""))

    async def serve_parameter_servers(self, runtimes: list[TaskRuntime]) -> None:
        """With ps tasks, ps and workers run their tf.distribute.Server from the start."""
        serving = [rt for rt in runtimes if rt.task.role in ("ps", "worker") and rt.agent]
        targets = await asyncio.gather(*(rt.agent.start_tf_server() for rt in serving
                                         if rt.agent))
        for rt, target in zip(serving, targets, strict=True):
            self.hub.note(rt.name, f"serving ParameterServerStrategy at {target}")

    async def stop_all(self, grace_s: float = STOP_GRACE_S) -> list[StopReport]:
        """Every task, at once (``grace_s`` 0: killed at once, the cluster is being replaced);
        the cluster gives its spare pool back to the session after."""
        watch, self._exit_watch = self._exit_watch, None  # these exits are asked for
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError), swallowed(logger):
                await watch
        return await self.stop(list(self.tasks.values()), grace_s)

    @staticmethod
    async def stop(runtimes: list[TaskRuntime],
                   grace_s: float = STOP_GRACE_S) -> list[StopReport]:
        """All at once: shutdown request, ``grace_s``, then SIGKILL (docs/design.md)."""
        ended = await asyncio.gather(*(rt.end(grace_s) for rt in runtimes),
                                     return_exceptions=True)
        for rt, got in zip(runtimes, ended, strict=True):
            if isinstance(got, BaseException):
                logger.debug("%s did not stop cleanly: %r", rt.name, got)
        return [r for r in ended if isinstance(r, StopReport)]

    # ------------------------------------------------------------------ between cells
    def watch_exits(self) -> None:
        """Say an idle task's exit as an alert, the task marked dead (during a cell the runner
        notices an exit itself; between cells nothing else would, and the dashboard would show
        it idle until the next cell failed on it): waiting on the idle tasks' exit futures and
        looking again every ``WATCH_S`` for tasks that became idle. The launcher's
        ``network_trouble`` is looked at as often, so the tasks' outbound network going
        (slirp4netns ending) is said once. Call on the loop thread."""
        if self._exit_watch is None or self._exit_watch.done():
            self._exit_watch = asyncio.ensure_future(self._watch_exits())

    async def _watch_exits(self) -> None:
        while True:
            exits = [rt.handle.exit_future() for rt in list(self.tasks.values())
                     if rt.state is TaskState.IDLE and rt.handle is not None]
            if exits:
                await asyncio.wait(exits, timeout=WATCH_S, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(WATCH_S)
            for rt in list(self.tasks.values()):  # an idle task whose process is gone
                handle = rt.handle
                if (rt.state is not TaskState.IDLE or handle is None
                        or (code := handle.exited()) is None):
                    continue
                rt.transition(TaskEvent.EXITED)
                what = await asyncio.to_thread(handle.describe_exit, code)
                self.hub.note(rt.name, f"{rt.name} {what} while no cell was running on it; "
                              "bring it back with %tfdist_restart (its process log is in the run "
                              "directory)", "ERROR")
            # a sudden loss of the tasks' outbound network, said once (again only after a cure)
            with swallowed(logger):
                trouble = self.setup.launcher.network_trouble()
                if trouble is not None and trouble.sudden and trouble != self._trouble_said:
                    self.hub.note("cluster", f"{trouble.cause}; the tasks have no outbound "
                                  f"network now (downloads and DNS fail): {trouble.cure}", "ERROR")
                self._trouble_said = trouble

    # ------------------------------------------------------------------ one task
    async def _launch_or_retry(self, rt: TaskRuntime, deadline: float,
                               spare: Spare | None = None) -> CameBack:
        if spare is not None:
            try:
                await self._adopt(rt, spare, deadline)
                return CameBack.SPARE
            except StartFailed as exc:
                if not exc.retry:
                    raise
                self.hub.note(rt.name, f"could not take {spare.name} ({exc}); starting it cold",
                              "WARNING")
                await self.stop([rt])
        try:
            await self._launch_one(rt, deadline)
        except StartFailed as exc:
            if not exc.retry or time.monotonic() >= deadline:
                raise
            self.hub.note(rt.name, f"failed to start ({exc}); starting it once more on fresh "
                          "endpoints", "WARNING")
            await self.stop([rt])
            await self._launch_one(rt, deadline)
        return CameBack.FORKED if rt.handle is not None and rt.handle.forked else CameBack.COLD

    async def _launch_one(self, rt: TaskRuntime, deadline: float) -> None:
        launcher = self.setup.launcher
        if self._killing is not None:  # the old process's clean-up must not remove our files
            await asyncio.shield(self._killing)
        tdir = self.rundir.task_dir(rt.task.slug)
        rt.log_path = tdir / "kernel.log"
        rt.log_offset = log_size(rt)
        try:
            rt.handle = await asyncio.wait_for(launcher.start(TaskLaunch(
                task=rt.task, env=rt.env, python=self.setup.python, log_path=rt.log_path,
                connection_file=tdir / "kernel-connection.json",
                preload=tuple(self.setup.preload))),
                max(deadline - time.monotonic(), 0.1))
        except asyncio.TimeoutError:
            raise StartFailed(late(self.setup.start_timeout), retry=False) from None
        except (OSError, RuntimeError, ValueError) as exc:
            raise StartFailed(f"{type(exc).__name__}: {exc}") from exc
        for text in rt.handle.notes:  # the launcher's word on this start (a fork server's fault)
            self.hub.note(rt.name, text, "WARNING")
        channel = KernelChannel(rt.name, rt.handle.client, self.hub.sink,
                                heartbeat=rt.handle.heartbeat)
        rt.channel = channel
        await self._until(
            rt, channel.start(timeout=max(deadline - time.monotonic(), 0.1)), deadline)
        agent = AgentClient(rt.name, channel)
        if not launcher.env_at_launch:
            await self._until(rt, agent.set_environment(env=rt.env), deadline)
        rt.info = dict(await self._until(rt, agent.describe(list(self.setup.preload)),
                                         deadline))
        # the handshake's own busy/idle status travels on iopub: it must have arrived
        await self._until(rt, channel.iopub_alive.wait(), deadline,
                                   silent_iopub_after=5.0)
        agent.subshell = await self._until(
            rt, channel.create_subshell(timeout=SUBSHELL_TIMEOUT_S), deadline)
        rt.agent = agent
        self._ready(rt, "")

    async def _adopt(self, rt: TaskRuntime, spare: Spare, deadline: float) -> None:
        typical = ((self.spares.typical_warm_s() if self.spares is not None else None)
                   or self.start_s or 10.0)
        origin, after = await adopt(
            rt, spare, self.rundir.task_dir(rt.task.slug) / "kernel.log", self.hub.sink,
            list(self.setup.preload), typical, deadline,
            lambda step: self._until(rt, step, deadline))
        self._ready(rt, origin, after)

    def _ready(self, rt: TaskRuntime, origin: str, after: str = "") -> None:
        """The task is ready: said with how it came (``origin``: cold is ""), and any
        instrumentation its agent could not install."""
        rt.transition(TaskEvent.READY)
        self.hub.note(rt.name, f"ready: pid {rt.pid}{origin}, {rt.info.get('keras_flavour')}, "
                      f"TF {rt.info.get('tensorflow')}, TF_CONFIG address {rt.address}{after}")
        for what, error in (rt.info.get("instrumentation_errors") or {}).items():
            self.hub.note(rt.name, f"instrumentation {what} could not be installed ({error})",
                          "WARNING")

    def _until(self, rt: TaskRuntime, step: Awaitable[T], deadline: float,
               silent_iopub_after: float | None = None) -> Awaitable[T]:
        return unless_it_dies(rt, step, deadline, self.setup.start_timeout, silent_iopub_after)
