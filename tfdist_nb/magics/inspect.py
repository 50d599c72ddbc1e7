"""The magics that look at the cluster (docs/reference.md, Magics): status, logs, stacks,
collectives, env, and debug (pdb on one task's last exception).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from IPython.core.magic import Magics, magics_class
from IPython.core.magic_arguments import argument

from tfdist_nb.magics.common import (
    NOT_NEGATIVE_N,
    POSITIVE_N,
    answers_from,
    magic,
    notebook_asks,
    on_option,
    require,
    usage,
)
from tfdist_nb.store.rundir import replace_private

if TYPE_CHECKING:
    import pandas as pd


@magics_class
class InspectMagics(Magics):
    """What the tasks are doing: status, logs, stacks, collectives, environment."""

    @magic("example: %tfdist_status --table")
    @argument("--table", action="store_true", help="return a pandas DataFrame, one row per task")
    @argument("--lab", action="store_true",
              help="open the cluster's JupyterLab pane (tfdist-nb lab extension) instead")
    def tfdist_status(self, args: argparse.Namespace) -> pd.DataFrame | None:
        """The live dashboard of every task; ``--table``: a DataFrame; ``--lab``: the cluster's
        dockable JupyterLab pane, fed by the Jupyter server (docs/reference.md).

        The dashboard has a panel per task (state, steps, resources, a filterable log tail) and
        charts of step time, CPU, RSS and GPU per task; it refreshes a few times a second.
        """
        cluster = require()
        if args.table:
            return cluster.status()
        from IPython.display import display

        if args.lab:  # rendered by the lab extension, which opens (once) the cluster's pane
            import secrets
            import time

            display({"application/vnd.tfdist.lab+json": {
                "cluster": cluster.id, "nonce": secrets.token_hex(8), "time": time.time()},
                "text/plain": f"tfdist_nb: cluster {cluster.id}: its pane opens in JupyterLab "
                              "with the tfdist-nb extension (tfdist sidebar)"}, raw=True)
            return None
        display(cluster.dashboard())
        return None

    @magic("example: %tfdist_logs --on 1 --grep 'loss|step' --tail 50", ValueError)
    @on_option
    @argument("--grep", metavar="RE", help="only lines matching this regular expression")
    @argument("--tail", type=POSITIVE_N, metavar="N", help="only the last N lines")
    @argument("--level", metavar="LEVELS",
              help="only lines of these levels, comma separated: DEBUG, INFO, WARNING, ERROR, "
                   "CRITICAL, FATAL (e.g. --level INFO: TensorFlow's INFO records)")
    @argument("--save", metavar="PATH", help="also write the lines as JSON Lines to PATH")
    def tfdist_logs(self, args: argparse.Namespace) -> pd.DataFrame:
        """The merged log of every task (from the run directory), as a DataFrame.

        Every line the tasks wrote is there, also TensorFlow's INFO records that the cell did not
        show. Examples::

            %tfdist_logs --on 1 --grep loss --tail 50
            %tfdist_logs --level WARNING,ERROR
        """
        cluster = require()
        df = cluster.logs(on=args.on, grep=args.grep, tail=args.tail, level=args.level)
        if args.save:
            try:  # owner-only (logs carry what the cells printed), never through a symlink
                replace_private(Path(args.save), df.to_json(orient="records", lines=True,
                                                            date_format="iso"))
            except OSError as exc:
                raise usage(f"--save: cannot write {args.save}: {exc.strerror or exc}",
                            "example: %tfdist_logs --save ./tfdist_logs.jsonl") from None
        return df

    @magic("example: %tfdist_stacks --on 1")
    @on_option
    def tfdist_stacks(self, args: argparse.Namespace) -> None:
        """Python stacks of every thread of each task, and where each main thread stands.

        They are taken in each task's inspection subshell, so they come back while the main
        thread is blocked inside a TensorFlow op (a stuck collective, say).
        """
        from tfdist_nb.display.printer import label

        cluster = require()
        found = cluster.stacks(on=args.on)
        stands = cluster.collectives_now(on=args.on)
        for task, text in found.items():
            print(f"{label(task)} collective: {stands.get(task, '?')}\n{text}\n")

    @magic("example: %tfdist_collectives --last 50")
    @on_option
    @argument("--last", type=NOT_NEGATIVE_N, default=20, metavar="N",
              help="the last N collectives of each task (default 20; 0: all kept)")
    def tfdist_collectives(self, args: argparse.Namespace) -> pd.DataFrame:
        """Every task's collective ledger side by side, as a DataFrame: each collective it
        issued (eager or inside tf.function) with its kind, dtype, shape, the line that made it,
        its state and times. Examples::

            %tfdist_collectives
            %tfdist_collectives --on 1 --last 50
        """
        return require().collectives(on=args.on, last=args.last or None)

    @magic("example: %tfdist_debug --on 1")
    @argument("--on", metavar="TASK", default=None,
              help="the task to debug: 1 | worker:1 (default: the first task that raised in "
                   "the last failing cell)")
    @argument("--commands", metavar="'CMD; CMD'", default=None,
              help="answer the debugger's prompts with these, one per prompt, then quit: no "
                   "person needed (a headless run, a workshop notebook), e.g. 'p x; up; p step'")
    def tfdist_debug(self, args: argparse.Namespace) -> None:
        """A post-mortem debugger (pdb) on one task's last exception, run in that task and
        driven from this cell: its prompts (``[worker:1] ipdb>``) come here, one line at a time.

        ``p NAME``, ``pp locals()``, ``up``, ``down``, ``l``; ``q`` quits and leaves the task
        idle, as it was. The cluster keeps running and the other tasks are not touched. Needs a
        frontend that takes input (JupyterLab, Notebook), or ``--commands``. Examples::

            %tfdist_debug            # the first task that raised in the last failing cell
            %tfdist_debug --on 1     # worker:1's last exception
            %tfdist_debug --commands "p x; up; p step"   # these answers, then quit
        """
        from tfdist_nb.display.printer import LivePrinter, failure_report
        from tfdist_nb.results import RunResult

        cluster = require()
        ask = answers_from(args.commands) if args.commands else notebook_asks()
        if ask is None:
            raise usage("this frontend takes no input for the cell (nbclient, a script), so no "
                        "debugger can be driven from it; in JupyterLab or Notebook the prompts "
                        "come into the cell (--commands 'p x; q' answers them, or "
                        "cluster.debug(on_input=...) from code)", "example: %tfdist_debug --on 1")
        printer = LivePrinter(run_dir=cluster.run_dir, verbose=True)
        try:
            result = cluster.debug(on=args.on, on_input=ask, on_event=printer)
        finally:
            printer.flush()
        if not result.ok:
            sys.stderr.write(failure_report(RunResult(cell=0, tasks={result.task: result})))
            sys.stderr.flush()

    @magic("example: %tfdist_env --all")
    @argument("--all", action="store_true",
              help="every property, not only the ones that differ between tasks")
    def tfdist_env(self, args: argparse.Namespace) -> pd.DataFrame:
        """Each task's environment, read now, side by side; ``mismatch`` marks differences.

        Python, TensorFlow and the CUDA/cuDNN it was built for, Keras / tf_keras, numpy, NVIDIA
        driver and GPUs, OS, host, every TF_*, CUDA_*, NCCL_*, XLA_* variable (also one a cell
        set), and installed packages whose versions differ. Without ``--all`` only the rows
        that differ are shown (and a line says when none do).
        """
        df = require().env()
        if args.all:
            return df
        differing = df[df["mismatch"]]
        if differing.empty:
            print(f"tfdist_nb: the {len(df.columns) - 1} task(s) run the same environment "
                  "(%tfdist_env --all lists it)")
        return differing
