"""Unsharded input under a multi-worker strategy, found when the dataset is distributed.

With the auto-shard policy OFF and no ``dataset.shard()`` of its own, every task reads the same
examples and nothing fails. Both facts are in the dataset (its options and graph), so
``experimental_distribute_dataset`` is checked once per call, before any batch is read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from tfdist_nb.debuglog import swallowed
from tfdist_nb.worker.hooks import instrument, replace_method

if TYPE_CHECKING:  # never at run time: the worker imports TensorFlow only when the cell does
    import tensorflow as tf

logger = logging.getLogger(__name__)

DISTRIBUTE_LIB = "tensorflow.python.distribute.distribute_lib"
FIX = ("set options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA (or FILE), "
       "or shard it yourself with dataset.shard(num_workers, worker_index)")

#: a ``tf.data.experimental.ExternalStatePolicy`` member's name
ExternalState = Literal["WARN", "IGNORE", "FAIL"]


def dataset_graph(dataset: tf.data.Dataset, *, external_state: ExternalState,
                  ) -> tf.compat.v1.GraphDef:
    """``dataset``'s ``GraphDef``, or what its serialization raises. ``external_state``: what
    TensorFlow does about ops with outside state (a ``py_function``): ``WARN`` (its default)
    logs, ``IGNORE`` does not, ``FAIL`` raises; the graph is the same either way."""
    import tensorflow as tf

    policy = getattr(tf.data.experimental.ExternalStatePolicy, external_state)
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph(external_state_policy=policy).numpy())
    return graph


def unsharded_reason(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset) -> str | None:
    """Why this task would read every element of ``dataset``, or None if it is sharded."""
    import tensorflow as tf

    try:
        workers = strategy.extended._num_workers  # MWMS; 1 elsewhere (no sharding to check)
    except AttributeError:
        return None
    if not workers or workers < 2:
        return None
    policy = dataset.options().experimental_distribute.auto_shard_policy
    if policy != tf.data.experimental.AutoShardPolicy.OFF:
        return None
    # TensorFlow's own default policy, the one this check has always read the graph with
    graph = dataset_graph(dataset, external_state="WARN")
    if any(node.op == "ShardDataset" for node in graph.node):
        return None
    return (f"its dataset has auto_shard_policy OFF and no dataset.shard(), so it reads the "
            f"whole dataset - the same examples as the other {workers - 1} task(s), and the "
            f"cluster trains {workers} times on the same data; {FIX}")


def _checked(method: Callable[..., object]) -> Callable[..., object]:
    from tfdist_nb.worker import state

    def distribute_and_check(self: tf.distribute.Strategy, dataset: tf.data.Dataset,
                             *args: object, **kwargs: object) -> object:
        reason = None
        with swallowed(logger):  # a check must never break the user's input pipeline
            reason = unsharded_reason(self, dataset)
        if reason:
            state.note(f"input not sharded: {reason}", "WARNING")
        return method(self, dataset, *args, **kwargs)

    return distribute_and_check


PART = "sharding"
STOPS = "the check for a dataset distributed without sharding"


def patch_distribute_lib(module: ModuleType) -> bool:
    """Check every dataset a strategy distributes. Raises AttributeError when no strategy class
    of ``distribute_lib`` defines ``experimental_distribute_dataset`` any more."""
    defined = [name for name in ("StrategyBase", "Strategy")
               if "experimental_distribute_dataset" in vars(getattr(module, name, object))]
    if not defined:
        raise AttributeError(f"{module.__name__}.StrategyBase.experimental_distribute_dataset "
                             "not found")
    for name in defined:
        replace_method(module, name, "experimental_distribute_dataset", _checked)
    return True


def install() -> None:
    instrument(PART, STOPS, {DISTRIBUTE_LIB: patch_distribute_lib})
