"""``%tfdist_inject``, the teaching magic (docs/reference.md, Magics; docs/workshop.md)."""

from __future__ import annotations

import argparse

from IPython.core.magic import Magics, magics_class
from IPython.core.magic_arguments import argument

from tfdist_nb.magics.common import (
    NOT_NEGATIVE_N,
    POSITIVE_S,
    magic,
    on_option,
    require,
)


@magics_class
class TeachMagics(Magics):
    """Faults to plant, for teaching."""

    @magic("example: %tfdist_inject crash --on 1 --at-step 20")
    @argument("kind",
              help="straggler | hang | raise | uneven | crash | nan | oom | bad-shard | clear")
    @on_option
    @argument("--at-step", type=NOT_NEGATIVE_N, metavar="K",
              help="step at which hang/raise/crash/nan/oom happen (oom without it: at once); "
                   "uneven: steps before data ends")
    @argument("--seconds", type=POSITIVE_S, metavar="S", help="straggler delay per step (0.3)")
    @argument("--where", choices=["input", "step"], help="straggler: delay the input or step")
    @argument("--limit-mb", type=POSITIVE_S, metavar="MB",
              help="oom: memory this task may grow by before its limit kills it (500)")
    def tfdist_inject(self, args: argparse.Namespace) -> None:
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
        - ``oom``: grow that task's memory until a limit on it alone (``--limit-mb`` above its
          RSS now) SIGKILLs it, as a cgroup limit would; with ``--at-step K`` from step K, so it
          dies in its training cell, never while idle;
        - ``bad-shard``: turn auto-sharding off, so every task reads the same data;
        - ``clear``: disarm every fault on the targeted tasks (all by default).

        Examples::

            %tfdist_inject crash --on 1 --at-step 20
            %tfdist_inject straggler --on worker:0 --seconds 0.5
            %tfdist_inject clear
        """
        said = require().inject(args.kind, on=args.on, at_step=args.at_step,
                                 seconds=args.seconds, where=args.where,
                                 limit_mb=args.limit_mb)
        for task, text in said.items():
            print(f"tfdist_nb: {task}: {text}")
