"""The magics that start and run the cluster (docs/reference.md, Magics): ``%%tfcluster``,
``%tfdist_restart`` / ``_interrupt`` / ``_stop`` / ``_loglevel`` / ``_mode``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from tfdist_nb.errors import TaskError
from tfdist_nb.launchers.registry import BUILTIN, launcher_class
from tfdist_nb.magics.common import (
    F,
    current,
    magic,
    notebook_asks,
    on_option,
    parse_line,
    require,
    usage,
    user_errors,
)
from tfdist_nb.magics.launcher_flags import glue_values
from tfdist_nb.magics.mode import PersistentMode
from tfdist_nb.magics.request import (
    ClusterRequest,
    PlanAction,
    Running,
    build_request,
    plan,
)

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from tfdist_nb.cluster.facade import Cluster

DASHBOARD_LINES = 200  # per task and cell in the cell output; the dashboard and disk have all
PLAIN_LINES = 5000


def builtin_launcher_flags(fn: F) -> F:
    """The built-in launchers' flags (their ``line_options``), declared so that ``%%tfcluster?``
    lists them; a plugin's are read from the rest of the line."""
    flags = [o for name in BUILTIN for o in launcher_class(name).line_options]
    for option in reversed(flags):  # the parser takes them in the order declared
        fn = argument(option.flag, metavar=option.metavar, help=option.help)(fn)
    return fn


@magics_class
class RunMagics(Magics):
    """``%%tfcluster`` and the magics that control its tasks."""

    def __init__(self, shell: InteractiveShell | None = None, **kwargs: object) -> None:
        super().__init__(shell, **kwargs)
        self._noise_said: dict[str, set[str]] = {}  # run directory -> known noise already said
        self.mode = PersistentMode()  # %tfdist_mode

    @magic_arguments()
    @argument("spec", nargs="*",
              help="cluster SPEC: pairs of <count> <role>, e.g. '2 workers', "
                   "'1 chief 2 workers 1 ps'. Omit it to use the running cluster.")
    @on_option
    @argument("--env", action="append", metavar="KEY=VALUE",
              help="environment variable for every task, set before TensorFlow is imported "
                   "(repeatable), e.g. --env TF_USE_LEGACY_KERAS=1")
    @argument("--timeout", type=float, metavar="SECONDS",
              help="end the whole cell after this many seconds (tasks are interrupted)")
    @argument("--stall-timeout", type=float, metavar="SECONDS",
              help="seconds without progress before a busy task counts as stalled")
    @argument("--restart", action="store_true",
              help="start every task afresh before running (a second strategy needs this)")
    @argument("--python", metavar="PATH", help="worker interpreter (default: this kernel's)")
    @argument("--gpus", metavar="auto|none|LIST",
              help="GPUs for the workers and chief: auto (default) an even, disjoint share of "
                   "the GPUs the notebook sees (NVML; none placed without it); none: hide all; "
                   "a list (0,1 or GPU-UUIDs) shared out the same way. ps tasks get none")
    @argument("--gpus-per-task", type=int, metavar="N",
              help="GPUs each worker and the chief get (default: an even share)")
    @argument("--launcher", metavar="NAME",
              help="local (default) | ssh (with --hosts) | attach (with --connection-dir) | "
                   "slurm (one sbatch job, --sbatch for its options) | ray (--ray-address)")
    @builtin_launcher_flags
    @argument("--warm", dest="warm", action="store_true", default=None,
              help="keep spare worker kernels with TensorFlow imported, so --restart and a "
                   "resize take well under a second (default for the local launcher)")
    @argument("--no-warm", dest="warm", action="store_false", default=None,
              help="no spare kernels: restarts and resizes start cold")
    @argument("--no-dashboard", action="store_true",
              help="show plain attributed output instead of the live dashboard")
    @argument("--verbose", action="store_true",
              help="also show TensorFlow's INFO log lines live (by default they go to the run "
                   "directory, the dashboard and %%tfdist_logs, and the cell counts them)")
    @argument("--from-mode", action="store_true", help=argparse.SUPPRESS)  # %tfdist_mode's
    @line_cell_magic
    @user_errors()
    def tfcluster(self, line: str, cell: str | None = None) -> None:
        """Start (or reuse, or resize) a multi-worker TensorFlow cluster and run the cell on it.

        Every task is a real ipykernel with its own TF_CONFIG, set before TensorFlow is
        imported. The cell body runs on all targeted tasks at once; their output streams live,
        each line prefixed with its task. If a task raises, its traceback is shown under its
        name and the cell raises, so "Run All" stops. A task's ``input()``, ``getpass`` or
        ``breakpoint()`` prompts in this cell, naming the task, one task at a time (where the
        frontend takes input: JupyterLab, Notebook); ``%tfdist_debug`` opens pdb on a task's
        last exception.

        A cluster of the same SPEC is reused; a different SPEC replaces it and says
        ``resized: 2 workers -> 1 worker`` (shrinking a failing job is one edit of this line).
        The line form (``%tfcluster 2 workers``) only ensures the cluster exists.

        Examples::

            %%tfcluster 2 workers
            import tensorflow as tf
            strategy = tf.distribute.MultiWorkerMirroredStrategy()

            %%tfcluster 2 workers --on 1          # only worker:1
            %%tfcluster 2 workers --env TF_USE_LEGACY_KERAS=1   # tf_keras for model.fit
            %%tfcluster --restart                  # fresh kernels, same cluster
            %%tfcluster 4 workers --hosts gpu1,gpu2   # over SSH, 2 tasks per host
            %%tfcluster 2 workers --gpus 0,1       # worker:0 GPU 0, worker:1 GPU 1
            %%tfcluster 2 workers --sbatch "--nodes=2"  # one SLURM job, a task per node
            %%tfcluster 2 workers --ray-address ray://head:10001   # Ray actors, one per task
        """
        args, request = self._read_line(line)
        cluster = self._ensure(request)
        cluster.persistent_mode = self.mode.on
        if args.from_mode:
            print("tfdist_nb: persistent mode: this cell runs on the cluster (%tfdist_mode off "
                  "to run cells here)", flush=True)
        if cell is None or not cell.strip():
            return None
        # the cell as the user sees it: with the magic line as its line 1, or (persistent
        # mode) without one, so a task's traceback names the lines the notebook shows
        code = cell if args.from_mode else f"# %%tfcluster {line}\n{cell}"
        return self._run(cluster, code, request)

    def _read_line(self, line: str) -> tuple[argparse.Namespace, ClusterRequest]:
        """The parsed ``%%tfcluster`` line and the request it makes; what the magic's parser
        does not take goes to the chosen launcher's flags."""
        parse = self.tfcluster.parser.parse_known_args
        args, rest = parse_line(glue_values(line), parse)
        return args, build_request(args, rest)

    def _ensure(self, request: ClusterRequest) -> Cluster:
        """Do what ``plan()`` decided for this line: reuse, restart, or start a cluster."""
        from tfdist_nb.cluster.facade import Cluster

        active = current()
        decided = plan(request, running_of(active))
        if decided.message:
            print(f"tfdist_nb: {decided.message}")
        if decided.action in (PlanAction.REUSE, PlanAction.RESTART):
            assert active is not None  # plan() keeps, restarts or re-warms a running one only
            if decided.set_warm is not None:
                active.set_warm(decided.set_warm)
            if decided.action is PlanAction.RESTART:
                active.restart()  # from spare kernels where they fit (docs/design.md)
                if active.warm_outcome is not None:
                    print(f"tfdist_nb: {active.warm_outcome}")
            return active
        new = decided.new
        assert new is not None
        # made (and so checked) before the running cluster is stopped for it
        cluster = Cluster(workers=new.spec.workers, ps=new.spec.ps, chief=bool(new.spec.chief),
                          evaluator=bool(new.spec.evaluator), launcher=new.launcher,
                          hosts=new.hosts, env=new.env, python=new.python,
                          stall_timeout=new.stall_timeout, launcher_options=new.launcher_options,
                          warm=new.warm, gpus=new.gpus.choice, gpus_per_task=new.gpus.per_task)
        if active is not None:  # the new cluster may take over its spare kernels
            active.stop(keep_spares=decided.keep_spares)
        where = f"on {', '.join(new.hosts)}" if new.hosts else cluster.launcher.name
        print(f"tfdist_nb: starting {new.spec} ({where}) ...", flush=True)
        cluster.start(announce=False)  # said in the lines below
        if cluster.warm_outcome is not None:
            print(f"tfdist_nb: {cluster.warm_outcome}")
        print(f"tfdist_nb: {new.spec} ready ({cluster._keras_summary()}); run directory "
              f"{cluster.run_dir}", flush=True)
        print(f"tfdist_nb: {cluster.network()}", flush=True)
        if cluster.gpu_plan.line:  # where the GPUs went (docs/reference.md, GPUs)
            print(f"tfdist_nb: {cluster.gpu_plan.line}", flush=True)
        return cluster

    def _run(self, cluster: Cluster, code: str, request: ClusterRequest) -> None:
        from tfdist_nb.display.printer import LivePrinter, failure_report

        printer = LivePrinter(max_lines_per_task=DASHBOARD_LINES if request.dashboard
                              else PLAIN_LINES, run_dir=cluster.run_dir,
                              verbose=request.verbose,
                              noise_said=self._noise_said.setdefault(str(cluster.run_dir), set()))
        dashboard = cluster.dashboard() if request.dashboard else None
        if dashboard is not None:
            from IPython.display import display

            display(dashboard)
        try:
            result = cluster.run(code, on=request.on,
                                 timeout=request.timeout, on_event=printer,
                                 stall_timeout=request.stall_timeout,
                                 on_input=notebook_asks(),
                                 number=notebook_cell_number(self.shell))
        finally:
            printer.flush()  # the tasks' lines go out before the closing lines, in order
            if dashboard is not None:
                dashboard.refresh()
        if printer.hidden():
            trouble = cluster.disk_trouble()
            kept = (f"on disk in {cluster.run_dir}/events.jsonl" if trouble is None else
                    f"kept (in memory until the run directory can be written: {trouble})")
            print(f"tfdist_nb: {printer.hidden()} more lines are {kept} (%tfdist_logs)")
        for note in [*printer.noise_notes(), printer.held_back_note()]:
            if note:
                print(note)
        if result.profile:
            print(f"tfdist_nb: {result.profile}")
        if exposed := cluster.exposure_note():
            print(f"tfdist_nb: {exposed}")
        sys.stdout.flush()
        if not result.ok:
            sys.stderr.write(failure_report(result))
            sys.stderr.flush()
            raise TaskError(result.summary(), result)
        return None

    @magic("example: %tfdist_interrupt --on 1")
    @on_option
    def tfdist_interrupt(self, args: argparse.Namespace) -> None:
        """Interrupt the targeted tasks: SIGINT, then, for a task still stuck inside a TensorFlow
        op (a collective) two seconds later, abort its collectives (restart before the next)."""
        aborted = require().interrupt(on=args.on)
        if aborted:
            print(f"tfdist_nb: {', '.join(aborted)} did not answer SIGINT inside a TensorFlow "
                  "op; their collectives were aborted: %tfdist_restart before training again")

    @magic("example: %tfdist_restart --on 1   (or: --on worker:0,worker:1)")
    @on_option
    def tfdist_restart(self, args: argparse.Namespace) -> None:
        """Restart the targeted tasks as fresh kernels with the same TF_CONFIG."""
        cluster = require()
        cluster.restart(on=args.on)
        warm = cluster.warm_outcome  # spare kernels: how they were used
        how = (f"({warm})" if warm is not None and warm.fresh_ports else
               "with the same TF_CONFIG" + (f" ({warm})" if warm is not None else ""))
        print(f"tfdist_nb: restarted {args.on or 'all tasks'} {how}")
        spec = cluster.spec
        if args.on not in (None, "all") and spec.workers + spec.chief > 1 and not spec.ps:
            print("tfdist_nb: with MultiWorkerMirroredStrategy every task has to restart "
                  "together (the others still belong to the old collective group): run "
                  "%tfdist_restart without --on to restart them all")

    @magic("example: %tfdist_stop")
    def tfdist_stop(self, args: argparse.Namespace) -> None:
        """Stop every task of the active cluster (fast: short grace, then SIGKILL)."""
        cluster = current()
        if cluster is None:
            print("tfdist_nb: no cluster is running")
            return
        reports = cluster.stop()
        print(f"tfdist_nb: stopped {len(reports)} task(s) of {cluster.spec}")

    @magic("example: %tfdist_loglevel INFO --cpp 0")
    @argument("level", help="DEBUG | INFO | WARNING | ERROR | CRITICAL (Python and tf logger)")
    @argument("--cpp", type=int, metavar="N",
              help="TF_CPP_MIN_LOG_LEVEL for TensorFlow's C++ logs (0-3); restarts the tasks")
    @argument("--vmodule", metavar="SPEC",
              help="TF_CPP_VMODULE, e.g. 'collective_ops=2'; restarts the tasks")
    def tfdist_loglevel(self, args: argparse.Namespace) -> None:
        """Set the log level on every task.

        The Python level (root and ``tensorflow`` loggers) changes at once. TensorFlow reads its
        C++ settings only at start-up, so ``--cpp`` / ``--vmodule`` restart every task (which
        loses their state) and say so.

        Examples::

            %tfdist_loglevel DEBUG
            %tfdist_loglevel INFO --cpp 0 --vmodule collective_ops=2
        """
        print(f"tfdist_nb: {require().set_log_level(args.level, args.cpp, args.vmodule)}")

    @magic("example: %tfdist_mode on --timeout 600   (then: %tfdist_mode off)")
    @argument("state", nargs="?", choices=["on", "off"], help="on | off (none: say the mode)")
    @argument("options", nargs=argparse.REMAINDER,
              help="with on: the %%%%tfcluster line every cell gets, e.g. --on 1 --timeout 600 "
                   "(or a SPEC: 2 workers)")
    def tfdist_mode(self, args: argparse.Namespace) -> None:
        """Persistent mode: while on, every cell runs on the cluster as if it began with
        ``%%tfcluster`` and the options given here (ipyparallel's ``%autopx``); cells that
        begin with a tfdist_nb magic (``%tfdist_*``, ``%%tfcluster``) still run here.

        Examples::

            %tfdist_mode on
            %tfdist_mode on --on 1 --timeout 600
            %tfdist_mode off
        """
        if args.state is None:
            print(f"tfdist_nb: persistent mode is {self._mode_said()}")
            return
        if args.state == "off":
            self.mode.turn_off()
            if (active := current()) is not None:
                active.persistent_mode = False
            print("tfdist_nb: persistent mode off: cells run in this notebook again")
            return
        options = " ".join(args.options)
        _, request = self._read_line(options)
        if request.spec is None and current() is None:
            raise usage("no cluster is running to send the cells to; give its SPEC, or start "
                        "it first with %%tfcluster 2 workers",
                        "example: %tfdist_mode on 2 workers --timeout 600")
        assert self.shell is not None  # a magic runs in its shell
        self.mode.turn_on(self.shell, options)
        if (active := current()) is not None:
            active.persistent_mode = True
        print(f"tfdist_nb: persistent mode {self._mode_said()}: every cell runs on the cluster "
              "(each says so); %tfdist_mode off to run cells here")

    def _mode_said(self) -> str:
        if not self.mode.on:
            return "off"
        return f"on (%%tfcluster {self.mode.options})" if self.mode.options else "on"


def running_of(cluster: Cluster | None) -> Running | None:
    """What ``plan()`` needs of the running cluster (None: there is none)."""
    if cluster is None:
        return None
    return Running(spec=cluster.spec, env=dict(cluster.extra_env), python=cluster.python,
                   launcher=cluster.launcher.name, hosts=cluster.hosts,
                   launcher_options=dict(cluster.launcher_options),
                   line_values=cluster.launcher.line_values(),
                   restartable=cluster.launcher.restartable, warm=cluster.warm,
                   gpus=cluster.gpu_request)


def notebook_cell_number(shell: InteractiveShell | None) -> int | None:
    """The notebook's ``In[n]`` of the cell running now: the number IPython's compiler named
    the cell's code by, found on the stack (``execution_count`` is n during the cell in
    IPython 8 and n + 1 in IPython 9)."""
    names = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    frame: Any = sys._getframe(1)
    while frame is not None:
        number = names.get(frame.f_code.co_filename)
        if isinstance(number, int):
            return number
        frame = frame.f_back
    return None
