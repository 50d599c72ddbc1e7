"""The ``Cluster`` facade of SPEC 2.2: start tasks, run cells on them, show their state, stop them.

All process and channel work happens on the cluster's private loop thread (:mod:`.loop`); the
methods here validate arguments, hand a coroutine to that loop and wait with a deadline.
"""

from __future__ import annotations

import ast
import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import logging
import os
import queue
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from tfdist_nb.cluster.environment import resolve_python, worker_env
from tfdist_nb.cluster.loop import LoopThread
from tfdist_nb.cluster.results import RunResult
from tfdist_nb.cluster.runner import RunControl, run_cell
from tfdist_nb.cluster.spec import ClusterSpec, TaskId, parse_targets
from tfdist_nb.cluster.state import TaskEvent, TaskState
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.cluster.tfconfig import build_tf_config
from tfdist_nb.diagnostics.stall import Progress
from tfdist_nb.diagnostics.startup import StartupWaitDetector
from tfdist_nb.diagnostics.straggler import evidence as straggler_evidence
from tfdist_nb.diagnostics.straggler import find_stragglers
from tfdist_nb.errors import ClusterNotRunningError, ClusterStartError, SpecError, TfdistError
from tfdist_nb.events import Event, OutputLine, TaskNote, TelemetrySample
from tfdist_nb.launchers.base import Launcher, StopReport, TaskLaunch, get_launcher
from tfdist_nb.store.live import LiveStore
from tfdist_nb.store.logs import logs_frame
from tfdist_nb.store.rundir import RunDirectory, new_cluster_id
from tfdist_nb.transport.channel import KernelChannel

logger = logging.getLogger(__name__)

STATUS_COLUMNS = ["task", "host", "pid", "state", "step", "step_time_ms", "input_wait_ms",
                  "cpu_percent", "rss_mb", "gpu_util_percent", "gpu_mem_mb", "net_rx_mb_s",
                  "net_tx_mb_s", "last_output_s_ago", "flags"]
START_ATTEMPTS = 3
INSPECT_TIMEOUT_S = 5.0
STRAGGLER_ROWS = 60
HEARTBEAT_GAP_S = 5.0
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_RUN_DONE = object()
STOP_GRACE_S = 1.0

_current: Cluster | None = None
_live: weakref.WeakSet[Cluster] = weakref.WeakSet()


def _make_launcher(name: str, hosts: list[str] | None, python: str | None,
                   options: Mapping[str, Any] | None) -> Launcher:
    """The named launcher with what it needs of the cluster's arguments."""
    opts = dict(options or {})
    if name == "ssh":
        if not hosts:
            raise SpecError("launcher='ssh' needs hosts=[...], e.g. hosts=['gpu1', 'me@gpu2']")
        opts.setdefault("hosts", hosts)
        opts.setdefault("python", python or sys.executable)  # the notebook's, found there
    try:
        return get_launcher(name, **opts)
    except (ValueError, TypeError) as exc:
        raise SpecError(str(exc)) from None


def current() -> Cluster | None:
    """The notebook's active cluster (the one the magics drive), or None."""
    return _current if _current is not None and _current.running else None


def _set_current(cluster: Cluster | None) -> None:
    global _current
    _current = cluster


class Cluster:
    """A multi-worker TensorFlow cluster whose tasks are ipykernels.

    >>> with Cluster(workers=2) as c:                       # doctest: +SKIP
    ...     c.run("import tensorflow as tf; print(tf.__version__)")
    """

    def __init__(self, workers: int = 2, ps: int = 0, chief: bool = False,
                 launcher: str | Launcher = "local", hosts: list[str] | None = None,
                 env: Mapping[str, str] | None = None, stall_timeout: float = 60.0,
                 python: str | None = None, *, evaluator: bool = False,
                 run_dir: str | os.PathLike[str] | None = None,
                 preload: Iterable[str] = ("tensorflow",), start_timeout: float = 120.0,
                 launcher_options: Mapping[str, Any] | None = None) -> None:
        self.spec = ClusterSpec(workers=workers, chief=int(chief), ps=ps,
                                evaluator=int(evaluator))
        if hosts is not None and launcher == "local":
            raise SpecError("hosts= needs launcher='ssh'; the local launcher runs on this machine")
        self.hosts = list(hosts) if hosts else None
        self.launcher_options = dict(launcher_options or {})
        self.launcher = (launcher if isinstance(launcher, Launcher)
                         else _make_launcher(launcher, self.hosts, python, launcher_options))
        self.extra_env = dict(env or {})
        self.stall_timeout = float(stall_timeout)
        # A remote interpreter is looked up on its host (the probe says if it is missing there).
        self.python = (python or sys.executable) if self.launcher.remote else resolve_python(python)
        self.preload = tuple(preload)
        self.start_timeout = start_timeout
        self._run_root = run_dir
        self.id = new_cluster_id()
        self.rundir: RunDirectory | None = None
        self.live = LiveStore()
        self._alerts: deque[str] = deque(maxlen=50)
        self._startup_waits = StartupWaitDetector()
        self.stragglers: dict[str, Any] = {}
        self._dashboard: Any = None
        self.tasks: dict[TaskId, TaskRuntime] = {}
        self._loop: LoopThread | None = None
        self._listeners: tuple[Callable[[list[Event]], None], ...] = ()
        self._listeners_lock = threading.Lock()
        self._cell = 0
        self._cell_started = 0.0
        self.last_stop: list[StopReport] = []
        self._active_runs: dict[RunControl, concurrent.futures.Future[Any]] = {}
        self.running = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Cluster:
        """Start every task in parallel and wait until each has imported ``preload``."""
        if self.running:
            return self
        self.rundir = RunDirectory(self._run_root, self.id)
        self._loop = LoopThread(f"tfdist-{self.id}")
        _live.add(self)
        try:
            self._loop.run(self._start_all(), self.start_timeout * START_ATTEMPTS + 30)
        except BaseException as exc:
            self._teardown()
            if isinstance(exc, ClusterStartError):
                raise
            raise ClusterStartError(f"cluster of {self.spec} did not start: {exc}") from exc
        self.running = True
        _set_current(self)
        return self

    def stop(self) -> list[StopReport]:
        """End every task at once (shutdown request, short grace, then SIGKILL)."""
        if self._loop is None:
            return self.last_stop
        for control in list(self._active_runs):  # a cell still running ends now, not later
            self._loop.call_soon(control.stop, "stopped")
        with contextlib.suppress(Exception):
            self.last_stop = self._loop.run(self._stop_tasks(list(self.tasks.values())), 30)
        concurrent.futures.wait(list(self._active_runs.values()), timeout=5)
        self._teardown()
        return self.last_stop

    def _teardown(self) -> None:
        self.running = False
        if self._dashboard is not None:
            with contextlib.suppress(Exception):
                self._dashboard.close()
        if self._loop is not None:
            if any(rt.handle for rt in self.tasks.values()):
                with contextlib.suppress(Exception):
                    self._loop.run(self._stop_tasks(list(self.tasks.values())), 30)
            self._loop.close()
            self._loop = None
        self.launcher.release()
        for rt in self.tasks.values():
            if rt.state is not TaskState.STOPPED:
                rt.transition(TaskEvent.STOP)
        if self.rundir is not None:
            self.rundir.close()
        _live.discard(self)
        if _current is self:
            _set_current(None)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def restart(self, on: Any = None) -> None:
        """Bring the targeted tasks back as fresh kernels with the same TF_CONFIG."""
        targets = self._runtimes(on, allow_dead=True)
        if not self.launcher.restartable:
            raise TfdistError(f"the {self.launcher.name} launcher cannot restart tasks: their "
                              "scheduler started them; restart them there, then attach again")
        self._require_loop().run(self._restart(targets), self.start_timeout + 60)

    def stacks(self, on: Any = None) -> dict[str, str]:
        """Python stacks of every thread of each task (SPEC 2.2), also while its main thread is
        blocked inside a TensorFlow op: they are taken in the task's inspection subshell."""
        targets = self._runtimes(on, allow_dead=True)
        found = self._require_loop().run(_gather(*(_Inspector(self).stacks(rt)
                                                   for rt in targets)), 20)
        return {rt.name: format_stacks(s) for rt, s in zip(targets, found, strict=True)}

    def inject(self, kind: str, on: Any = None, **params: Any) -> dict[str, str]:
        """Arm a teaching fault on the targeted tasks (``%tfdist_inject``); ``"clear"`` disarms.

        Faults act through the tasks' own training path (``tw.step()``, ``tw.timed()``, the step
        timer in ``model.fit``); see :mod:`tfdist_nb.worker.inject` for the kinds.
        """
        from tfdist_nb.worker.inject import KINDS

        if kind != "clear" and kind not in KINDS:
            raise SpecError(f"unknown fault {kind!r}; one of {', '.join(KINDS)} or clear")
        if kind != "clear" and on is None:
            raise SpecError("say which task gets the fault: --on 1 (or on='worker:1')")
        # a dead task has no faults to clear, and a restart brings it back without any
        targets = [rt for rt in self._runtimes(on, allow_dead=kind == "clear")
                   if rt.state is not TaskState.DEAD]
        args = json.dumps({k: v for k, v in params.items() if v is not None})
        said = self._require_loop().run(_gather(*(self._agent_call(
            rt, f"inject({kind!r}, {args!r})", inspect=True) for rt in targets)),
            INSPECT_TIMEOUT_S + 10)
        for rt, text in zip(targets, said, strict=True):
            self._note(rt.name, f"fault injection: {text}", "WARNING" if kind != "clear"
                       else "INFO")
        return {rt.name: text for rt, text in zip(targets, said, strict=True)}

    def set_log_level(self, level: str, cpp: int | None = None,
                      vmodule: str | None = None) -> str:
        """Python and TensorFlow logger level on every task (``%tfdist_loglevel``).

        TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` / ``TF_CPP_VMODULE`` once, at start-up: setting
        ``cpp`` or ``vmodule`` updates every task's environment and restarts all tasks.
        """
        level = level.upper()
        if level not in LOG_LEVELS:
            raise SpecError(f"unknown log level {level!r}; use one of {', '.join(LOG_LEVELS)}")
        if cpp is not None and cpp not in (0, 1, 2, 3):
            raise SpecError("--cpp is TF_CPP_MIN_LOG_LEVEL: 0 (all), 1 (no INFO), 2 (no "
                            "WARNING), 3 (no ERROR)")
        said = []
        if cpp is not None or vmodule is not None:
            if cpp is not None:
                self.extra_env["TF_CPP_MIN_LOG_LEVEL"] = str(cpp)
            if vmodule is not None:
                self.extra_env["TF_CPP_VMODULE"] = vmodule
            for rt in self.tasks.values():
                rt.env = worker_env(rt.task, rt.tf_config, self.extra_env, self.python)
                self.rundir.write_json(rt.task.slug, "env.json", rt.env)  # type: ignore[union-attr]
            self.restart()
            said.append("restarted all tasks so the C++ log settings take effect")
        targets = self._runtimes("all")
        self._require_loop().run(_gather(
            *(self._agent_call(rt, f"set_log_level({level!r})") for rt in targets)), 30)
        said.insert(0, f"log level {level} on {len(targets)} task(s)")
        return "; ".join(said)

    def interrupt(self, on: Any = None, grace_s: float = 2.0) -> list[str]:
        """Interrupt the targeted tasks: SIGINT first; a task with a thread still inside a
        TensorFlow op ``grace_s`` later (SIGINT cannot reach it there, SPEC 6) gets its
        collectives aborted. Returns the tasks whose collectives were aborted."""
        targets = self._runtimes(on, allow_dead=True)
        return self._require_loop().run(self._interrupt(targets, grace_s), grace_s + 20)

    async def _interrupt(self, targets: list[TaskRuntime], grace_s: float) -> list[str]:
        await _gather(*(rt.handle.interrupt() for rt in targets if rt.handle))
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(
                rt.state in (TaskState.BUSY, TaskState.STALLED) for rt in targets):
            await asyncio.sleep(0.1)
        inspector, aborted = _Inspector(self), []
        for rt in targets:
            found = await inspector.stacks(rt)
            # the main thread, or a thread a strategy runs its all-reduce on, still inside TF
            if found and (found.get("main", {}).get("kind") == "tensorflow"
                          or found.get("in_tf")):
                await inspector.abort_collectives(rt, "interrupted by the user")
                aborted.append(rt.name)
        return aborted

    # ------------------------------------------------------------------ running cells
    def run(self, code: str, on: Any = None, timeout: float | None = None, *,
            on_event: Callable[[Event], None] | None = None,
            stall_timeout: float | None = None) -> RunResult:
        """Run ``code`` on the targeted tasks at once and return when all have ended.

        ``on_event`` is called in the caller's thread with every event while the cell runs (the
        magic uses it to show output live). Pressing interrupt interrupts the tasks. A task with
        no progress for ``stall_timeout`` (default: the cluster's) ends the run as stalled.
        """
        targets = self._runtimes(self.default_targets() if on is None else on)
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be positive")
        self._cell += 1
        cell = self._cell
        # Stragglers are judged afresh in each cell, on its own steps, with a new alert.
        self.stragglers, self._cell_started = {}, time.time()
        assert self.rundir is not None
        self.rundir.write_cell(cell, code, [rt.name for rt in targets])
        events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        listener = events.put
        self._add_listener(listener)
        loop = self._require_loop()
        control = RunControl()
        fut = loop.submit(run_cell(targets, code, cell, timeout, control,
                                   inspector=_Inspector(self),
                                   stall_timeout=stall_timeout or self.stall_timeout))
        fut.add_done_callback(lambda _: events.put(_RUN_DONE))  # wakes the wait below at once
        self._active_runs[control] = fut
        try:
            self._relay(events, on_event, fut, lambda: loop.call_soon(control.stop, "interrupt"))
        finally:
            self._remove_listener(listener)
            self._active_runs.pop(control, None)
        return RunResult(cell=cell, tasks=fut.result(timeout=10))

    def _relay(self, events: queue.SimpleQueue[Any], on_event: Callable[[Event], None] | None,
               fut: concurrent.futures.Future[Any], interrupt: Callable[[], None]) -> None:
        """Hand the run's events to ``on_event`` in this thread until the run has ended."""
        while True:
            try:
                ev = events.get(timeout=0.5)
            except queue.Empty:
                if fut.done() or self._loop is None:
                    return
                continue
            except KeyboardInterrupt:  # the user pressed interrupt: end the run for all
                interrupt()
                continue
            if ev is _RUN_DONE:
                return
            if on_event is not None:
                for one in ev:
                    on_event(one)

    # ------------------------------------------------------------------ views
    def status(self) -> pd.DataFrame:
        """One row per task with the SPEC 2.4 columns, from the tasks' own telemetry.

        No GPU reads as empty (NaN), never as 0; a column with no reading yet is empty too.
        """
        rows = []
        now = time.time()
        for rt in self.tasks.values():
            v = self.live.view(rt.name)
            alive = rt.state not in (TaskState.DEAD, TaskState.STOPPED)
            latest = v.latest if alive else {}
            last_output = v.last_output
            rows.append({
                "task": rt.name, "host": rt.host, "pid": rt.pid, "state": rt.state.value,
                "step": v.step_count, "step_time_ms": v.step_time_ms(),
                "input_wait_ms": v.input_wait_ms(),
                **{k: latest.get(k) for k in ("cpu_percent", "rss_mb", "gpu_util_percent",
                                              "gpu_mem_mb", "net_rx_mb_s", "net_tx_mb_s")},
                "last_output_s_ago": None if last_output is None else round(now - last_output, 1),
                "flags": "straggler" if rt.name in self.stragglers else "",
            })
        return pd.DataFrame(rows, columns=STATUS_COLUMNS).astype(
            {c: "float64" for c in STATUS_COLUMNS[5:-1]})

    def logs(self, on: Any = None, grep: str | None = None,
             tail: int | None = None) -> pd.DataFrame:
        """The merged log of all tasks from the run directory: time, task, stream, level, text."""
        if self.rundir is None:
            raise ClusterNotRunningError("the cluster has not been started")
        names = None if on is None else {str(t) for t in parse_targets(on, self.spec)}
        return logs_frame(self.rundir.iter_events(), on=names, grep=grep, tail=tail)

    def env(self) -> pd.DataFrame:
        """What each task reported about its environment, side by side, differences marked."""
        keys = ["host", "python", "executable", "tensorflow", "keras", "tf_keras",
                "keras_flavour", "numpy", "os"]
        data = {rt.name: [rt.info.get(k) for k in keys] for rt in self.tasks.values()}
        df = pd.DataFrame(data, index=keys)
        df["mismatch"] = df.nunique(axis=1, dropna=False) > 1
        return df

    def alerts(self) -> list[str]:
        """What the cluster warned about, newest last (the dashboard's alerts area)."""
        return list(self._alerts)

    def dashboard(self, start: bool = True) -> Any:
        """The live ipywidget dashboard (SPEC 2.2); a new one retires the previous one's timer."""
        from tfdist_nb.display.dashboard import Dashboard

        if self._dashboard is not None:
            self._dashboard.close()
        self._dashboard = Dashboard(self)
        return self._dashboard.start() if start else self._dashboard

    def default_targets(self) -> str:
        """Where a cell runs without ``on=``: every task, or the chief when ps tasks serve."""
        if self.spec.ps:
            return "chief:0" if self.spec.chief else ",".join(
                str(t) for t in self.spec.tasks if t.role == "worker")
        return "all"

    def keras_summary(self) -> str:
        """Which TensorFlow and Keras the tasks run, with the MWMS ``fit`` caveat for Keras 3."""
        flavours = sorted({str(rt.info.get("keras_flavour")) for rt in self.tasks.values()})
        tf = sorted({str(rt.info.get("tensorflow")) for rt in self.tasks.values()})
        text = f"TF {'/'.join(tf)}, {'/'.join(flavours)}"
        if "keras 3" in flavours and self.spec.workers + self.spec.chief > 1:
            text += ": model.fit under MultiWorkerMirroredStrategy needs TF_USE_LEGACY_KERAS=1"
        return text

    @property
    def run_dir(self) -> Path | None:
        return self.rundir.path if self.rundir else None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<Cluster {self.id} {self.spec} {state} launcher={self.launcher.name}>"

    def _repr_html_(self) -> str:
        return f"<p><b>{self!r}</b></p>" + self.status().to_html(index=False, na_rep="")

    # ------------------------------------------------------------------ internals
    def _runtimes(self, on: Any, allow_dead: bool = False) -> list[TaskRuntime]:
        if not self.running:
            raise ClusterNotRunningError("the cluster is not running; start() it first")
        targets = [self.tasks[t] for t in parse_targets(on, self.spec)]
        dead = [rt.name for rt in targets if rt.state is TaskState.DEAD]
        if dead and not allow_dead:
            raise ClusterNotRunningError(
                f"{', '.join(dead)} {'is' if len(dead) == 1 else 'are'} dead; bring "
                f"{'it' if len(dead) == 1 else 'them'} back with %tfdist_restart or "
                "cluster.restart()")
        return targets

    def _require_loop(self) -> LoopThread:
        if self._loop is None:
            raise ClusterNotRunningError("the cluster is not running")
        return self._loop

    def _add_listener(self, fn: Callable[[list[Event]], None]) -> None:
        with self._listeners_lock:
            self._listeners = (*self._listeners, fn)

    def _remove_listener(self, fn: Callable[[list[Event]], None]) -> None:
        with self._listeners_lock:
            self._listeners = tuple(f for f in self._listeners if f is not fn)

    def _sink(self, events: list[Event]) -> None:
        """Every event of every task passes here, on the loop thread: disk first, then views."""
        assert self.rundir is not None
        self.rundir.write_events(events)
        self.live.add_many(events)
        for fn in self._listeners:
            fn(events)
        for event in events:
            if isinstance(event, OutputLine) and event.stream == "stderr":
                self._check_startup_wait(event)
            elif isinstance(event, TelemetrySample):
                for note in event.data.get("notes") or ():
                    self._note(event.task, note.get("text", ""), note.get("level", "INFO"))
                if event.data.get("steps"):
                    self._check_stragglers()

    def _check_stragglers(self) -> None:
        steps = {name: [r for r in list(self.live.view(name).steps)[-STRAGGLER_ROWS:]
                        if r[1] >= self._cell_started]
                 for name in (rt.name for rt in self.tasks.values()
                              if rt.task.role in ("worker", "chief"))}
        found = {s.task: s for s in find_stragglers(steps)}
        for task, finding in found.items():
            if task not in self.stragglers:
                view = self.live.view(task)
                since = self._cell_started
                others = [f for name in steps if name != task
                          if (f := self.live.view(name).local_fetch_ms(since=since)) is not None]
                why = straggler_evidence(view.latest, view.input_wait_ms(),
                                         view.local_fetch_ms(since=since), others)
                self._note(task, f"{finding}; {why}", "WARNING")
        self.stragglers = found

    def _check_startup_wait(self, line: OutputLine) -> None:
        wait = self._startup_waits.feed(line.task, line.text)
        if wait is None:
            return
        states = []
        for name in wait.stragglers:
            rt = next((r for r in self.tasks.values() if r.name == name), None)
            states.append(f"{name} ({rt.state.value if rt else 'not in this cluster'})")
        self._note(wait.task, f"creating the strategy waits for {wait.missing}/{wait.total} "
                   f"task(s) to join: {', '.join(states)}", "WARNING")

    def _note(self, task: str, text: str, level: str = "INFO") -> None:
        if level in ("WARNING", "ERROR"):
            self._alerts.append(f"{task}: {text}")
        self._sink([TaskNote(time.time(), task, text, level)])

    async def _start_all(self) -> None:
        tasks = self.spec.tasks
        avoid: dict[TaskId, str] = {}
        for attempt in range(1, START_ATTEMPTS + 1):
            addresses = await asyncio.to_thread(self.launcher.tf_addresses, tasks, avoid)
            self.tasks = {t: self._runtime(t, addresses) for t in tasks}
            await self._launch(list(self.tasks.values()))
            clashes = {rt.task: rt.address for rt in self.tasks.values()
                       if rt.info.get("port_free") is False}
            if not clashes:
                if self.spec.ps:
                    await self._serve_parameter_servers(list(self.tasks.values()))
                return
            for task, addr in clashes.items():
                self._note(str(task), f"TF port {addr} was taken before start; choosing another "
                           f"(attempt {attempt})", "WARNING")
            await self._stop_tasks(list(self.tasks.values()))
            avoid.update(clashes)
        raise ClusterStartError(f"TF ports kept being taken: {sorted(map(str, avoid))}")

    def _runtime(self, task: TaskId, addresses: Mapping[TaskId, str]) -> TaskRuntime:
        tf_config = build_tf_config(task, addresses)
        env = worker_env(task, tf_config, self.extra_env, self.python,
                         base=self.launcher.base_environment(), local=not self.launcher.remote)
        assert self.rundir is not None
        self.rundir.write_json(task.slug, "tf_config.json", json.loads(tf_config))
        self.rundir.write_json(task.slug, "env.json", env)
        return TaskRuntime(task=task, address=addresses[task], tf_config=tf_config, env=env)

    async def _launch(self, runtimes: list[TaskRuntime]) -> None:
        outcomes = await asyncio.gather(*(self._launch_one(rt) for rt in runtimes),
                                        return_exceptions=True)
        failed = [(rt, exc) for rt, exc in zip(runtimes, outcomes, strict=False)
                  if isinstance(exc, BaseException)]
        if failed:
            rt, exc = failed[0]
            code = await rt.handle.poll() if rt.handle else None
            died = (f" (process {rt.handle.describe_exit(code)})"
                    if code is not None and rt.handle else "")
            await self._stop_tasks(runtimes)
            tail = "\n".join(rt.kernel_log_tail(20))
            raise ClusterStartError(
                f"{rt.name} failed to start: {type(exc).__name__}: {exc}{died}"
                + (f"\n--- last lines of {rt.name}'s process log ---\n{tail}" if tail else ""))

    async def _launch_one(self, rt: TaskRuntime) -> None:
        assert self.rundir is not None
        tdir = self.rundir.task_dir(rt.task.slug)
        rt.log_path = tdir / "kernel.log"
        rt.handle = await self.launcher.start(TaskLaunch(
            task=rt.task, env=rt.env, python=self.python, log_path=rt.log_path,
            connection_file=tdir / "kernel-connection.json"))
        rt.channel = KernelChannel(rt.name, rt.handle.client, self._sink)
        await self._unless_it_dies(rt, rt.channel.start(timeout=self.start_timeout))
        if not self.launcher.env_at_launch:
            await self._agent_call(rt, f"set_environment({json.dumps(rt.env)!r})")
        rt.info = await self._unless_it_dies(rt, self._handshake(rt))
        rt.subshell = await rt.channel.create_subshell(timeout=10)
        rt.transition(TaskEvent.READY)
        self._note(rt.name, f"ready: pid {rt.pid}, {rt.info.get('keras_flavour')}, TF "
                   f"{rt.info.get('tensorflow')}, TF_CONFIG address {rt.address}")

    async def _unless_it_dies(self, rt: TaskRuntime, step: Any) -> Any:
        """Await a start-up step, but fail at once (not at the timeout) if the process exits."""
        assert rt.handle is not None
        work = asyncio.ensure_future(step)
        deadline = time.monotonic() + self.start_timeout
        try:
            while not work.done():
                await asyncio.wait([work], timeout=0.2)
                if work.done():
                    break
                if (code := await rt.handle.poll()) is not None:
                    raise ClusterStartError(f"the process {rt.handle.describe_exit(code)} while "
                                            "starting")
                if time.monotonic() > deadline:
                    raise ClusterStartError(f"not ready after {self.start_timeout:.0f}s")
            return work.result()
        finally:
            if not work.done():
                work.cancel()

    async def _handshake(self, rt: TaskRuntime) -> dict[str, Any]:
        return json.loads(await self._agent_call(rt, f"describe_json({list(self.preload)!r})"))

    async def _agent_call(self, rt: TaskRuntime, call: str, inspect: bool = False) -> Any:
        """Evaluate ``tfdist_nb.worker.agent.<call>`` in the task, outside its history;
        ``inspect``: in its subshell, which answers while the main thread is busy, within
        INSPECT_TIMEOUT_S (asyncio.TimeoutError past it)."""
        assert rt.channel is not None
        expr = f"__import__('tfdist_nb.worker.agent', fromlist=['_']).{call}"
        ex = rt.channel.execute("", None, silent=True, user_expressions={"out": expr},
                                subshell_id=rt.subshell if inspect else None)
        try:
            reply = await (asyncio.wait_for(asyncio.shield(ex.reply), INSPECT_TIMEOUT_S)
                           if inspect else ex.reply)
        finally:
            rt.channel.abandon(ex)
        out = reply.get("user_expressions", {}).get("out", {})
        if out.get("status") != "ok":
            raise ClusterStartError(f"{rt.name}: worker agent {call} failed: "
                                    f"{out.get('ename')}: {out.get('evalue')}")
        return ast.literal_eval(out["data"]["text/plain"])

    async def _serve_parameter_servers(self, runtimes: list[TaskRuntime]) -> None:
        """With ps tasks, ps and workers run their tf.distribute.Server from the start."""
        serving = [rt for rt in runtimes if rt.task.role in ("ps", "worker")]
        targets = await asyncio.gather(*(self._agent_call(rt, "start_tf_server()")
                                         for rt in serving))
        for rt, target in zip(serving, targets, strict=True):
            self._note(rt.name, f"serving ParameterServerStrategy at {target}")

    async def _stop_tasks(self, runtimes: list[TaskRuntime]) -> list[StopReport]:
        async def one(rt: TaskRuntime) -> StopReport | None:
            if rt.handle is None:
                return None
            if rt.channel is not None:
                await rt.channel.close()
            report = await rt.handle.stop(STOP_GRACE_S)
            rt.handle, rt.channel = None, None
            rt.exit_code = report.exit_code
            return report

        reports = await asyncio.gather(*(one(rt) for rt in runtimes), return_exceptions=True)
        return [r for r in reports if isinstance(r, StopReport)]

    async def _restart(self, targets: list[TaskRuntime]) -> None:
        for rt in targets:
            rt.transition(TaskEvent.RESTART)
            self._note(rt.name, "restarting with the same TF_CONFIG")
        await self._stop_tasks(targets)
        await self._launch(targets)
        if self.spec.ps:
            await self._serve_parameter_servers(targets)


class _Inspector:
    """The runner's view of the cluster: progress from the live store, stacks and collective
    aborts through each task's subshell, every call bounded in time."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._gapped: set[str] = set()

    def progress(self, rt: TaskRuntime) -> Progress:
        v = self.cluster.live.view(rt.name)
        return Progress(v.step_count, v.lines_total, v.latest.get("cpu_percent"), v.last_sample)

    def heartbeat_gap(self, rt: TaskRuntime, busy: list[TaskRuntime]) -> None:
        """Say once per cell when a busy task's heartbeats stop: its Python threads are frozen,
        which TensorFlow does while it holds the GIL (creating a strategy that waits for its
        peers, for one); name the tasks that are not running the cell with it."""
        v = self.cluster.live.view(rt.name)
        if v.last_sample is None or time.time() - v.last_sample < HEARTBEAT_GAP_S:
            self._gapped.discard(rt.name)
            return
        if rt.name in self._gapped:
            return
        self._gapped.add(rt.name)
        names = {b.name for b in busy}
        others = [f"{t.name} ({t.state.value})" for t in self.cluster.tasks.values()
                  if t.name not in names and t.task.role in ("worker", "chief")]
        text = (f"no heartbeat for {time.time() - v.last_sample:.0f}s: its Python threads are "
                "blocked (TensorFlow holds the GIL, as when creating a strategy that waits for "
                "its peers to join)")
        if others:
            text += f"; not running this cell: {', '.join(others)}: run it on every task"
        self.cluster._note(rt.name, text, "WARNING")

    def last_words(self, rt: TaskRuntime) -> tuple[dict[str, Any] | None, list[str]]:
        v = self.cluster.live.view(rt.name)
        return (v.latest or None), [line.text for line in list(v.lines)[-8:]]

    async def stacks(self, rt: TaskRuntime) -> dict[str, Any] | None:
        if rt.channel is None or rt.state is TaskState.DEAD:
            return None
        try:
            text = await self.cluster._agent_call(rt, "stacks_json()", inspect=True)
        except (asyncio.TimeoutError, ClusterStartError):
            return None
        return json.loads(text)

    async def abort_collectives(self, rt: TaskRuntime, reason: str) -> None:
        if rt.channel is None or rt.state is TaskState.DEAD:
            return
        with contextlib.suppress(asyncio.TimeoutError, ClusterStartError):
            await self.cluster._agent_call(rt, f"abort_collectives({reason!r})", inspect=True)
            self.cluster._note(rt.name, f"aborted its collectives ({reason}); restart the "
                               "tasks before the next collective", "WARNING")


def format_stacks(found: dict[str, Any] | None) -> str:
    if found is None:
        return "(no answer: the task is dead or did not answer in time)"
    main = found.get("main", {})
    parts = [f"main thread: {main.get('kind')} at {main.get('at')}"]
    parts += [f"--- {name} ---\n{stack}" for name, stack in found.get("threads", {}).items()]
    return "\n".join(parts)


async def _gather(*coros: Any) -> list[Any]:
    """``asyncio.gather`` as a coroutine, created on the loop thread (for ``LoopThread.run``)."""
    return list(await asyncio.gather(*coros))


@atexit.register
def _stop_all_at_exit() -> None:
    for cluster in list(_live):
        with contextlib.suppress(Exception):
            cluster.stop()
