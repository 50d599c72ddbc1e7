"""The ``Cluster`` facade (docs/reference.md, Python API): validate arguments, hand the work to
the cluster's loop thread, wait with a deadline. The work itself lives in the modules of
docs/design.md, "Rooms of the package".
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from tfdist_nb.cluster import exposure
from tfdist_nb.cluster.cells import Cells, InputHandler
from tfdist_nb.cluster.diagnose_api import Diagnose
from tfdist_nb.cluster.environment import check_env, resolve_python
from tfdist_nb.cluster.hub import EventHub
from tfdist_nb.cluster.isolate import DEFAULT_BUDGET_S, Isolation
from tfdist_nb.cluster.lifecycle import STOP_GRACE_S, STOP_TIMEOUT_S, Lifecycle, start_error
from tfdist_nb.cluster.loop import LoopThread
from tfdist_nb.cluster.profiler import Profiler
from tfdist_nb.cluster.session import SESSION
from tfdist_nb.cluster.spare import WarmOutcome, spare_count
from tfdist_nb.cluster.spares import PoolUser, SparesSummary
from tfdist_nb.cluster.start_steps import Setup, place
from tfdist_nb.cluster.state import TaskEvent, TaskState
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.cluster.views import status_frame, waiting_for_prompt
from tfdist_nb.debuglog import swallowed
from tfdist_nb.diagnostics.isolate_report import IsolateReport
from tfdist_nb.diagnostics.straggler import Straggler
from tfdist_nb.errors import SpecError, TfdistError, platform_refusal
from tfdist_nb.events import Event
from tfdist_nb.launchers.base import Launcher, StopReport
from tfdist_nb.launchers.registry import launcher_class, make_launcher
from tfdist_nb.results import RunResult
from tfdist_nb.store.rundir import RunDirectory, new_cluster_id
from tfdist_nb.store.snapshot import ClusterSnapshot, TaskSnapshot
from tfdist_nb.store.state import StateFile, state_doc
from tfdist_nb.store.tails import LiveStore
from tfdist_nb.topology import ClusterSpec, Targets, TaskId

if TYPE_CHECKING:
    from tfdist_nb.display.dashboard import Dashboard

logger = logging.getLogger(__name__)


class Cluster(Diagnose):
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
                 launcher_options: Mapping[str, object] | None = None,
                 warm: bool | int | None = None, gpus: str | Sequence[str | int] = "auto",
                 gpus_per_task: int | None = None) -> None:
        if said := platform_refusal():
            raise SpecError(said)
        spec = ClusterSpec(workers=workers, chief=int(chief), ps=ps, evaluator=int(evaluator))
        # the class of launcher= (a name or a launcher): its capabilities say what it takes
        kind = type(launcher) if isinstance(launcher, Launcher) else launcher_class(launcher)
        if hosts is not None and not kind.remote:
            raise SpecError(f"hosts= needs launcher='ssh'; the {kind.name} launcher runs its "
                            "tasks on this machine")
        if start_timeout <= 0:
            raise SpecError("start_timeout must be positive (seconds for the whole start)")
        check_env(env)
        self.hosts = list(hosts) if hosts else None
        self.launcher_options = dict(launcher_options or {})
        chosen = (launcher if isinstance(launcher, Launcher)
                  else make_launcher(launcher, self.hosts, python, self.launcher_options))
        # A remote interpreter is looked up on its host (the probe says if it is missing there).
        interpreter = (python or sys.executable) if chosen.remote else resolve_python(python)
        # NVML is read here, so a request that cannot be met fails before any start
        self.gpu_request, plan = place(gpus, gpus_per_task, spec, chosen, env or {})
        self.setup = Setup(spec=spec, launcher=chosen, python=interpreter,
                           preload=tuple(preload), extra_env=dict(env or {}),
                           start_timeout=float(start_timeout), gpus=plan)
        self.tasks: dict[TaskId, TaskRuntime] = {}
        self.running = False
        self._spares = PoolUser(self.setup, spare_count(warm, chosen, self.setup), self.tasks,
                                lambda text, level: self._note("spares", text, level))
        self.stall_timeout = float(stall_timeout)
        self._run_root = run_dir
        self._exposure_said = exposure.SaidOnce()
        self.id = new_cluster_id()
        # read-only for extensions and tests (docs/reference.md, the Cluster's attributes)
        self.rundir: RunDirectory | None = None
        self.live = LiveStore()
        self.hub: EventHub | None = None
        self._state: StateFile | None = None  # state.json for the lab panes (store/state.py)
        self._lifecycle: Lifecycle | None = None
        self._loop: LoopThread | None = None
        self._dashboard: Dashboard | None = None
        self.last_stop: list[StopReport] = []
        self._profiler = Profiler(self.tasks, self._require_loop)
        self._cells = Cells(self._profiler)  # the cells run, and how they ended
        #: the notebook sends every cell here (%tfdist_mode on); shown by the dashboard
        self.persistent_mode = False

    # what the cluster was made with (the magics compare a new line against these)
    spec = property(lambda self: self.setup.spec)
    launcher = property(lambda self: self.setup.launcher)
    python = property(lambda self: self.setup.python)
    preload = property(lambda self: self.setup.preload)
    extra_env = property(lambda self: self.setup.extra_env)
    start_timeout = property(lambda self: self.setup.start_timeout)
    #: each task's GPUs, and the line said about them (``.line``; None: nothing placed)
    gpu_plan = property(lambda self: self.setup.gpus)

    @property
    def passed_cells(self) -> set[int]:
        """Cells that ended ok on every task (``%tfdist_isolate`` re-runs them as set-up)."""
        return self._cells.passed

    @property
    def failed_cells(self) -> dict[int, tuple[RunResult, str]]:
        """The last ``cells.FAILURES_KEPT`` cells that failed, with their code (what it re-runs)."""
        return self._cells.failed

    # ------------------------------------------------------------------ lifecycle
    def start(self, *, announce: bool = True) -> Cluster:
        """Start every task in parallel; ``start_timeout`` bounds the whole start. ``announce``:
        log the network the tasks got (WARNING when their TF ports are open on the host's
        network or they have no outbound network); ``%%tfcluster`` prints its own lines."""
        if self.running:
            return self
        self.rundir = RunDirectory(self._run_root, self.id)
        self.hub = EventHub(self.rundir, self.live, self._task_states)
        self._state = StateFile(self.rundir.path, self.id, str(self.spec),
                                lambda: state_doc(self.snapshot(), self.live)).start()
        self._lifecycle = Lifecycle(self.setup, self.rundir, self.hub, self.tasks)
        self._loop = SESSION.loop()
        SESSION.clusters.track(self)
        self._spares.base = self.rundir.path
        self._lifecycle.spares = SESSION.take_pool(self._spares if self._spares.count else None)
        try:
            self._loop.run(self._lifecycle.start_all(), self.start_timeout + STOP_TIMEOUT_S)
        except BaseException as exc:
            self._teardown()
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise start_error(exc, self.spec) from exc
        self.running = True
        self._loop.call_soon(self._lifecycle.watch_exits)
        self._state.mark("running")
        SESSION.clusters.set_current(self)
        self._warn_mismatch()
        if announce:
            self._announce_network()
        return self

    def _announce_network(self) -> None:
        trouble = self.launcher.network_trouble()
        level = logging.WARNING if trouble is not None or (
            not self.launcher.remote and not self.launcher.confined) else logging.INFO
        logger.log(level, "tfdist_nb: %s ready; %s%s%s", self.spec, self.network(),
                   f"; {trouble.cause}: {trouble.cure}" if trouble is not None else "",
                   f"; {self.gpu_plan.line}" if self.gpu_plan.line else "")

    def stop(self, *, keep_spares: bool = False) -> list[StopReport]:
        """End every task and spare at once (shutdown request, short grace, then SIGKILL).
        ``keep_spares``: the spares are kept for the cluster about to replace this one (a
        ``%%tfcluster`` resize), and the tasks are killed without grace."""
        if self._loop is None:
            return self.last_stop
        self._cells.stop_all(self._loop)
        keep = keep_spares and self._lifecycle is not None and self._lifecycle.spares is not None
        if self._lifecycle is not None:
            with swallowed(logger):
                self.last_stop = self._loop.run(self._lifecycle.stop_all(
                    0.0 if keep else STOP_GRACE_S), STOP_TIMEOUT_S)
        self._cells.wait(5)
        self._teardown(keep)
        return self.last_stop

    def _teardown(self, keep_spares: bool = False) -> None:
        self.running = False
        self._profiler.armed = None  # an armed capture does not outlive the tasks
        if self._dashboard is not None:
            with swallowed(logger):
                self._dashboard.stop()
        if self._loop is not None:
            if self._lifecycle is not None and any(rt.handle for rt in self.tasks.values()):
                with swallowed(logger):
                    self._loop.run(self._lifecycle.stop_all(), STOP_TIMEOUT_S)
            self._loop = None  # the session's: it serves the next cluster
        self._give_back(keep_spares)
        self.launcher.release()
        for rt in self.tasks.values():
            if rt.state is not TaskState.STOPPED:
                rt.transition(TaskEvent.STOP)
        if self._state is not None:
            self._state.close()
        if self.rundir is not None and (lost := self.rundir.close()):
            warnings.warn(f"tfdist_nb: {lost}", RuntimeWarning, stacklevel=2)
        SESSION.clusters.forget(self)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def restart(self, on: Targets = None) -> None:
        """Bring the targeted tasks back as fresh kernels with the same TF_CONFIG.

        With spare kernels (``warm=``) the tasks are spares adopted in well under a second; a
        restart of every task then also moves to fresh TF ports. A task no spare fits starts
        cold, and ``str(warm_outcome)`` says why in one line."""
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
        return self._spares.count

    @property
    def warm_outcome(self) -> WarmOutcome | None:
        """How the last start or restart used spare kernels (``adopted``, ``still_warming``,
        ``cold``, ``why_cold``, ``fresh_ports``); None without spares."""
        return self._lifecycle.warm if self._lifecycle is not None else None

    def spares(self) -> SparesSummary:
        """The spare kernels now: ``count`` (kept at most), ``ready``, ``warming``, ``pids``,
        ``note`` (why none is being started, e.g. memory)."""
        pool = self._lifecycle.spares if self._lifecycle is not None else None
        count = self._spares.count
        if pool is None:
            return {"ready": 0, "warming": 0, "pids": [], "note": None if count else "off",
                    "count": count}
        return {**pool.summary(), "count": count}

    def set_warm(self, warm: bool | int | None) -> None:
        """Turn spare kernels on (``True`` or a number) or off (``False``) for this cluster."""
        self._spares.count = spare_count(warm, self.launcher, self.setup)
        if self.running and self._lifecycle is not None:
            if not self._spares.count:
                self._give_back()
            elif self._lifecycle.spares is None:
                self._lifecycle.spares = SESSION.take_pool(self._spares)

    def _give_back(self, keep: bool = False) -> None:
        """The session's pool back (kept for the next cluster of its key with ``keep``)."""
        if self._lifecycle is not None and (pool := self._lifecycle.spares) is not None:
            self._lifecycle.spares = None
            with swallowed(logger):
                SESSION.give_back(pool, self._spares, keep)

    # ------------------------------------------------------------------ running cells
    def interrupt(self, on: Targets = None, grace_s: float = 2.0) -> list[str]:
        """Interrupt the targeted tasks: SIGINT first; a task with a thread still inside a
        TensorFlow op ``grace_s`` later (SIGINT cannot reach it there, docs/design.md) gets its
        collectives aborted. Returns the tasks whose collectives were aborted."""
        targets = self._runtimes(on, allow_dead=True)
        return self._require_loop().run(self._inspector().interrupt(targets, grace_s),
                                        grace_s + 20)

    def run(self, code: str, on: Targets = None, timeout: float | None = None, *,
            on_event: Callable[[Event], None] | None = None,
            stall_timeout: float | None = None,
            on_input: InputHandler | None = None, number: int | None = None) -> RunResult:
        """Run ``code`` on the targeted tasks at once and return when all have ended.

        ``number``: the cell's ``In[n]``, so tracebacks and the ledger name it as the notebook
        does (one not above the last run's takes the next). ``on_event`` gets every event in
        the caller's thread while the cell runs; pressing interrupt interrupts the tasks. A task
        with no progress for ``stall_timeout`` (default: the cluster's) ends the run as stalled.
        ``on_input(task, prompt, password) -> str`` answers the tasks' ``input()``, ``getpass``
        and pdb prompts in the caller's thread (``ask_here`` asks this process's user); without
        it they raise StdinNotImplementedError (docs/reference.md, Input from the tasks).
        """
        targets = self._runtimes(self._default_targets() if on is None else on)
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be positive")
        assert self.rundir is not None and self.hub is not None
        return self._cells.run(targets, code, timeout, stall_timeout or self.stall_timeout,
                               on_event, rundir=self.rundir, hub=self.hub,
                               loop=self._require_loop(), inspector=self._inspector(),
                               alive=lambda: self._loop is not None,
                               network=self.launcher.network_trouble, on_input=on_input,
                               number=number)

    # ------------------------------------------------------------------ views
    def status(self) -> pd.DataFrame:
        """One row per task: the columns of docs/reference.md (Status columns); the spare
        kernels are in ``.attrs["spares"]``."""
        frame = status_frame(self.tasks.values(), self.live, self._stragglers)
        frame.attrs["spares"] = self.spares()
        return frame

    def isolate(self, cell: int | None = None, budget_s: float = DEFAULT_BUDGET_S, *,
                warm: bool | None = None,
                on_progress: Callable[[str], None] | None = None) -> IsolateReport:
        """Re-run the last failing cell (or ``cell``), with the cells that set the tasks up, in
        fresh kernels under smaller variants, within ``budget_s`` seconds; returns an
        ``IsolateReport`` (``.table``, ``.smallest``, ``.verdict``, ``.export(DIR)``). This
        cluster is left as it was. ``warm``: the variants use this cluster's spare kernels
        (default: when it has them). ``on_progress`` gets a line as each variant starts and
        ends. Interrupting ends the variant running and returns what is known."""
        return Isolation(self, type(self), cell, budget_s, warm, on_progress).run()

    @property
    def _stragglers(self) -> dict[str, Straggler]:
        """The current cell's stragglers by task name, with their lateness."""
        return self.hub.stragglers if self.hub is not None else {}

    def dashboard(self, start: bool = True) -> Dashboard:
        """The live dashboard, an ipywidgets box: display it, or leave it as a cell's last
        expression. A new one retires the previous one's refresh timer."""
        from tfdist_nb.display.dashboard import Dashboard

        if self._dashboard is not None:
            self._dashboard.stop()
        self._dashboard = Dashboard(self.snapshot, self.live)
        return self._dashboard.start() if start else self._dashboard

    def snapshot(self) -> ClusterSnapshot:
        """What the views are told about this cluster now, as one value (any thread)."""
        tasks = list(self.tasks.values())
        waiting = waiting_for_prompt(tasks, self.live)
        return ClusterSnapshot(
            id=self.id, spec=str(self.spec), running=self.running,
            run_dir=str(self.run_dir) if self.run_dir else "",
            tasks=tuple(TaskSnapshot(rt.name, rt.task.role, rt.shown_state, rt.pid, rt.host,
                                     tuple(waiting.get(rt.name, ())), rt.gpus,
                                     rt.connection_file)
                        for rt in tasks),
            alerts=tuple(self.hub.alerts) if self.hub is not None else (),
            stragglers={name: s.lag_ms for name, s in self._stragglers.items()},
            spares=dict(self.spares()), disk_trouble=self.disk_trouble(),
            persistent_mode=self.persistent_mode)

    @property
    def run_dir(self) -> Path | None:
        return self.rundir.path if self.rundir else None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<Cluster {self.id} {self.spec} {state} launcher={self.launcher.name}>"

    def _repr_html_(self) -> str:
        return f"<p><b>{self!r}</b></p>" + self.status().to_html(index=False, na_rep="")

    # ------------------------------------------------------------------ internals
    def _task_states(self) -> dict[str, tuple[str, str]]:
        return {rt.name: (rt.task.role, rt.state.value) for rt in list(self.tasks.values())}
