"""The ``Cluster``'s tools for looking into and acting on its tasks (docs/reference.md, Python
API): stacks, the collective ledgers, teaching faults, log levels, the environment, checks,
numerics, profiles, the post-mortem debugger, the reproducer and the report; with the helpers
both use (the targets a call names, the loop, notes). A mixin of the facade
(:class:`tfdist_nb.cluster.facade.Cluster`), which owns the state they read; the facade's own
module keeps starting, running, restarting, stopping and the views.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import pandas as pd

from tfdist_nb.cluster import exposure, report
from tfdist_nb.cluster.cells import Cells, InputHandler, ask_here, first_raised
from tfdist_nb.cluster.checks import CheckOptions, CheckRunner, TfConfigGiven
from tfdist_nb.cluster.export import ExportError, restart_times
from tfdist_nb.cluster.export import export as export_reproducer
from tfdist_nb.cluster.inspector import Inspector
from tfdist_nb.cluster.loop import gather
from tfdist_nb.cluster.profiler import directory_to_write
from tfdist_nb.cluster.state import TaskState
from tfdist_nb.diagnostics import env_check
from tfdist_nb.diagnostics.hangs import where_each_stands
from tfdist_nb.diagnostics.report import CheckReport
from tfdist_nb.errors import ClusterNotRunningError, SpecError
from tfdist_nb.events import Event
from tfdist_nb.results import TaskResult
from tfdist_nb.store.ledger_frame import collectives_frame
from tfdist_nb.store.logs import check_filters, logs_frame
from tfdist_nb.topology import ClusterSpec, Targets, parse_targets
from tfdist_nb.worker.inject import KINDS as FAULTS

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from tfdist_nb.cluster.hub import EventHub
    from tfdist_nb.cluster.lifecycle import Lifecycle
    from tfdist_nb.cluster.loop import LoopThread
    from tfdist_nb.cluster.profiler import Profiler
    from tfdist_nb.cluster.task import TaskRuntime
    from tfdist_nb.gpu_plan import GpuPlan
    from tfdist_nb.launchers.base import Launcher
    from tfdist_nb.store.rundir import RunDirectory
    from tfdist_nb.store.tails import LiveStore
    from tfdist_nb.topology import TaskId

INSPECT_CALL_S = 15.0
INJECT_CALL_S = 15.0
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
CHECK_TIMEOUT_S = 300.0


class FaultParams(TypedDict, total=False):
    """A teaching fault's parameters (``%tfdist_inject``'s flags); None: not given."""

    at_step: int | None
    seconds: float | None
    where: str | None
    limit_mb: float | None


class Diagnose:
    """The facade's inspection and artifact methods; what they read is the facade's."""

    id: str
    running: bool
    tasks: dict[TaskId, TaskRuntime]
    live: LiveStore
    hub: EventHub | None
    rundir: RunDirectory | None
    _lifecycle: Lifecycle | None
    _loop: LoopThread | None
    _exposure_said: exposure.SaidOnce
    _profiler: Profiler
    _cells: Cells

    if TYPE_CHECKING:  # the facade's (docs/reference.md, the Cluster's attributes)
        spec: ClusterSpec
        launcher: Launcher
        python: str
        extra_env: dict[str, str]
        gpu_plan: GpuPlan

        def restart(self, on: Targets = None) -> None: ...

    # ------------------------------------------------------------------ the facade's internals
    def _runtimes(self, on: Targets, allow_dead: bool = False) -> list[TaskRuntime]:
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

    def _note(self, task: str, text: str, level: str = "INFO") -> None:
        if self.hub is not None:
            self.hub.note(task, text, level)

    def _default_targets(self) -> str:
        """Where a cell runs without ``on=``: every task, or the chief when ps tasks serve."""
        if self.spec.ps:
            return "chief:0" if self.spec.chief else ",".join(
                str(t) for t in self.spec.tasks if t.role == "worker")
        return "all"

    # ------------------------------------------------------------------ what the cluster said
    def logs(self, on: Targets = None, grep: str | None = None, tail: int | None = None,
             level: str | None = None) -> pd.DataFrame:
        """The merged log of all tasks from the run directory: time, task, stream, level, text;
        ``level``: only lines of these levels, comma separated (``"INFO"``, ``"WARNING,ERROR"``)."""
        if self.rundir is None:
            raise ClusterNotRunningError("the cluster has not been started")
        names = None if on is None else {str(t) for t in parse_targets(on, self.spec)}
        levels = check_filters(level, grep, tail)
        return logs_frame(self.rundir.iter_events(), on=names, grep=grep, tail=tail,
                          levels=levels)

    def alerts(self) -> list[str]:
        """What the cluster warned about, newest last (the dashboard's alerts area)."""
        return [str(a) for a in self.hub.alerts] if self.hub is not None else []

    # ------------------------------------------------------------------ looking into the tasks
    def stacks(self, on: Targets = None) -> dict[str, str]:
        """Python stacks of every thread of each task, also while its main thread is blocked
        inside a TensorFlow op: they are taken in the task's inspection subshell."""
        targets = self._runtimes(on, allow_dead=True)
        return self._require_loop().run(self._inspector().stacks_text(targets), INSPECT_CALL_S)

    def collectives(self, on: Targets = None, last: int | None = 20) -> pd.DataFrame:
        """Every targeted task's collective ledger (docs/reference.md, "Collectives and
        hangs"): its last ``last`` collectives (None: all kept), eager and inside tf.function,
        with kind, dtype, shape, bytes, function, the line that made it, state and times."""
        if last is not None and last <= 0:
            raise SpecError("last must be a positive number of rows (or None for all)")
        targets = self._runtimes(on, allow_dead=True)
        return collectives_frame({rt.name: self.live.view(rt.name).ledger for rt in targets},
                                 last)

    def collectives_now(self, on: Targets = None) -> dict[str, str]:
        """Where each targeted task stands in its collectives, in words (``%tfdist_stacks``)."""
        targets = self._runtimes(on, allow_dead=True)
        return where_each_stands({rt.name: self.live.view(rt.name).ledger for rt in targets},
                                 time.time())

    def inject(self, kind: str, on: Targets = None,
               **params: Unpack[FaultParams]) -> dict[str, str]:
        """Arm a teaching fault on the targeted tasks (``%tfdist_inject``); ``"clear"`` disarms.

        Faults act through the tasks' own training path (``tw.step()``, ``tw.timed()``, the step
        timer in ``model.fit``); see :mod:`tfdist_nb.worker.inject` for the kinds.
        """
        if kind != "clear" and kind not in FAULTS:
            raise SpecError(f"unknown fault {kind!r}; one of {', '.join(FAULTS)} or clear")
        if kind != "clear" and on is None:
            raise SpecError("say which task gets the fault: --on 1 (or on='worker:1')")
        targets = self._runtimes(on, allow_dead=kind == "clear")
        # a dead task is skipped: a restart brings it back without faults
        live = [rt for rt in targets if rt.state is not TaskState.DEAD and rt.agent is not None]
        args = {k: v for k, v in params.items() if v is not None}
        said = self._require_loop().run(gather(*(
            rt.agent.inject(kind=kind, params=args) for rt in live if rt.agent)), INJECT_CALL_S)
        for rt, text in zip(live, said, strict=True):
            self._note(rt.name, f"fault injection: {text}",
                       "WARNING" if kind != "clear" else "INFO")
        return {rt.name: text for rt, text in zip(live, said, strict=True)}

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
        cpp_env = {}  # TensorFlow's C++ logging, read once at start-up
        if cpp is not None:
            cpp_env["TF_CPP_MIN_LOG_LEVEL"] = str(cpp)
        if vmodule is not None:
            cpp_env["TF_CPP_VMODULE"] = vmodule
        if cpp_env:
            self.extra_env.update(cpp_env)
            assert self._lifecycle is not None
            self._lifecycle.refresh_env()
            self.restart()
            said.append("restarted all tasks so the C++ log settings take effect")
        targets = self._runtimes("all")
        self._require_loop().run(gather(*(rt.agent.set_log_level(level=level)
                                          for rt in targets if rt.agent)), 30)
        said.insert(0, f"log level {level} on {len(targets)} task(s)")
        return "; ".join(said)

    def debug(self, on: Targets = None, *, on_input: InputHandler | None = None,
              on_event: Callable[[Event], None] | None = None) -> TaskResult:
        """A post-mortem debugger (pdb) on one task's last exception, run in that task and
        driven from here (``%tfdist_debug``): ``on`` names the task (default: the first task
        that raised in the last failing cell); ``on_input`` answers pdb's prompts (default
        ``ask_here``: this process's user); ``on_event`` gets its output. Returns when pdb
        quits (``q``), the task idle and as it was; the other tasks are not touched.
        SpecError when the task has no exception to debug."""
        name = self._debug_target(on)
        rt = self._runtimes(name)[0]
        if rt.agent is None:
            raise ClusterNotRunningError(f"{rt.name} has no worker agent (is it running?)")
        found = self._require_loop().run(rt.agent.last_exception(), INSPECT_CALL_S)
        if found is None:
            raise SpecError(f"{name} has raised no exception since it started (or restarted): "
                            "nothing to debug; %tfdist_debug --on TASK names a task whose cell "
                            "failed")
        assert self.hub is not None
        return self._cells.debug(rt, on_event, on_input or ask_here, hub=self.hub,
                                 loop=self._require_loop(), alive=lambda: self._loop is not None)

    def _debug_target(self, on: Targets) -> str:
        """The one task ``on`` names, or the first that raised in the last failing cell."""
        if on is not None:
            named = parse_targets(on, self.spec)
            if len(named) != 1:
                raise SpecError(f"debug one task at a time, not {len(named)}: e.g. "
                                "%tfdist_debug --on 1")
            return str(named[0])
        failure = self._cells.last_failure
        first = first_raised(failure[0]) if failure is not None else None
        if first is None:
            raise SpecError("no task raised in a cell of this cluster yet (the last failing cell "
                            "stalled, crashed or timed out, or none failed); name the task, e.g. "
                            "%tfdist_debug --on 1" if failure is not None else
                            "no cell of this cluster has failed yet; name the task, e.g. "
                            "%tfdist_debug --on 1")
        return first

    def env(self) -> pd.DataFrame:
        """Every task's environment read now, side by side: index = property (Python, TF and
        its CUDA/cuDNN build, Keras, numpy, GPUs and driver, OS, host, every ``$TF_*``,
        ``$CUDA_*``, ``$NCCL_*``, ``$XLA_*`` variable, then ``pkg:NAME`` for installed packages
        whose versions differ; with the Ray launcher ``ray`` and ``ray (notebook)``: Ray's
        version on each task's node and here), a column per task, and a bool ``mismatch``
        column."""
        targets = self._runtimes("all")
        df = self._require_loop().run(CheckRunner(targets).env(), CHECK_TIMEOUT_S)
        return env_check.with_launcher_rows(df, self.launcher.env_rows())

    def check(self, kind: str, expr: TfConfigGiven | None = None, on: Targets = None,
              **options: Unpack[CheckOptions]) -> CheckReport:
        """A preflight or consistency check (docs/reference.md, Checks): ``"tfconfig"`` (with
        ``expr`` a TF_CONFIG to check instead of the tasks' own: JSON text, dict or file path),
        ``"network"``, ``"env"`` or ``"all"`` (tfconfig, network and env); ``"sharding"`` and
        ``"variables"`` with ``expr`` an expression evaluated in every task and their
        ``options`` (``reference``, ``max_elements``, ``max_seconds``; ``atol``, ``rtol``)."""
        targets = self._runtimes(on)
        limit = CHECK_TIMEOUT_S + 2 * float(options.get("max_seconds", 0))
        return self._require_loop().run(
            CheckRunner(targets, self.launcher).run(kind, expr, **options), limit)

    def numerics(self, on: bool, dump_dir: str | os.PathLike[str] | None = None) -> str:
        """NaN/Inf checking on every task (``%tfdist_numerics``): the first op whose output
        holds NaN or Inf raises, and the cell names the first task and op across tasks.
        ``dump_dir``: also write Debugger V2 dumps, one root per task (``dump_dir/worker-1``)."""
        targets = self._runtimes("all")
        root = Path(dump_dir).absolute() if dump_dir else None
        if root is not None and on:
            directory_to_write(root, "--dump")
        said = self._require_loop().run(gather(*(
            rt.agent.set_numerics(on=on, dump_root=str(root / rt.task.slug) if root else None,
                                  timeout=60)
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
        return self._profiler.profile(where, duration_ms, delay_ms, now)

    def export(self, directory: str | os.PathLike[str], force: bool = False) -> Path:
        """A standalone reproducer of what the cluster ran (``%tfdist_export``): ``train.py``
        (the cells, in order) and ``launch.sh`` (the same tasks here, same TF_CONFIG layout and
        env), owner-only. Works on a stopped cluster too. Files of those names that it did not
        write are kept (SpecError) unless ``force``; secrets are named in a SecretsWarning."""
        if self.rundir is None:
            raise ClusterNotRunningError("the cluster has not run anything yet")
        targets = self._default_targets()
        try:
            return export_reproducer(
                directory, cluster_id=self.id, spec=self.spec, cells=self.rundir.cells(),
                env=self.extra_env, python=self.python,
                restarts=restart_times(self.rundir.iter_events(), map(str, self.spec.tasks)),
                default_targets=None if targets == "all" else targets.split(","), force=force,
                task_env={str(t): self.gpu_plan.env(t) for t in self.spec.tasks})
        except ExportError as exc:
            raise SpecError(str(exc)) from None

    def report(self, directory: str | os.PathLike[str], force: bool = False,
               show_env: bool = False) -> Path:
        """``%tfdist_report``: ``DIR/report.md`` (tasks and their software, TF_CONFIGs, alerts,
        the last failing cell per task, the last lines of each task, the collective ledger;
        secrets redacted, ``--env`` values hidden unless ``show_env``) beside the reproducer
        :meth:`export` writes there. Works on a stopped cluster too."""
        report.check_target(Path(directory), force)  # before anything is written there
        out = self.export(directory, force=force)
        assert self.rundir is not None  # export() needs it
        return report.write(
            out / report.REPORT, cluster_id=self.id, spec=str(self.spec),
            tasks=list(self.tasks.values()), env=self.extra_env, alerts=self.alerts(),
            failure=self._cells.last_failure, logs=self.logs(), live=self.live,
            cells=self.rundir.cells(), show_env=show_env)

    def _keras_summary(self) -> str:
        """Which TensorFlow and Keras the tasks run (from each task's start-up
        self-description), for the ``%%tfcluster`` ready line, with the ``fit`` caveat for
        Keras 3 under the strategy this cluster's shape is for (ps tasks:
        ParameterServerStrategy; docs/design.md, Facts, "Keras 3 and MWMS")."""
        infos = [rt.info for rt in self.tasks.values()]
        flavours = sorted({str(info.get("keras_flavour")) for info in infos})
        tf = sorted({str(info.get("tensorflow")) for info in infos})
        text = f"TF {'/'.join(tf)}, {'/'.join(flavours)}"
        if "keras 3" not in flavours:
            return text
        if self.spec.ps:
            text += (": model.fit under ParameterServerStrategy (DatasetCreator, "
                     "ClusterCoordinator) runs on tf_keras: TF_USE_LEGACY_KERAS=1")
        elif self.spec.workers + self.spec.chief > 1:
            text += ": model.fit under MultiWorkerMirroredStrategy needs TF_USE_LEGACY_KERAS=1"
        return text

    def tf_exposure(self) -> dict[str, int]:
        """The tasks whose TensorFlow gRPC port listens on every interface of this host now
        (task -> port): TensorFlow binds all interfaces, unauthenticated, once a strategy or a
        ``tf.distribute.Server`` starts. Local clusters only; what remote launchers expose is
        in docs/security.md."""
        return exposure.local_exposure(self.launcher, self.tasks.values())

    def exposure_note(self) -> str | None:
        """The line naming the exposed TF ports, the first time this set of them listens
        (a restart onto fresh ports is said again); kept in the run directory's log."""
        line = exposure.exposure_line(self._exposure_said, self.launcher, self.tasks.values(),
                                      bool(self.spec.ps), self.hub.live if self.hub else None)
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

    def _warn_mismatch(self) -> None:
        """A cluster whose tasks run different Python, TensorFlow or Keras is said at once: a
        multi-worker job breaks outright then."""
        if len(self.tasks) > 1 and (said := env_check.critical_mismatch(env_check.env_frame(
                {rt.name: {"props": {k: rt.info.get(k) for k in env_check.CRITICAL}}
                 for rt in self.tasks.values()}))):
            self._note("cluster", f"environment mismatch: {said} (%tfdist_env shows all)",
                       "WARNING")
