"""The magics that diagnose (docs/reference.md, Magics): checks, numerics, profile, isolate,
export and report.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from IPython.core.error import UsageError
from IPython.core.magic import Magics, magics_class
from IPython.core.magic_arguments import argument

from tfdist_nb.errors import SpecError
from tfdist_nb.magics.common import (
    NO_CLUSTER,
    NOT_NEGATIVE,
    NOT_NEGATIVE_N,
    POSITIVE_N,
    POSITIVE_S,
    F,
    current,
    magic,
    on_option,
    require,
    require_any,
    usage,
)

if TYPE_CHECKING:
    from tfdist_nb.cluster.checks import CheckOptions
    from tfdist_nb.diagnostics.isolate_report import IsolateReport
    from tfdist_nb.diagnostics.report import CheckReport

CHECK_EXAMPLE = ("example: %tfdist_check network   (kinds: tfconfig, network, env, all, "
                 "sharding EXPR, variables EXPR, gpu)")


def writes_files(what: str, replaced: str) -> Callable[[F], F]:
    """The arguments of a command that writes ``what`` into a directory (``DIR [--force]``)."""
    def wrap(fn: F) -> F:
        fn = argument("--force", action="store_true", help=f"replace {replaced}")(fn)
        return argument("directory", help=f"where {what} go (created if missing)")(fn)
    return wrap


@magics_class
class DiagnoseMagics(Magics):
    """Checks, NaN/Inf hunting, profiles, and the reproducer."""

    @magic(CHECK_EXAMPLE)
    @argument("kind", help="tfconfig | network | env | all | sharding | variables | gpu")
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
    @on_option
    def tfdist_check(self, args: argparse.Namespace) -> CheckReport:
        """Preflight and consistency checks; each returns a CheckReport (.ok, .summary, .table).

        - ``tfconfig``: every task's TF_CONFIG now: structure, task types, indices, duplicate
          addresses, more than one chief, ps without workers, its own port in use, host names
          that do not resolve, tasks that disagree. Without a cluster, a TF_CONFIG you give
          (``%tfdist_check tfconfig cfg.json``).
        - ``network``: every task to every other task's TF address (refused, timed out, DNS), a
          latency matrix, and your strategy's all-reduce bandwidth (1, 16, 64 MB) if it exists.
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
        - ``gpu``: per task, the GPUs it was given (``CUDA_VISIBLE_DEVICES``) against those NVML
          finds (by UUID) and TensorFlow sees, memory policy, driver against TensorFlow's CUDA /
          cuDNN, compute capability, PCIe link against its maximum, ECC errors, pages waiting to
          be retired, row remapping; two tasks given one GPU; with GPUs everywhere and a
          strategy, its all-reduce timed with RING and NCCL. A task without a GPU says why.

        EXPR is evaluated in each task, not here; quote it when it holds quotes or spaces.

        Examples::

            %tfdist_check all
            %tfdist_check network
            %tfdist_check tfconfig '{"cluster": {"worker": ["a:1", "a:1"]}, "task": {...}}'
            %tfdist_check sharding dist_dataset
            %tfdist_check sharding 'dataset.batch(8)' --reference 'tf.data.Dataset.range(64)'
            %tfdist_check variables model
            %tfdist_check gpu
        """
        from tfdist_nb.cluster.checks import EXPR_KINDS, KINDS, check_tf_config

        if args.kind not in KINDS:
            raise usage(f"unknown check {args.kind!r}; one of {', '.join(KINDS)}", CHECK_EXAMPLE)
        expr = " ".join(args.expr) or None
        options = _check_options(args)
        if args.kind in EXPR_KINDS:
            if expr is None:
                raise usage(f"the {args.kind} check needs an expression evaluated in every "
                            f"task", f"example: %tfdist_check {args.kind} "
                            f"{'dist_dataset' if args.kind == 'sharding' else 'model'}")
        elif expr is not None and args.kind != "tfconfig":
            raise usage(f"the {args.kind} check takes no argument", CHECK_EXAMPLE)
        names: dict[str, Any] = self.shell.user_ns if self.shell is not None else {}
        if (expr is not None and args.kind == "tfconfig" and expr.isidentifier()
                and expr in names):
            expr = names[expr]
        cluster = current()
        if cluster is None:
            if args.kind == "tfconfig" and expr is not None:
                return check_tf_config(expr)
            raise UsageError(f"{NO_CLUSTER}\n(a TF_CONFIG of your own is checked without one: "
                             "%tfdist_check tfconfig cfg.json)")
        return cluster.check(args.kind, expr, on=args.on, **options)

    @magic("example: %tfdist_numerics on   (or: off, on --dump DIR)")
    @argument("state", choices=["on", "off"], help="on | off")
    @argument("--dump", metavar="DIR",
              help="also write TensorBoard Debugger V2 dumps, one root per task (DIR/worker-0, "
                   "DIR/worker-1, ...): a root shared by several tasks cannot be read")
    def tfdist_numerics(self, args: argparse.Namespace) -> None:
        """NaN/Inf checking on every task (``tf.debugging.enable_check_numerics``).

        The first op whose output holds NaN or Inf raises on its task; when a cell fails that
        way, it names the task that produced NaN/Inf first (by time across tasks) and the op,
        with where the op was created. It slows every op down: turn it off when done.

        Examples::

            %tfdist_numerics on
            %tfdist_numerics on --dump /tmp/dbg
            %tfdist_numerics off
        """
        print(f"tfdist_nb: {require().numerics(args.state == 'on', args.dump)}")

    @magic("example: %tfdist_profile --duration-ms 3000")
    @argument("--duration-ms", type=POSITIVE_N, default=2000, metavar="N",
              help="how long to trace (default 2000)")
    @argument("--logdir", metavar="DIR", help="where the trace goes (default: the run "
                                              "directory's profile/)")
    @argument("--now", action="store_true",
              help="trace what the tasks do now and wait for it, instead of arming the "
                   "capture for the next cell")
    @argument("--delay-ms", type=NOT_NEGATIVE_N, default=500, metavar="N",
              help="with an armed capture: start this long after the next cell is sent")
    def tfdist_profile(self, args: argparse.Namespace) -> None:
        """A TensorFlow profiler trace of every task at once, in one logdir for TensorBoard.

        By default the capture is armed and starts with the next ``%%tfcluster`` cell (all tasks
        together); when that cell ends, the cell says where the trace is, how to open it
        (``%tensorboard --logdir ...``) and, per task, its busiest ops. ``--now`` traces what
        the tasks are doing at once.

        Examples::

            %tfdist_profile --duration-ms 3000
            %tfdist_profile --now --logdir /tmp/prof
        """
        said = require().profile(args.duration_ms, args.logdir, now=args.now,
                                  delay_ms=args.delay_ms)
        print(f"tfdist_nb: {said}")

    @magic("example: %tfdist_export repro/")
    @writes_files("train.py and launch.sh",
                  "a train.py / launch.sh there that %%tfdist_export did not write")
    def tfdist_export(self, args: argparse.Namespace) -> None:
        """Write a standalone reproducer of what the cluster ran: ``DIR/train.py`` (the cells,
        in order, without notebook machinery) and ``DIR/launch.sh`` (the same tasks on this
        machine, same TF_CONFIG layout with fresh ports, same ``--env``).
        ``bash DIR/launch.sh`` runs it outside Jupyter and exits non-zero if a task fails.

        Example::

            %tfdist_export repro/
        """
        out = require_any().export(args.directory, force=args.force)
        print(f"tfdist_nb: wrote {out / 'train.py'} and {out / 'launch.sh'}; run it with: "
              f"bash {out / 'launch.sh'}")

    @magic("example: %tfdist_report issue/")
    @writes_files("report.md (and the reproducer)",
                  "a report.md, train.py or launch.sh there that tfdist_nb did not write")
    @argument("--show-env", action="store_true",
              help="show the --env values that do not look like secrets (hidden by default)")
    def tfdist_report(self, args: argparse.Namespace) -> None:
        """A report to share: ``DIR/report.md`` with the tasks and their software, every
        task's TF_CONFIG, the alerts, the last failing cell with each task's result, the last
        lines of each task and the collective ledger, secrets redacted and ``--env`` values
        hidden; beside it the reproducer ``%tfdist_export`` writes. Paste report.md into an
        issue.

        Example::

            %tfdist_report issue/
        """
        path = require_any().report(args.directory, force=args.force, show_env=args.show_env)
        print(f"tfdist_nb: wrote {path} (secrets redacted"
              f"{'' if args.show_env else ', --env values hidden'}) with train.py and launch.sh "
              "beside it: paste the report into an issue")

    @magic("example: %tfdist_isolate --budget-s 120")
    @argument("--cell", type=POSITIVE_N, default=None, metavar="N",
              help="the failing cell to isolate, by its number in this cluster's run "
                   "(default: the last that failed)")
    @argument("--budget-s", type=POSITIVE_S, default=300.0, metavar="S",
              help="seconds for all variants together (default 300); each variant ends "
                   "within it")
    @argument("--export", metavar="DIR", default=None,
              help="also write the smallest failing variant there as %%tfdist_export does")
    def tfdist_isolate(self, args: argparse.Namespace) -> IsolateReport:
        """Re-run the last failing cell (with the cells that set the tasks up) in fresh kernels
        under smaller variants and name the smallest that still fails: the same cluster again
        (flaky?), fewer workers, each task's share alone, MirroredStrategy on one task, eager
        functions, another collective implementation (GPUs), fewer steps. A line per variant;
        interrupt to stop with what is known. Returns an IsolateReport (``.verdict``,
        ``.table``, ``.smallest``, ``.export(DIR)``). Your cluster is left as it was.

        Example::

            %tfdist_isolate
            %tfdist_isolate --cell 4 --budget-s 120 --export repro/
        """
        cluster = require_any()  # a stopped cluster's failing cells can be isolated too
        report = cluster.isolate(cell=args.cell, budget_s=args.budget_s,
                                 on_progress=lambda text: print(f"tfdist_nb: {text}",
                                                                flush=True))
        print(f"tfdist_nb: {report.verdict}", flush=True)
        if args.export and report.smallest is not None:
            try:  # the walk's report is kept whatever the directory says
                out = report.export(args.export)
            except SpecError as exc:
                print(f"tfdist_nb: not exported: {exc}; report.export(DIR) writes it "
                      "elsewhere", file=sys.stderr, flush=True)
                return report
            print(f"tfdist_nb: the smallest failing variant ({report.smallest.title}) is in "
                  f"{out}: bash {out / 'launch.sh'}", flush=True)
        elif args.export:
            print("tfdist_nb: no variant failed: nothing exported", flush=True)
        return report


def _check_options(args: argparse.Namespace) -> CheckOptions:
    """``%tfdist_check``'s options that were given, by the name ``Cluster.check`` takes."""
    wanted = {"sharding": ("reference", "max_elements", "max_seconds"),
              "variables": ("atol", "rtol")}.get(args.kind, ())
    given = {k: getattr(args, k) for k in ("reference", "max_elements", "max_seconds", "atol",
                                           "rtol") if getattr(args, k) is not None}
    extra = [f"--{k.replace('_', '-')}" for k in given if k not in wanted]
    if extra:
        raise usage(f"the {args.kind} check takes no {', '.join(extra)}",
                    "example: %tfdist_check sharding dist_dataset --max-elements 1000")
    return cast("CheckOptions", given)  # of the types the magic's @argument lines give
