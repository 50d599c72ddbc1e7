"""The ``Cluster`` facade (docs/reference.md, Python API): validate arguments, hand the work to
the cluster's loop thread, wait with a deadline.

The jobs live in their own modules: :mod:`.lifecycle` starts and stops tasks, :mod:`.runner`
runs a cell, :mod:`.hub` fans events out to disk, views and detectors, :mod:`.inspector` reads
stacks and aborts collectives, :mod:`.agent_client` calls into the worker agent, :mod:`.views`
builds the DataFrames, :mod:`.registry` knows the active cluster.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from tfdist_nb.cluster import exposure, registry, report
from tfdist_nb.cluster.checks import CheckRunner
from tfdist_nb.cluster.environment import TASK_OWNED, resolve_python
from tfdist_nb.cluster.export import ExportError, ours_or_absent, restart_times
from tfdist_nb.cluster.export import export as export_reproducer
from tfdist_nb.cluster.hub import RUN_DIRECTORY, EventHub
from tfdist_nb.cluster.inspector import Inspector, format_stacks
from tfdist_nb.cluster.isolate import DEFAULT_BUDGET_S, IsolateReport, Isolation
from tfdist_nb.cluster.lifecycle import Lifecycle, Setup
from tfdist_nb.cluster.loop import LoopThread
from tfdist_nb.cluster.profiler import Capture, describe, finish_capture, start_capture
from tfdist_nb.cluster.relay import RUN_DONE, relay
from tfdist_nb.cluster.runner import RunControl, RunEnd, run_cell
from tfdist_nb.cluster.session import SESSION
from tfdist_nb.cluster.spare import WarmOutcome
from tfdist_nb.cluster.spares import SparePool, spare_count
from tfdist_nb.cluster.state import CannotRun, TaskEvent, TaskState, next_state
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.cluster.views import status_frame
from tfdist_nb.debuglog import swallowed
from tfdist_nb.diagnostics.env_check import critical_mismatch
from tfdist_nb.diagnostics.env_check import env_frame as env_table
from tfdist_nb.diagnostics.hangs import where_each_stands
from tfdist_nb.diagnostics.numerics import first_nan
from tfdist_nb.diagnostics.report import CheckReport
from tfdist_nb.diagnostics.straggler import Straggler
from tfdist_nb.errors import ClusterNotRunningError, ClusterStartError, SpecError, TfdistError
from tfdist_nb.events import Event
from tfdist_nb.launchers.base import Launcher, StopReport
from tfdist_nb.launchers.registry import make_launcher
from tfdist_nb.results import RunResult
from tfdist_nb.store.ledger_frame import collectives_frame
from tfdist_nb.store.logs import logs_frame, parse_levels
from tfdist_nb.store.rundir import RunDirectory, new_cluster_id, open_private
from tfdist_nb.store.snapshot import ClusterSnapshot, TaskSnapshot
from tfdist_nb.store.state import StateFile, state_doc
from tfdist_nb.store.tails import LiveStore
from tfdist_nb.topology import ClusterSpec, TaskId, parse_targets
from tfdist_nb.worker.telemetry import telemetry_interval

logger = logging.getLogger(__name__)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
STOP_TIMEOUT_S = 30.0
FAILURES_KEPT = 20  # failing cells (result and code) a cluster keeps for %tfdist_isolate
INSPECT_CALL_S = 15.0
CHECK_TIMEOUT_S = 300.0
START_HINT = ("tfdist_nb: check what the tasks need before they start: tfdist_nb."
              "check_tf_config(...) for a TF_CONFIG of your own; once a cluster runs, "
              "%tfdist_check all (TF_CONFIG, network, environment)")


def current() -> Cluster | None:
    """The notebook's active cluster (the one the magics drive), or None."""
    return registry.current()


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
                 launcher_options: Mapping[str, Any] | None = None,
                 warm: bool | int | None = None) -> None:
        spec = ClusterSpec(workers=workers, chief=int(chief), ps=ps, evaluator=int(evaluator))
        if hosts is not None and launcher == "local":
            raise SpecError("hosts= needs launcher='ssh'; the local launcher runs on this machine")
        if start_timeout <= 0:
            raise SpecError("start_timeout must be positive (seconds for the whole start)")
        for where, value in (("the environment", os.environ.get("TFDIST_TELEMETRY_INTERVAL")),
                             ("env=", (env or {}).get("TFDIST_TELEMETRY_INTERVAL"))):
            try:
                telemetry_interval(value)
            except ValueError as exc:
                raise SpecError(f"{exc} (from {where})") from None
        owned = sorted(set(env or {}) & set(TASK_OWNED))
        if owned:
            raise SpecError(f"env={owned[0]} cannot be set: {TASK_OWNED[owned[0]]}")
        self.hosts = list(hosts) if hosts else None
        self.launcher_options = dict(launcher_options or {})
        chosen = (launcher if isinstance(launcher, Launcher)
                  else make_launcher(launcher, self.hosts, python, self.launcher_options))
        # A remote interpreter is looked up on its host (the probe says if it is missing there).
        interpreter = (python or sys.executable) if chosen.remote else resolve_python(python)
        self.setup = Setup(spec=spec, launcher=chosen, python=interpreter,
                           preload=tuple(preload), extra_env=dict(env or {}),
                           start_timeout=float(start_timeout))
        # spare kernels (docs/reference.md, warm=): how many, 0 for none
        self._warm = spare_count(warm, chosen, self.setup)
        self.stall_timeout = float(stall_timeout)
        self._run_root = run_dir
        self._exposure_said = exposure.SaidOnce()
        self.id = new_cluster_id()
        self.rundir: RunDirectory | None = None
        self.live = LiveStore()
        self.tasks: dict[TaskId, TaskRuntime] = {}
        self.hub: EventHub | None = None
        self._state: StateFile | None = None  # state.json for the lab panes (store/state.py)
        self._lifecycle: Lifecycle | None = None
        self._loop: LoopThread | None = None
        self._dashboard: Any = None
        self._cell = 0
        self._active_runs: dict[RunControl, concurrent.futures.Future[Any]] = {}
        self.last_stop: list[StopReport] = []
        self.running = False
        self._armed_profile: Capture | None = None
        #: the notebook sends every cell here (%tfdist_mode on); shown by the dashboard
        self.persistent_mode = False
        #: the last run that failed and its cell's code (%tfdist_report)
        self.last_failure: tuple[RunResult, str] | None = None
        #: cells that ended ok on every task, and the last FAILURES_KEPT that did not (with
        #: their code): what %tfdist_isolate re-runs
        self.passed_cells: set[int] = set()
        self.failed_cells: dict[int, tuple[RunResult, str]] = {}

    # what the cluster was made with (the magics compare a new line against these)
    spec = property(lambda self: self.setup.spec)
    launcher = property(lambda self: self.setup.launcher)
    python = property(lambda self: self.setup.python)
    preload = property(lambda self: self.setup.preload)
    extra_env = property(lambda self: self.setup.extra_env)
    start_timeout = property(lambda self: self.setup.start_timeout)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Cluster:
        """Start every task in parallel; ``start_timeout`` bounds the whole start."""
        if self.running:
            return self
        self.rundir = RunDirectory(self._run_root, self.id)
        self.hub = EventHub(self.rundir, self.live, self._task_states)
        self._state = StateFile(self.rundir.path, self.id, str(self.spec),
                                lambda: state_doc(self.snapshot(), self.live)).start()
        self._lifecycle = Lifecycle(self.setup, self.rundir, self.hub, self.tasks)
        self._loop = SESSION.loop()
        if self._warm:  # the replaced cluster's spares, if it left them (a resize)
            self._lifecycle.spares = self._attach_pool(SESSION.take_pool() or
                                                       SparePool(self._warm))
        else:
            SESSION.drop_pool()
        registry.track(self)
        if self._lifecycle.spares is not None:  # filled in the background, CPU allowing: on a
            self._loop.call_soon(self._lifecycle.spares.start_refill)  # host with idle cores,
        try:                                          # while the tasks themselves start
            self._loop.run(self._lifecycle.start_all(), self.start_timeout + STOP_TIMEOUT_S)
        except BaseException as exc:
            self._teardown()
            if isinstance(exc, KeyboardInterrupt):
                raise
            text = str(exc) if isinstance(exc, ClusterStartError) else (
                f"cluster of {self.spec} did not start: {exc}")
            raise ClusterStartError(f"{text}\n{START_HINT}") from exc
        self.running = True
        self._loop.call_soon(self._lifecycle.exits.start)
        self._state.mark("running")
        registry.set_current(self)
        self._warn_mismatch()
        return self

    def stop(self, *, keep_spares: bool = False) -> list[StopReport]:
        """End every task and spare at once (shutdown request, short grace, then SIGKILL).

        ``keep_spares``: a cluster about to replace this one (``%%tfcluster`` resize) takes
        over its spare kernels: they are kept in the session, and the tasks are killed without
        grace (docs/design.md, Spare kernels).
        """
        if self._loop is None:
            return self.last_stop
        for control in list(self._active_runs):  # a cell still running ends now, not later
            self._loop.call_soon(control.stop, RunEnd.STOPPED)
        if self._lifecycle is not None:
            with swallowed(logger):
                if keep_spares and self._lifecycle.spares is not None:
                    self.last_stop, pool = self._loop.run(self._lifecycle.stop_for_handoff(),
                                                          STOP_TIMEOUT_S)
                    if pool is not None:
                        SESSION.keep_pool(pool)
                else:
                    self.last_stop = self._loop.run(self._lifecycle.stop_all(), STOP_TIMEOUT_S)
        concurrent.futures.wait(list(self._active_runs.values()), timeout=5)
        self._teardown()
        return self.last_stop

    def _teardown(self) -> None:
        self.running = False
        self._armed_profile = None  # an armed capture does not outlive the tasks
        if self._dashboard is not None:
            with swallowed(logger):
                self._dashboard.stop()
        if self._loop is not None:
            if self._lifecycle is not None and (any(rt.handle for rt in self.tasks.values())
                                                or self._lifecycle.spares is not None):
                with swallowed(logger):
                    self._loop.run(self._lifecycle.stop_all(), STOP_TIMEOUT_S)
            self._loop = None  # the session's: it serves the next cluster
        self.launcher.release()
        for rt in self.tasks.values():
            if rt.state is not TaskState.STOPPED:
                rt.transition(TaskEvent.STOP)
        if self._state is not None:
            self._state.close()
        if self.rundir is not None and (lost := self.rundir.close()):
            warnings.warn(f"tfdist_nb: {lost}", RuntimeWarning, stacklevel=2)
        registry.forget(self)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def restart(self, on: Any = None) -> None:
        """Bring the targeted tasks back as fresh kernels with the same TF_CONFIG.

        With spare kernels (``warm=``) the tasks are spares adopted in well under a second; a
        restart of every task then also moves to fresh TF ports. A task no spare fits starts
        cold, and ``warm_note`` says why in one line."""
        targets = self._runtimes(on, allow_dead=True)
        if not self.launcher.restartable:
            raise TfdistError(f"the {self.launcher.name} launcher cannot restart single tasks: "
                              f"their scheduler started them; {self.launcher.restart_instead}")
        assert self._lifecycle is not None
        self._require_loop().run(self._lifecycle.restart(targets),
                                 self.start_timeout + STOP_TIMEOUT_S)

    # ------------------------------------------------------------------ spare kernels
    @property
    def warm(self) -> int:
        """How many spare kernels this cluster keeps (0: none; docs/reference.md, warm=)."""
        return self._warm

    @property
    def warm_outcome(self) -> WarmOutcome | None:
        """How the last start or restart used spare kernels (``adopted``, ``still_warming``,
        ``cold``, ``why_cold``, ``fresh_ports``); None without spares."""
        return self._lifecycle.warm if self._lifecycle is not None else None

    @property
    def warm_note(self) -> str | None:
        """``warm_outcome`` in one line: ``"2 task(s) from spare kernels on fresh TF ports"``,
        or ``"cold start for ...: <why>"``; None without spares."""
        outcome = self.warm_outcome
        return None if outcome is None else str(outcome)

    def spares(self) -> dict[str, Any]:
        """The spare kernels now: ``count`` (kept at most), ``ready``, ``warming``, ``pids``,
        ``note`` (why none is being started, e.g. memory)."""
        pool = self._lifecycle.spares if self._lifecycle is not None else None
        if pool is None:
            return {"count": 0, "ready": 0, "warming": 0, "pids": [],
                    "note": None if self._warm else "off"}
        return pool.summary()

    def set_warm(self, warm: bool | int | None) -> None:
        """Turn spare kernels on (``True`` or a number) or off (``False``) for this cluster."""
        self._warm = spare_count(warm, self.launcher, self.setup)
        if not self.running or self._lifecycle is None:
            return
        lifecycle, loop = self._lifecycle, self._require_loop()
        if not self._warm:
            loop.run(lifecycle.close_spares(), STOP_TIMEOUT_S)
        elif lifecycle.spares is not None:
            lifecycle.spares.count = self._warm
        else:
            lifecycle.spares = self._attach_pool(SparePool(self._warm))
            loop.call_soon(lifecycle.spares.start_refill)

    def lend_spares(self) -> bool:
        """Hand this cluster's spare kernels to the session for clusters started beside it
        (``isolate()``'s variants); False if it has none. ``reclaim_spares`` takes them back."""
        lifecycle = self._lifecycle
        if not self.running or lifecycle is None or lifecycle.spares is None:
            return False
        pool, lifecycle.spares = lifecycle.spares, None
        self._require_loop().run(pool.detach(), STOP_TIMEOUT_S)
        SESSION.keep_pool(pool)
        return True

    def reclaim_spares(self, lent: bool) -> None:
        """After clusters started beside this one: take the session's kept pool back if this
        cluster ``lent`` its spares (an empty pool of its own if none is left), else end it."""
        lifecycle = self._lifecycle
        if not lent or not self.running or lifecycle is None or not self._warm:
            SESSION.drop_pool()
            return
        lifecycle.spares = self._attach_pool(SESSION.take_pool() or SparePool(self._warm))
        self._require_loop().call_soon(lifecycle.spares.start_refill)

    def make_current(self) -> None:
        """The cluster the magics drive again (after clusters started beside it)."""
        if self.running:
            registry.set_current(self)

    def _attach_pool(self, pool: SparePool) -> SparePool:
        assert self.rundir is not None
        pool.attach(self.setup, self.rundir.path, self._spares_busy,
                    lambda text, level: self._note("spares", text, level), count=self._warm,
                    starting=lambda: sum(rt.state is TaskState.STARTING
                                         for rt in list(self.tasks.values())))
        return pool

    def _spares_busy(self) -> bool:
        """No spare starts while tasks are being restarted: the restart takes what the pool
        has. Otherwise (a cell running, the cluster's own start) the pool looks at the host's
        CPU and memory."""
        return any(rt.state is TaskState.RESTARTING for rt in list(self.tasks.values()))

    # ------------------------------------------------------------------ inspection and control
    def stacks(self, on: Any = None) -> dict[str, str]:
        """Python stacks of every thread of each task, also while its main thread is blocked
        inside a TensorFlow op: they are taken in the task's inspection subshell."""
        targets = self._runtimes(on, allow_dead=True)
        inspector = self._inspector()
        found = self._require_loop().run(_gather(*(inspector.stacks(rt) for rt in targets)),
                                         INSPECT_CALL_S)
        return {rt.name: format_stacks(s) for rt, s in zip(targets, found, strict=True)}

    def collectives(self, on: Any = None, last: int | None = 20) -> pd.DataFrame:
        """Every targeted task's collective ledger (docs/reference.md, "Collectives and
        hangs"): its last ``last`` collectives (None: all kept), eager and inside tf.function,
        with kind, dtype, shape, bytes, function, the line that made it, state and times."""
        if last is not None and last <= 0:
            raise SpecError("last must be a positive number of rows (or None for all)")
        targets = self._runtimes(on, allow_dead=True)
        return collectives_frame({rt.name: self.live.view(rt.name).ledger for rt in targets},
                                 last)

    def collectives_now(self, on: Any = None) -> dict[str, str]:
        """Where each targeted task stands in its collectives, in words (``%tfdist_stacks``)."""
        targets = self._runtimes(on, allow_dead=True)
        return where_each_stands({rt.name: self.live.view(rt.name).ledger for rt in targets},
                                 time.time())

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
                   if rt.state is not TaskState.DEAD and rt.agent is not None]
        args = {k: v for k, v in params.items() if v is not None}
        said = self._require_loop().run(
            _gather(*(rt.agent.inject(kind, args) for rt in targets if rt.agent)),
            INSPECT_CALL_S)
        for rt, text in zip(targets, said, strict=True):
            self._note(rt.name, f"fault injection: {text}",
                       "WARNING" if kind != "clear" else "INFO")
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
            assert self._lifecycle is not None
            self._lifecycle.refresh_env()
            self.restart()
            said.append("restarted all tasks so the C++ log settings take effect")
        targets = self._runtimes("all")
        self._require_loop().run(
            _gather(*(rt.agent.set_log_level(level) for rt in targets if rt.agent)), 30)
        said.insert(0, f"log level {level} on {len(targets)} task(s)")
        return "; ".join(said)

    def interrupt(self, on: Any = None, grace_s: float = 2.0) -> list[str]:
        """Interrupt the targeted tasks: SIGINT first; a task with a thread still inside a
        TensorFlow op ``grace_s`` later (SIGINT cannot reach it there, docs/design.md) gets its
        collectives aborted. Returns the tasks whose collectives were aborted."""
        targets = self._runtimes(on, allow_dead=True)
        return self._require_loop().run(self._inspector().interrupt(targets, grace_s),
                                        grace_s + 20)

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
        refused = []
        for rt in targets:  # a task still stalled in an earlier cell cannot take this one
            try:
                next_state(rt.state, TaskEvent.RUN)
            except CannotRun as exc:
                refused.append(f"{rt.name}: {exc}")
        if refused:
            raise ClusterNotRunningError("cannot run this cell: " + "; ".join(refused))
        assert self.rundir is not None and self.hub is not None
        self._cell += 1
        cell = self._cell
        self.hub.new_cell([rt.name for rt in targets])
        events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        listener = events.put
        self.hub.add_listener(listener)
        if remade := self.rundir.ensure():
            self.hub.note(RUN_DIRECTORY, remade, "WARNING")
        if disk := self.rundir.write_cell(cell, code, [rt.name for rt in targets]):
            self.hub.note(RUN_DIRECTORY, *disk)  # said in this cell's output too
        loop = self._require_loop()
        control = RunControl()
        fut = loop.submit(run_cell(targets, code, cell, timeout, control,
                                   inspector=self._inspector(),
                                   stall_timeout=stall_timeout or self.stall_timeout))
        fut.add_done_callback(lambda _: events.put(RUN_DONE))
        self._active_runs[control] = fut
        capture, self._armed_profile = self._armed_profile, None
        profiling = self._profile_cell(capture) if capture is not None else None
        try:
            relay(events, on_event, fut, lambda: loop.call_soon(control.stop, RunEnd.INTERRUPT),
                  alive=lambda: self._loop is not None)
        finally:
            self.hub.remove_listener(listener)
            self._active_runs.pop(control, None)
        result = RunResult(cell=cell, tasks=fut.result(timeout=10), hang=control.hang)
        if profiling is not None and capture is not None:
            result.profile = self._profile_text(*profiling, capture)
        if origin := first_nan(result.failed):
            self._note("cluster", origin.splitlines()[0], "WARNING")
        if result.ok:
            self.passed_cells.add(cell)
        else:
            self.last_failure = (result, code)
            self.failed_cells[cell] = (result, code)
            for old in sorted(self.failed_cells)[:-FAILURES_KEPT]:
                del self.failed_cells[old]
        return result

    def _profile_cell(self, capture: Capture) -> tuple[TaskRuntime | None, str | None]:
        """Start an armed capture as the cell starts; a failure is said, not raised."""
        targets = [rt for rt in self.tasks.values() if rt.agent]
        try:
            return self._require_loop().run(start_capture(targets, capture), 120), None
        except (TfdistError, TimeoutError, asyncio.TimeoutError) as exc:
            return None, f"the profile capture did not start: {exc}"

    def _profile_text(self, lead: TaskRuntime | None, failed: str | None,
                      capture: Capture) -> str:
        if lead is None:
            return str(failed)
        try:
            summary = self._require_loop().run(
                finish_capture(lead, capture),
                (capture.delay_ms + capture.duration_ms) / 1000 + 120)
        except (TfdistError, TimeoutError, asyncio.TimeoutError) as exc:
            return f"the profile capture failed: {exc}"
        return describe(summary, capture)

    # ------------------------------------------------------------------ views
    def status(self) -> pd.DataFrame:
        """One row per task: the columns of docs/reference.md (Status columns); the spare
        kernels are in ``.attrs["spares"]``."""
        frame = status_frame(self.tasks.values(), self.live, self.stragglers)
        frame.attrs["spares"] = self.spares()
        return frame

    def logs(self, on: Any = None, grep: str | None = None, tail: int | None = None,
             level: str | None = None) -> pd.DataFrame:
        """The merged log of all tasks from the run directory: time, task, stream, level, text.

        ``level``: only lines of these levels, comma separated (``"INFO"``, ``"WARNING,ERROR"``).
        """
        if self.rundir is None:
            raise ClusterNotRunningError("the cluster has not been started")
        names = None if on is None else {str(t) for t in parse_targets(on, self.spec)}
        try:
            levels = parse_levels(level)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if grep is not None:
            try:
                re.compile(grep)
            except re.error as exc:
                raise SpecError(f"grep: {grep!r} is not a regular expression ({exc})") from None
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int)
                                 or tail < 1):
            raise SpecError(f"tail: {tail!r} is not a number of lines (1 or more)")
        return logs_frame(self.rundir.iter_events(), on=names, grep=grep, tail=tail,
                          levels=levels)

    def env(self) -> pd.DataFrame:
        """Every task's environment read now, side by side: index = property (Python, TF and
        its CUDA/cuDNN build, Keras, numpy, GPUs and driver, OS, host, every ``$TF_*``,
        ``$CUDA_*``, ``$NCCL_*``, ``$XLA_*`` variable, then ``pkg:NAME`` for installed packages
        whose versions differ), a column per task, and a bool ``mismatch`` column."""
        targets = self._runtimes("all")
        return self._require_loop().run(CheckRunner(targets).env(), CHECK_TIMEOUT_S)

    def check(self, kind: str, expr: Any = None, on: Any = None, **options: Any) -> CheckReport:
        """A preflight or consistency check (docs/reference.md, Checks): ``"tfconfig"`` (with
        ``expr`` a TF_CONFIG to check instead of the tasks' own: JSON text, dict or file path),
        ``"network"``, ``"env"`` or ``"all"`` (tfconfig, network and env); ``"sharding"`` and
        ``"variables"`` with ``expr`` an expression evaluated in every task and their
        ``options`` (``reference``, ``max_elements``, ``max_seconds``; ``atol``, ``rtol``)."""
        targets = self._runtimes(on)
        limit = CHECK_TIMEOUT_S + 2 * float(options.get("max_seconds", 0))
        return self._require_loop().run(CheckRunner(targets).run(kind, expr, **options), limit)

    def numerics(self, on: bool, dump_dir: str | os.PathLike[str] | None = None) -> str:
        """NaN/Inf checking on every task (``%tfdist_numerics``): the first op whose output
        holds NaN or Inf raises, and the cell names the first task and op across tasks.
        ``dump_dir``: also write Debugger V2 dumps, one root per task (``dump_dir/worker-1``)."""
        targets = self._runtimes("all")
        root = Path(dump_dir).absolute() if dump_dir else None
        if root is not None and on:
            _directory_to_write(root, "--dump")
        said = self._require_loop().run(_gather(*(
            rt.agent.set_numerics(on, str(root / rt.task.slug) if root else None, timeout=60)
            for rt in targets if rt.agent)), 120)
        text = f"NaN/Inf checking {'on' if on else 'off'} on {len(said)} task(s)"
        if root and on:
            text += (f"; Debugger V2 dumps in {root}/<task> (one root per task: open each with "
                     f"%tensorboard --logdir {root}/worker-0, Debugger V2 tab)")
        return text

    def profile(self, duration_ms: int = 2000, logdir: str | os.PathLike[str] | None = None,
                now: bool = False, delay_ms: int = 500) -> str:
        """A profiler trace of every task at once into one logdir (``%tfdist_profile``).

        ``now``: capture what the tasks do now and wait for it; otherwise the capture is armed
        and starts with the next cell (``delay_ms`` after it is sent) and is read when that cell
        ends. Returns what to tell the user (where the trace is and how to open it)."""
        if duration_ms <= 0:
            raise SpecError("--duration-ms must be a positive number of milliseconds")
        self._runtimes("all")
        assert self.rundir is not None
        where = Path(logdir).absolute() if logdir else self.rundir.path / "profile"
        _directory_to_write(where, "--logdir")
        capture = Capture(where, int(duration_ms), 0 if now else int(delay_ms))
        if not now:
            self._armed_profile = capture
            return (f"profile of {duration_ms} ms armed: it starts with the next cell and is "
                    f"written to {where}")
        return self._take_profile(capture)

    def _take_profile(self, capture: Capture) -> str:
        lead, failed = self._profile_cell(capture)
        if lead is None:
            raise TfdistError(str(failed))
        return self._profile_text(lead, None, capture)

    def export(self, directory: str | os.PathLike[str], force: bool = False) -> Path:
        """A standalone reproducer of what the cluster ran (``%tfdist_export``): ``train.py``
        (the cells, in order) and ``launch.sh`` (the same tasks here, same TF_CONFIG layout and
        env), owner-only. Works on a stopped cluster too. Files of those names that it did not
        write are kept (SpecError) unless ``force``; secrets are named in a SecretsWarning."""
        if self.rundir is None:
            raise ClusterNotRunningError("the cluster has not run anything yet")
        targets = self.default_targets()
        try:
            return export_reproducer(
                directory, cluster_id=self.id, spec=self.spec, cells=self.rundir.cells(),
                env=self.extra_env, python=self.python,
                restarts=restart_times(self.rundir.iter_events()),
                default_targets=None if targets == "all" else targets.split(","), force=force)
        except ExportError as exc:
            raise SpecError(str(exc)) from None

    def report(self, directory: str | os.PathLike[str], force: bool = False) -> Path:
        """``%tfdist_report``: ``DIR/report.md`` (tasks and their software, TF_CONFIGs, alerts,
        the last failing cell per task, the last lines of each task, the collective ledger;
        secrets redacted) beside the reproducer :meth:`export` writes there. Works on a
        stopped cluster too."""
        path = Path(directory) / report.REPORT
        if not force and not ours_or_absent(path):  # before anything is written there
            raise SpecError(f"{path} exists and was not written by %tfdist_report: kept (give "
                            "--force, or another directory)")
        out = self.export(directory, force=force)
        failure, code = self.last_failure if self.last_failure else (None, None)
        names = [rt.name for rt in self.tasks.values()]
        logs = self.logs() if self.rundir is not None else pd.DataFrame()
        last = {n: list(logs[logs["task"] == n]["text"].tail(report.LAST_LINES))
                if len(logs) else [] for n in names}
        ledger = []
        for name in names:
            for row in self.live.view(name).ledger.recent(report.LEDGER_ROWS):
                ledger.append({"task": name, **row})
        text = report.markdown(
            cluster_id=self.id, spec=str(self.spec), tasks=report.task_rows(self.tasks.values()),
            tf_configs=report.tf_config_lines(self.tasks.values()), env=self.extra_env,
            alerts=self.alerts(), failure=failure, failed_code=code, last_lines=last,
            ledger=ledger, secrets=report.secret_values(
                [c.get("code", "") for c in self.rundir.cells()] if self.rundir else [],
                self.extra_env))
        path = out / report.REPORT
        try:
            with open_private(path, "w") as f:
                f.write(text)
        except OSError as exc:
            raise SpecError(f"{path}: cannot write the report ({exc.strerror or exc})") from None
        return path

    def isolate(self, cell: int | None = None, budget_s: float = DEFAULT_BUDGET_S, *,
                warm: bool | None = None,
                on_progress: Callable[[str], None] | None = None) -> IsolateReport:
        """Re-run the last failing cell (or ``cell``), with the cells that set the tasks up, in
        fresh kernels under smaller variants, within ``budget_s`` seconds; returns an
        ``IsolateReport`` (``.table``, ``.smallest``, ``.verdict``, ``.export(DIR)``). This
        cluster is left as it was. ``warm``: the variants use this cluster's spare kernels
        (default: when it has them). ``on_progress`` gets a line as each variant starts and
        ends. Interrupting ends the variant running and returns what is known."""
        return Isolation(self, cell, budget_s, warm, on_progress).run()

    def _warn_mismatch(self) -> None:
        """A cluster whose tasks run different Python, TensorFlow or Keras is said at once."""
        infos = {rt.name: {"props": {k: rt.info.get(k) for k in
                                     ("python", "tensorflow", "keras_flavour")}}
                 for rt in self.tasks.values()}
        said = critical_mismatch(env_table(infos)) if len(infos) > 1 else None
        if said:
            self._note("cluster", f"environment mismatch: {said} (%tfdist_env shows all)",
                       "WARNING")

    def alerts(self) -> list[str]:
        """What the cluster warned about, newest last (the dashboard's alerts area)."""
        return list(self.hub.alerts) if self.hub is not None else []

    @property
    def stragglers(self) -> dict[str, Straggler]:
        """The current cell's stragglers by task name, with their lateness."""
        return self.hub.stragglers if self.hub is not None else {}

    def dashboard(self, start: bool = True) -> Any:
        """The live dashboard, an ipywidgets box: display it, or leave it as a cell's last
        expression. A new one retires the previous one's refresh timer."""
        from tfdist_nb.display.dashboard import Dashboard

        if self._dashboard is not None:
            self._dashboard.stop()
        self._dashboard = Dashboard(self.snapshot, self.live)
        return self._dashboard.start() if start else self._dashboard

    def snapshot(self) -> ClusterSnapshot:
        """What the views are told about this cluster now, as one value (any thread)."""
        return ClusterSnapshot(
            id=self.id, spec=str(self.spec), running=self.running,
            run_dir=str(self.run_dir) if self.run_dir else "",
            tasks=tuple(TaskSnapshot(rt.name, rt.task.role, str(rt.state), rt.pid, rt.host)
                        for rt in list(self.tasks.values())),
            alerts=tuple(self.alerts()),
            stragglers={name: s.lag_ms for name, s in self.stragglers.items()},
            spares=self.spares(), disk_trouble=self.disk_trouble(),
            persistent_mode=self.persistent_mode)

    def default_targets(self) -> str:
        """Where a cell runs without ``on=``: every task, or the chief when ps tasks serve."""
        if self.spec.ps:
            return "chief:0" if self.spec.chief else ",".join(
                str(t) for t in self.spec.tasks if t.role == "worker")
        return "all"

    def keras_summary(self) -> str:
        """Which TensorFlow and Keras the tasks run, with the ``fit`` caveat for Keras 3 under
        the strategy this cluster's shape is for (ps tasks: ParameterServerStrategy)."""
        flavours = sorted({str(rt.info.get("keras_flavour")) for rt in self.tasks.values()})
        tf = sorted({str(rt.info.get("tensorflow")) for rt in self.tasks.values()})
        text = f"TF {'/'.join(tf)}, {'/'.join(flavours)}"
        if "keras 3" not in flavours:
            return text
        if self.spec.ps:
            text += (": model.fit under ParameterServerStrategy (DatasetCreator, "
                     "ClusterCoordinator) runs on tf_keras: TF_USE_LEGACY_KERAS=1")
        elif self.spec.workers + self.spec.chief > 1:
            text += ": model.fit under MultiWorkerMirroredStrategy needs TF_USE_LEGACY_KERAS=1"
        return text

    @property
    def run_dir(self) -> Path | None:
        return self.rundir.path if self.rundir else None

    def tf_exposure(self) -> dict[str, int]:
        """The tasks whose TensorFlow gRPC port listens on every interface of this host now
        (task -> port): TensorFlow binds all interfaces, unauthenticated, once a strategy or a
        ``tf.distribute.Server`` starts. Local clusters only; what remote launchers expose is
        in docs/security.md."""
        if self.launcher.remote or self.launcher.confined:
            return {}  # remote: exposure_note; confined: the ports are in the tasks' netns
        return exposure.open_ports(self.tasks.values())

    def exposure_note(self) -> str | None:
        """The line naming the exposed TF ports, the first time this set of them listens
        (a restart onto fresh ports is said again); kept in the run directory's log."""
        line = None
        if self.launcher.remote:
            serving = exposure.remote_servers(self.tasks.values(), bool(self.spec.ps),
                                              self.hub.live if self.hub else None)
            if self._exposure_said.first_time(serving):
                line = exposure.describe_remote(serving)
        elif self._exposure_said.first_time(open_ports := self.tf_exposure()):
            line = exposure.describe(open_ports)
            if why := self.launcher.why_not_confined:
                line += f". They are not confined to a private network: {why}"
        if line is not None:
            self._note("cluster", line, "INFO")
        return line

    def network(self) -> str:
        """Who can reach this cluster's TensorFlow ports, one line (the launcher says)."""
        return self.launcher.network()

    def disk_trouble(self) -> str | None:
        """Why the run directory cannot be written now (its output is held in memory meanwhile,
        docs/reference.md), else None."""
        return self.rundir.trouble() if self.rundir else None

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

    def _inspector(self) -> Inspector:
        assert self.hub is not None
        return Inspector(self.hub, self.tasks)

    def _task_states(self) -> dict[str, tuple[str, str]]:
        return {rt.name: (rt.task.role, rt.state.value) for rt in list(self.tasks.values())}

    def _note(self, task: str, text: str, level: str = "INFO") -> None:
        if self.hub is not None:
            self.hub.note(task, text, level)


async def _gather(*coros: Any) -> list[Any]:
    """``asyncio.gather`` as a coroutine, created on the loop thread (for ``LoopThread.run``)."""
    return list(await asyncio.gather(*coros))


def _directory_to_write(path: Path, option: str) -> None:
    """Make ``path`` (owner-only) or say in one line why it cannot hold what will be written
    there (a file in the way, a read-only mount, no permission): a SpecError naming
    ``option``, before any task is asked to write."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SpecError(f"{option} {path}: cannot make this directory "
                        f"({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SpecError(f"{option} {path}: not writable by this user")
