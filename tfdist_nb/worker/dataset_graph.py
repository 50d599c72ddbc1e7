"""The worker side's one reader of a tf.data dataset's graph (``_sharding``, ``consistency``);
TensorFlow is imported when a graph is read, never at import."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # never at run time: the worker imports TensorFlow only when the cell does
    import tensorflow as tf

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
