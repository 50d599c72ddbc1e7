"""The IPython magics (docs/reference.md, Magics). Each parses its line, raises UsageError for
the user's mistakes (with an example), and hands off to the
:class:`~tfdist_nb.cluster.facade.Cluster` API.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from tfdist_nb.errors import ClusterNotRunningError, SpecError, TaskError
from tfdist_nb.magics.request import (
    EXAMPLE,
    ClusterRequest,
    PlanAction,
    build_request,
    glue_sbatch,
    plan,
)
from tfdist_nb.store.rundir import open_private

DASHBOARD_LINES = 200  # per task and cell in the cell output; the dashboard and disk have all
PLAIN_LINES = 5000


def _usage(exc: Exception | str, example: str = EXAMPLE) -> UsageError:
    return UsageError(f"{exc}\n{example}")


def _parse(magic: Any, line: str, example: str = EXAMPLE) -> Any:
    """Split like a POSIX shell (quotes group words and are removed), then parse."""
    try:
        return magic.parser.parse_args(shlex.split(line))
    except ValueError as exc:  # unbalanced quotes
        raise _usage(f"cannot read the line: {exc}", example) from None
    except UsageError as exc:
        raise _usage(exc, example) from None


def _number(kind: type, least: float, inclusive: bool = False) -> Any:
    """An argparse type: a finite number of ``kind`` above ``least`` (or equal to it with
    ``inclusive``); anything else is the option's usage error, not a failure deep inside."""
    bound = f"{'at least' if inclusive else 'above'} {least:g}"

    def read(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < least or (value == least and not inclusive):
            raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number {bound}")
        return value

    read.__name__ = kind.__name__  # argparse names the type in its messages
    return read


POSITIVE_S = _number(float, 0.0)
POSITIVE_N = _number(int, 1, inclusive=True)
NOT_NEGATIVE = _number(float, 0.0, inclusive=True)
NOT_NEGATIVE_N = _number(int, 0, inclusive=True)


def _save_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` owner-only (logs carry what the cells printed), never through
    a symlink; a path that cannot be written is a UsageError naming why."""
    try:
        with open_private(Path(path), "w") as f:
            f.write(text)
    except OSError as exc:
        raise _usage(f"--save: cannot write {path}: {exc.strerror or exc}",
                     "example: %tfdist_logs --save ./tfdist_logs.jsonl") from None


def _check_options(args: Any) -> dict[str, Any]:
    """``%tfdist_check``'s options that were given, by the name ``Cluster.check`` takes."""
    wanted = {"sharding": ("reference", "max_elements", "max_seconds"),
              "variables": ("atol", "rtol")}.get(args.kind, ())
    given = {k: getattr(args, k) for k in ("reference", "max_elements", "max_seconds", "atol",
                                           "rtol") if getattr(args, k) is not None}
    extra = [f"--{k.replace('_', '-')}" for k in given if k not in wanted]
    if extra:
        raise _usage(f"the {args.kind} check takes no {', '.join(extra)}",
                     "example: %tfdist_check sharding dist_dataset --max-elements 1000")
    return given


def _on_option(fn: Any) -> Any:
    return argument("--on", metavar="TASKS", default=None,
                    help="tasks to act on: 0,1 | worker:0,ps:0 | all (default)")(fn)


@magics_class
class TfdistMagics(Magics):
    """``%%tfcluster`` and the ``%tfdist_*`` family."""

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        self._noise_said: dict[str, set[str]] = {}  # run directory -> known noise already said

    @magic_arguments()
    @argument("spec", nargs="*",
              help="cluster SPEC: pairs of <count> <role>, e.g. '2 workers', "
                   "'1 chief 2 workers 1 ps'. Omit it to use the running cluster.")
    @_on_option
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
    @argument("--hosts", metavar="H1,H2",
              help="ssh destinations as in ~/.ssh/config, tasks placed round-robin "
                   "(implies --launcher ssh)")
    @argument("--launcher", metavar="NAME",
              help="local (default) | ssh (with --hosts) | attach (with --connection-dir) | "
                   "slurm (one sbatch job, --sbatch for its options)")
    @argument("--sbatch", metavar='"ARGS"',
              help="for --launcher slurm (implied): sbatch options of the job, quoted, e.g. "
                   "--sbatch \"--partition=gpu --nodes=2 --time=1:00:00\"; SLURM_CONF and "
                   "the rest of the environment configure SLURM's tools as usual")
    @argument("--connection-dir", metavar="DIR",
              help="for --launcher attach: where workers started by a scheduler with "
                   "'python -m tfdist_nb.worker --task worker:0 --connection-dir DIR' announce "
                   "themselves")
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
    @line_cell_magic
    def tfcluster(self, line: str, cell: str | None = None) -> Any:
        """Start (or reuse, or resize) a multi-worker TensorFlow cluster and run the cell on it.

        Every task is a real ipykernel with its own TF_CONFIG, set before TensorFlow is
        imported. The cell body runs on all targeted tasks at once; their output streams live,
        each line prefixed with its task. If a task raises, its traceback is shown under its
        name and the cell raises, so "Run All" stops.

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
            %%tfcluster 2 workers --sbatch "--nodes=2"  # one SLURM job, a task per node
        """
        args = _parse(self.tfcluster, glue_sbatch(line))
        try:
            request = build_request(args)
        except SpecError as exc:
            raise _usage(exc) from None
        cluster = self._ensure(request)
        if cell is None or not cell.strip():
            return None
        return self._run(cluster, line, cell, request)

    def _ensure(self, request: ClusterRequest) -> Any:
        from tfdist_nb.cluster.facade import Cluster, current

        active = current()
        try:
            decided = plan(request, active.spec if active else None,
                           active.extra_env if active else None, active.python if active else None,
                           (active.launcher.name, active.hosts) if active else None,
                           getattr(active.launcher, "sbatch_args", None) if active else None)
        except SpecError as exc:
            raise _usage(exc) from None
        if decided.message:
            print(f"tfdist_nb: {decided.message}")
        if decided.action in (PlanAction.REUSE, PlanAction.RESTART) and request.warm is not None:
            try:
                active.set_warm(request.warm)
            except SpecError as exc:
                raise _usage(exc) from None
        if decided.action is PlanAction.REUSE:
            return active
        if decided.action is PlanAction.RESTART and active.launcher.restartable:
            active.restart()  # from spare kernels where they fit (docs/design.md)
            if active.warm_note:
                print(f"tfdist_nb: {active.warm_note}")
            return active
        launcher, hosts = request.launcher, request.hosts
        options = ({"connection_dir": request.connection_dir} if request.connection_dir else
                   {"sbatch_args": request.sbatch} if request.sbatch is not None else None)
        env, python = request.env, request.python
        if active is not None:  # a resize keeps what the line does not change
            env, python = env or active.extra_env, python or active.python
            if launcher is None:
                launcher, hosts = active.launcher.name, hosts or active.hosts
                options = options or active.launcher_options
        spec = decided.spec
        try:  # made (and so checked) before the running cluster is stopped for it
            cluster = Cluster(workers=spec.workers, ps=spec.ps, chief=bool(spec.chief),
                              evaluator=bool(spec.evaluator), launcher=launcher or "local",
                              hosts=hosts, env=env, python=python,
                              stall_timeout=request.stall_timeout or 60.0,
                              launcher_options=options,
                              warm=request.warm if request.warm is not None else
                              None if active is None or active.warm else False)
        except SpecError as exc:
            raise _usage(exc) from None
        if active is not None:  # the new cluster takes over its spare kernels
            active.stop(spares_to=cluster)
        where = f"on {', '.join(hosts)}" if hosts else cluster.launcher.name
        print(f"tfdist_nb: starting {spec} ({where}) ...", flush=True)
        cluster.start()
        if cluster.warm_note:
            print(f"tfdist_nb: {cluster.warm_note}")
        print(f"tfdist_nb: {spec} ready ({cluster.keras_summary()}); run directory "
              f"{cluster.run_dir}", flush=True)
        print(f"tfdist_nb: {cluster.network()}", flush=True)
        return cluster

    def _run(self, cluster: Any, line: str, code: str, request: ClusterRequest) -> None:
        from tfdist_nb.display.printer import LivePrinter, failure_report

        printer = LivePrinter(max_lines_per_task=DASHBOARD_LINES if request.dashboard
                              else PLAIN_LINES, run_dir=cluster.run_dir,
                              verbose=request.verbose,
                              noise_said=self._noise_said.setdefault(str(cluster.run_dir), set()))
        dashboard = self._show_dashboard(cluster) if request.dashboard else None
        # The magic line goes along as a comment (IPython drops leading blank lines), so worker
        # tracebacks carry the line numbers the user sees in the notebook cell.
        try:
            result = cluster.run(f"# %%tfcluster {line}\n{code}", on=request.on,
                                 timeout=request.timeout, on_event=printer,
                                 stall_timeout=request.stall_timeout)
        except (SpecError, ClusterNotRunningError) as exc:
            raise _usage(exc) from None
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

    @staticmethod
    def _show_dashboard(cluster: Any) -> Any:
        from IPython.display import display

        dashboard = cluster.dashboard()
        display(dashboard)
        return dashboard

    @magic_arguments()
    @argument("--table", action="store_true", help="return a pandas DataFrame, one row per task")
    @argument("--lab", action="store_true",
              help="open the cluster's JupyterLab pane (tfdist-nb lab extension) instead")
    @line_magic
    def tfdist_status(self, line: str) -> Any:
        """The live dashboard of every task; ``--table``: a DataFrame; ``--lab``: the cluster's
        dockable JupyterLab pane, fed by the Jupyter server (docs/reference.md).

        The dashboard has a panel per task (state, steps, resources, a filterable log tail) and
        charts of step time, CPU, RSS and GPU per task; it refreshes a few times a second.
        """
        args = _parse(self.tfdist_status, line, "example: %tfdist_status --table")
        cluster = _require()
        if args.table:
            return cluster.status()
        if args.lab:  # rendered by the lab extension, which opens (once) the cluster's pane
            import secrets
            import time

            from IPython.display import display
            display({"application/vnd.tfdist.lab+json": {
                "cluster": cluster.id, "nonce": secrets.token_hex(8), "time": time.time()},
                "text/plain": f"tfdist_nb: cluster {cluster.id}: its pane opens in JupyterLab "
                              "with the tfdist-nb extension (tfdist sidebar)"}, raw=True)
            return None
        self._show_dashboard(cluster)
        return None

    @magic_arguments()
    @_on_option
    @argument("--grep", metavar="RE", help="only lines matching this regular expression")
    @argument("--tail", type=POSITIVE_N, metavar="N", help="only the last N lines")
    @argument("--level", metavar="LEVELS",
              help="only lines of these levels, comma separated: DEBUG, INFO, WARNING, ERROR, "
                   "CRITICAL, FATAL (e.g. --level INFO: TensorFlow's INFO records)")
    @argument("--save", metavar="PATH", help="also write the lines as JSON Lines to PATH")
    @line_magic
    def tfdist_logs(self, line: str) -> Any:
        """The merged log of every task (from the run directory), as a DataFrame.

        Every line the tasks wrote is there, also TensorFlow's INFO records that the cell did not
        show. Examples::

            %tfdist_logs --on 1 --grep loss --tail 50
            %tfdist_logs --level WARNING,ERROR
        """
        args = _parse(self.tfdist_logs, line, "example: %tfdist_logs --on 1 --grep loss --tail 50")
        cluster = _require()
        try:
            df = cluster.logs(on=args.on, grep=args.grep, tail=args.tail, level=args.level)
        except (SpecError, ValueError) as exc:
            raise _usage(exc, "example: %tfdist_logs --on 1 --grep 'loss|step'") from None
        if args.save:
            _save_private(args.save, df.to_json(orient="records", lines=True,
                                                date_format="iso"))
        return df

    @magic_arguments()
    @_on_option
    @line_magic
    def tfdist_stacks(self, line: str) -> None:
        """Python stacks of every thread of each task, and where each main thread stands.

        They are taken in each task's inspection subshell, so they come back while the main
        thread is blocked inside a TensorFlow op (a stuck collective, say).
        """
        from tfdist_nb.display.printer import label

        args = _parse(self.tfdist_stacks, line, "example: %tfdist_stacks --on 1")
        try:
            found = _require().stacks(on=args.on)
        except (SpecError, ClusterNotRunningError) as exc:
            raise _usage(exc, "example: %tfdist_stacks --on worker:0") from None
        cluster = _require()
        stands = cluster.collectives_now(on=args.on)
        for task, text in found.items():
            print(f"{label(task)} collective: {stands.get(task, '?')}\n{text}\n")

    @magic_arguments()
    @_on_option
    @argument("--last", type=NOT_NEGATIVE_N, default=20, metavar="N",
              help="the last N collectives of each task (default 20; 0: all kept)")
    @line_magic
    def tfdist_collectives(self, line: str) -> Any:
        """Every task's collective ledger side by side, as a DataFrame: each collective it
        issued (eager or inside tf.function) with its kind, dtype, shape, the line that made it,
        its state and times. Examples::

            %tfdist_collectives
            %tfdist_collectives --on 1 --last 50
        """
        args = _parse(self.tfdist_collectives, line, "example: %tfdist_collectives --last 50")
        if args.last < 0:
            raise _usage(ValueError("--last must be 0 (all) or a positive number"),
                         "example: %tfdist_collectives --on 1 --last 50")
        try:
            return _require().collectives(on=args.on, last=args.last or None)
        except (SpecError, ClusterNotRunningError) as exc:
            raise _usage(exc, "example: %tfdist_collectives --on worker:0 --last 10") from None

    @magic_arguments()
    @_on_option
    @line_magic
    def tfdist_interrupt(self, line: str) -> None:
        """Interrupt the targeted tasks: SIGINT, then, for a task still stuck inside a TensorFlow
        op (a collective) two seconds later, abort its collectives (restart before the next)."""
        args = _parse(self.tfdist_interrupt, line, "example: %tfdist_interrupt --on 1")
        try:
            aborted = _require().interrupt(on=args.on)
        except (SpecError, ClusterNotRunningError) as exc:
            raise _usage(exc, "example: --on 1  or  --on worker:0,worker:1") from None
        if aborted:
            print(f"tfdist_nb: {', '.join(aborted)} did not answer SIGINT inside a TensorFlow "
                  "op; their collectives were aborted: %tfdist_restart before training again")

    @magic_arguments()
    @_on_option
    @line_magic
    def tfdist_restart(self, line: str) -> None:
        """Restart the targeted tasks as fresh kernels with the same TF_CONFIG."""
        args = _parse(self.tfdist_restart, line, "example: %tfdist_restart --on 1")
        cluster = _require()
        _targets_call(cluster.restart, args.on)
        warm = cluster.warm_outcome  # spare kernels: how they were used
        how = (f"({warm})" if warm is not None and warm.fresh_ports else
               "with the same TF_CONFIG" + (f" ({warm})" if warm is not None else ""))
        print(f"tfdist_nb: restarted {args.on or 'all tasks'} {how}")
        spec = cluster.spec
        if args.on not in (None, "all") and spec.workers + spec.chief > 1 and not spec.ps:
            print("tfdist_nb: with MultiWorkerMirroredStrategy every task has to restart "
                  "together (the others still belong to the old collective group): run "
                  "%tfdist_restart without --on to restart them all")

    @magic_arguments()
    @line_magic
    def tfdist_stop(self, line: str) -> None:
        """Stop every task of the active cluster (fast: short grace, then SIGKILL)."""
        from tfdist_nb.cluster.facade import current

        _parse(self.tfdist_stop, line, "example: %tfdist_stop")
        cluster = current()
        if cluster is None:
            print("tfdist_nb: no cluster is running")
            return
        reports = cluster.stop()
        print(f"tfdist_nb: stopped {len(reports)} task(s) of {cluster.spec}")

    @magic_arguments()
    @argument("level", help="DEBUG | INFO | WARNING | ERROR | CRITICAL (Python and tf logger)")
    @argument("--cpp", type=int, metavar="N",
              help="TF_CPP_MIN_LOG_LEVEL for TensorFlow's C++ logs (0-3); restarts the tasks")
    @argument("--vmodule", metavar="SPEC",
              help="TF_CPP_VMODULE, e.g. 'collective_ops=2'; restarts the tasks")
    @line_magic
    def tfdist_loglevel(self, line: str) -> None:
        """Set the log level on every task.

        The Python level (root and ``tensorflow`` loggers) changes at once. TensorFlow reads its
        C++ settings only at start-up, so ``--cpp`` / ``--vmodule`` restart every task (which
        loses their state) and say so.

        Examples::

            %tfdist_loglevel DEBUG
            %tfdist_loglevel INFO --cpp 0 --vmodule collective_ops=2
        """
        example = "example: %tfdist_loglevel INFO --cpp 0"
        args = _parse(self.tfdist_loglevel, line, example)
        try:
            print(f"tfdist_nb: {_require().set_log_level(args.level, args.cpp, args.vmodule)}")
        except SpecError as exc:
            raise _usage(exc, example) from None

    @magic_arguments()
    @argument("kind",
              help="straggler | hang | raise | uneven | crash | nan | oom | bad-shard | clear")
    @_on_option
    @argument("--at-step", type=NOT_NEGATIVE_N, metavar="K",
              help="step at which hang/raise/crash/nan happen; uneven: steps before data ends")
    @argument("--seconds", type=POSITIVE_S, metavar="S", help="straggler delay per step (0.3)")
    @argument("--where", choices=["input", "step"], help="straggler: delay the input or step")
    @argument("--limit-mb", type=POSITIVE_S, metavar="MB",
              help="oom: memory this task may grow by before its limit kills it (500)")
    @line_magic
    def tfdist_inject(self, line: str) -> None:
        """Inject a classic distributed-training failure into one task, for teaching.

        Faults act through the task's own training code: ``with tw.step():`` /
        ``tw.timed(dataset)`` in custom loops and the step timer tfdist_nb adds to ``model.fit``.

        - ``straggler``: delay that task's input (``--where input``, default) or step by
          ``--seconds`` every step;
        - ``hang``: from ``--at-step K`` on, that task never reaches the next collective;
        - ``raise``: that task raises an error at step K, while the others go on to the next
          collective (they are released at once, naming it);
        - ``uneven``: that task's data ends after K steps (``tw.timed`` stops, ``model.fit``
          stops), as uneven per-task data would: the others wait in a step it never runs;
        - ``crash``: SIGKILL that task at step K;
        - ``nan``: NaN in that task's model weights at step K (Keras ``fit``), so the loss and
          the all-reduced gradients turn NaN;
        - ``oom``: grow that task's memory until a limit set on it alone (``--limit-mb`` above
          its RSS now) kills it with SIGKILL, as a cgroup limit would (never the whole machine);
        - ``bad-shard``: turn auto-sharding off, so every task reads the same data;
        - ``clear``: disarm every fault on the targeted tasks (all by default).

        Examples::

            %tfdist_inject crash --on 1 --at-step 20
            %tfdist_inject straggler --on worker:0 --seconds 0.5
            %tfdist_inject clear
        """
        example = "example: %tfdist_inject crash --on 1 --at-step 20"
        args = _parse(self.tfdist_inject, line, example)
        try:
            said = _require().inject(args.kind, on=args.on, at_step=args.at_step,
                                     seconds=args.seconds, where=args.where,
                                     limit_mb=args.limit_mb)
        except (SpecError, ClusterNotRunningError) as exc:
            raise _usage(exc, example) from None
        for task, text in said.items():
            print(f"tfdist_nb: {task}: {text}")

    @magic_arguments()
    @argument("--all", action="store_true",
              help="every property, not only the ones that differ between tasks")
    @line_magic
    def tfdist_env(self, line: str) -> Any:
        """Each task's environment, read now, side by side; ``mismatch`` marks differences.

        Python, TensorFlow and the CUDA/cuDNN it was built for, Keras / tf_keras, numpy, NVIDIA
        driver and GPUs, OS, host, every TF_*, CUDA_*, NCCL_*, XLA_* variable (also one a cell
        set), and installed packages whose versions differ. Without ``--all`` only the rows
        that differ are shown (and a line says when none do).
        """
        args = _parse(self.tfdist_env, line, "example: %tfdist_env --all")
        df = _require().env()
        if args.all:
            return df
        differing = df[df["mismatch"]]
        if differing.empty:
            print(f"tfdist_nb: the {len(df.columns) - 1} task(s) run the same environment "
                  "(%tfdist_env --all lists it)")
        return differing

    @magic_arguments()
    @argument("kind", help="tfconfig | network | env | all | sharding | variables")
    @argument("expr", nargs="*",
              help="tfconfig: a TF_CONFIG to check instead of the tasks' own (JSON text, a "
                   "file path, or a variable of this notebook holding either or a dict); "
                   "sharding / variables: an expression evaluated in every task")
    @argument("--reference", metavar="EXPR", default=None,
              help="sharding: the undistributed dataset, evaluated in the first task, that "
                   "missing elements are counted against")
    @argument("--max-elements", type=POSITIVE_N, default=None, metavar="N",
              help="sharding: stop after N examples per task (default 10000)")
    @argument("--max-seconds", type=POSITIVE_S, default=None, metavar="S",
              help="sharding: stop reading after S seconds (default 30)")
    @argument("--atol", type=NOT_NEGATIVE, default=None,
              help="variables: absolute tolerance (1e-6)")
    @argument("--rtol", type=NOT_NEGATIVE, default=None,
              help="variables: relative tolerance (1e-5)")
    @_on_option
    @line_magic
    def tfdist_check(self, line: str) -> Any:
        """Preflight and consistency checks; each returns a CheckReport (.ok, .summary, .table).

        - ``tfconfig``: every task's TF_CONFIG now: structure, task types, indices, duplicate
          addresses, more than one chief, ps without workers, its own port in use on its host,
          host names that do not resolve there, tasks that disagree about the cluster. Works
          without a cluster for a TF_CONFIG you give (``%tfdist_check tfconfig cfg.json``).
        - ``network``: every task connects to every other task's TF address (refused, timed
          out, DNS), a latency matrix, and the all-reduce bandwidth of your strategy (1, 16,
          64 MB) when a cell made one.
        - ``env``: differences between the tasks' environments.
        - ``all``: tfconfig, network and env.
        - ``sharding EXPR``: EXPR (a ``tf.data.Dataset`` or a distributed dataset) is read on
          every task at once, bounded by ``--max-elements`` and ``--max-seconds`` (the report
          says when a bound cut it short), every example fingerprinted: ``.overlap`` (read by
          more than one task), ``.missing`` (read by none, against the undistributed dataset:
          the one given to ``experimental_distribute_dataset``, the function of
          ``distribute_datasets_from_function`` called with one input pipeline, or
          ``--reference EXPR``), ``.per_task``, ``.imbalance``, and the AutoShardPolicy in
          effect and why.
        - ``variables EXPR``: a Keras model, a ``tf.Module``, a variable, or a list / dict of
          them: per-variable checksums on every task, exact and within ``--atol`` /
          ``--rtol``; ``.diverged`` names the variables that differ with their max abs
          difference, and the likely cause.

        EXPR is evaluated in each task, not here; quote it when it holds quotes or spaces.

        Examples::

            %tfdist_check all
            %tfdist_check network
            %tfdist_check tfconfig '{"cluster": {"worker": ["a:1", "a:1"]}, "task": {...}}'
            %tfdist_check sharding dist_dataset
            %tfdist_check sharding 'dataset.batch(8)' --reference 'tf.data.Dataset.range(64)'
            %tfdist_check variables model
        """
        from tfdist_nb.cluster.checks import EXPR_KINDS, KINDS, check_tf_config

        example = ("example: %tfdist_check network   (kinds: tfconfig, network, env, all, "
                   "sharding EXPR, variables EXPR)")
        args = _parse(self.tfdist_check, line, example)
        if args.kind not in KINDS:
            raise _usage(f"unknown check {args.kind!r}; one of {', '.join(KINDS)}", example)
        expr = " ".join(args.expr) or None
        options = _check_options(args)
        if args.kind in EXPR_KINDS:
            if expr is None:
                raise _usage(f"the {args.kind} check needs an expression evaluated in every "
                             f"task", f"example: %tfdist_check {args.kind} "
                             f"{'dist_dataset' if args.kind == 'sharding' else 'model'}")
        elif expr is not None and args.kind != "tfconfig":
            raise _usage(f"the {args.kind} check takes no argument", example)
        if (expr is not None and args.kind == "tfconfig" and expr.isidentifier()
                and expr in self.shell.user_ns):
            expr = self.shell.user_ns[expr]
        from tfdist_nb.cluster.facade import current

        cluster = current()
        if cluster is None:
            if args.kind == "tfconfig" and expr is not None:
                return check_tf_config(expr)
            raise UsageError("no cluster is running; start one with\n  %%tfcluster 2 workers\n"
                             "(a TF_CONFIG of your own is checked without one: "
                             "%tfdist_check tfconfig cfg.json)")
        try:
            return cluster.check(args.kind, expr, on=args.on, **options)
        except (SpecError, ClusterNotRunningError) as exc:
            raise _usage(exc, example) from None


    @magic_arguments()
    @argument("directory", help="where train.py and launch.sh go (created if missing)")
    @argument("--force", action="store_true",
              help="replace a train.py / launch.sh there that %%tfdist_export did not write")
    @line_magic
    def tfdist_export(self, line: str) -> None:
        """Write a standalone reproducer of what the cluster ran: ``DIR/train.py`` (the cells,
        in order, without notebook machinery) and ``DIR/launch.sh`` (the same tasks on this
        machine, same TF_CONFIG layout with fresh ports, same ``--env``).
        ``bash DIR/launch.sh`` runs it outside Jupyter and exits non-zero if a task fails.

        Example::

            %tfdist_export repro/
        """
        example = "example: %tfdist_export repro/"
        args = _parse(self.tfdist_export, line, example)
        try:
            out = _require_any().export(args.directory, force=args.force)
        except SpecError as exc:
            raise _usage(exc, example) from None
        print(f"tfdist_nb: wrote {out / 'train.py'} and {out / 'launch.sh'}; run it with: "
              f"bash {out / 'launch.sh'}")

    @magic_arguments()
    @argument("state", choices=["on", "off"], help="on | off")
    @argument("--dump", metavar="DIR",
              help="also write TensorBoard Debugger V2 dumps, one root per task (DIR/worker-0, "
                   "DIR/worker-1, ...): a root shared by several tasks cannot be read")
    @line_magic
    def tfdist_numerics(self, line: str) -> None:
        """NaN/Inf checking on every task (``tf.debugging.enable_check_numerics``).

        The first op whose output holds NaN or Inf raises on its task; when a cell fails that
        way, it names the task that produced NaN/Inf first (by time across tasks) and the op,
        with where the op was created. It slows every op down: turn it off when done.

        Examples::

            %tfdist_numerics on
            %tfdist_numerics on --dump /tmp/dbg
            %tfdist_numerics off
        """
        example = "example: %tfdist_numerics on   (or: off, on --dump DIR)"
        args = _parse(self.tfdist_numerics, line, example)
        try:
            print(f"tfdist_nb: {_require().numerics(args.state == 'on', args.dump)}")
        except (SpecError, ClusterNotRunningError) as exc:
            raise _usage(exc, example) from None

    @magic_arguments()
    @argument("--duration-ms", type=POSITIVE_N, default=2000, metavar="N",
              help="how long to trace (default 2000)")
    @argument("--logdir", metavar="DIR", help="where the trace goes (default: the run "
                                              "directory's profile/)")
    @argument("--now", action="store_true",
              help="trace what the tasks do now and wait for it, instead of arming the "
                   "capture for the next cell")
    @argument("--delay-ms", type=NOT_NEGATIVE_N, default=500, metavar="N",
              help="with an armed capture: start this long after the next cell is sent")
    @line_magic
    def tfdist_profile(self, line: str) -> None:
        """A TensorFlow profiler trace of every task at once, in one logdir for TensorBoard.

        By default the capture is armed and starts with the next ``%%tfcluster`` cell (all tasks
        together); when that cell ends, the cell says where the trace is, how to open it
        (``%tensorboard --logdir ...``) and, per task, its busiest ops. ``--now`` traces what
        the tasks are doing at once.

        Examples::

            %tfdist_profile --duration-ms 3000
            %tfdist_profile --now --logdir /tmp/prof
        """
        example = "example: %tfdist_profile --duration-ms 3000"
        args = _parse(self.tfdist_profile, line, example)
        try:
            said = _require().profile(args.duration_ms, args.logdir, now=args.now,
                                      delay_ms=args.delay_ms)
        except (SpecError, ClusterNotRunningError) as exc:
            raise _usage(exc, example) from None
        print(f"tfdist_nb: {said}")


def _require_any() -> Any:
    """The active cluster, or the last one that ran (export works after a stop too)."""
    from tfdist_nb.cluster.registry import last_cluster

    cluster = _maybe_current() or last_cluster()
    if cluster is None:
        raise UsageError("no cluster has run here yet; start one with\n  %%tfcluster 2 workers")
    return cluster


def _maybe_current() -> Any:
    from tfdist_nb.cluster.facade import current

    return current()


def _require() -> Any:
    from tfdist_nb.cluster.facade import current

    cluster = current()
    if cluster is None:
        raise UsageError("no cluster is running; start one with\n  %%tfcluster 2 workers")
    return cluster


def _targets_call(fn: Any, on: str | None) -> None:
    try:
        fn(on=on)
    except (SpecError, ClusterNotRunningError) as exc:
        raise _usage(exc, "example: --on 1  or  --on worker:0,worker:1") from None
