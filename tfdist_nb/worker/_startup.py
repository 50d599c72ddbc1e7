"""Making a MultiWorkerMirroredStrategy waits for every task: that wait is a ledger row too.

The wait (``CollectiveAllReduceExtended._initialize_multi_worker``) runs in C++ holding the
GIL, so its ``startup`` row is sent before the call: no thread could send it during
(docs/reference.md, "Collectives and hangs").
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from tfdist_nb.ledger_runs import LedgerRow
from tfdist_nb.worker import agreement, cellmap, state
from tfdist_nb.worker.hooks import instrument, replace_method
from tfdist_nb.worker.ledger import LEDGER, Op

if TYPE_CHECKING:  # never at run time: the worker imports TensorFlow only when the cell does
    import tensorflow as tf

STRATEGY_MODULE = "tensorflow.python.distribute.collective_all_reduce_strategy"
STRATEGY = "MultiWorkerMirroredStrategy"
PART = "startup"
STOPS = ("naming a task that never made its MultiWorkerMirroredStrategy while the others "
         "waited for it (they wait until the cell's timeout instead)")

_made = [0]  # strategies this process started making (the same count on every task)


def patch_strategy(module: ModuleType) -> bool:
    """Wrap the multi-worker start-up; False if already done. Raises AttributeError when
    TensorFlow renamed it."""
    def wrap(method: Callable[..., object]) -> Callable[..., object]:
        def initialize_multi_worker(self: tf.distribute.StrategyExtended, *args: object,
                                    **kwargs: object) -> object:
            rows = _enter()
            made = (method(self, *args, **kwargs) if rows is None
                    else LEDGER.run(rows, method, self, *args, **kwargs))
            _observed(self)
            return made
        return initialize_multi_worker

    return replace_method(module, "CollectiveAllReduceExtended", "_initialize_multi_worker",
                          wrap)


def _enter() -> list[LedgerRow] | None:
    """A ``startup`` row naming the tasks this one waits for; None outside a multi-task
    TF_CONFIG that names this task (nothing to wait for)."""
    everyone, mine = agreement.members(), state.task_name()
    if mine not in everyone or len(everyone) < 2:
        return None
    nth = _made[0]
    _made[0] += 1
    site = cellmap.main_thread_site()
    if nth:
        _second_strategy(nth, site)
        LEDGER.new_strategy()
    op = Op("startup", len(everyone), None, "", None, None, site)
    rows = LEDGER.enter([op], STRATEGY, members=[t for t in everyone if t != mine],
                        check=f"tfdist/startup/{nth}")
    if state.telemetry is not None:  # the wait holds the GIL: nothing is sent during it
        state.telemetry.deliver_ledger()
    return rows


def _second_strategy(nth: int, site: str) -> None:
    """A strategy made in a process that made one already: TensorFlow configures collectives
    once per process, so this one's collectives can be aborted (``Delete called on non-empty
    BufRendezvous``) or meet the first one's state; said with the fix."""
    from tfdist_nb.events import Finding

    where = f" ({site})" if site else ""
    state.note(f"MultiWorkerMirroredStrategy number {nth + 1} in the same task process{where}: "
               "TensorFlow configures collective ops once per process, so its collectives may "
               "be aborted ('Delete called on non-empty BufRendezvous') or meet the earlier "
               "strategy's state. Fix: restart the tasks (%%tfcluster --restart, or "
               "cluster.restart()) and make one strategy per process", "WARNING",
               Finding.SECOND_STRATEGY)


def _observed(extended: tf.distribute.StrategyExtended) -> None:
    """What the strategy just made runs its collectives with, and on: a typed note
    (``Finding.STRATEGY``) whose facts the controller's advice reads (with AUTO, MWMS runs RING
    on GPUs too: docs/reference.md, "GPU advice"). Silent where TensorFlow renamed them."""
    from tfdist_nb.events import Finding

    options = getattr(extended, "_communication_options", None)
    implementation = getattr(getattr(options, "implementation", None), "name", None)
    device = getattr(extended, "_local_device_type", None)
    devices = getattr(extended, "_num_devices_per_worker", None)
    if not isinstance(implementation, str) or not isinstance(device, str):
        return
    state.note(f"MultiWorkerMirroredStrategy: collectives {implementation} on this task's "
               f"{devices} {device} device(s)", "INFO", Finding.STRATEGY,
               {"implementation": implementation, "device": device, "devices": devices})


def install() -> None:
    instrument(PART, STOPS, {STRATEGY_MODULE: patch_strategy})
