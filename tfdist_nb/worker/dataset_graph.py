"""The one reader of a tf.data dataset's graph on the worker side, for the two checks that look
at a pipeline's ops: the check of a dataset distributed without sharding (``_sharding``) and
``%tfdist_check sharding`` (``consistency``; docs/reference.md, Checks).

TensorFlow is imported when a graph is read, never at import.
"""

from __future__ import annotations

from typing import Any, Literal

#: a ``tf.data.experimental.ExternalStatePolicy`` member's name
ExternalState = Literal["WARN", "IGNORE", "FAIL"]


def dataset_graph(dataset: Any, *, external_state: ExternalState) -> Any:
    """``dataset``'s ``GraphDef``, as TensorFlow serializes it; raises what the serialization
    raises (a dataset that cannot be serialized).

    ``external_state`` is what TensorFlow does about ops that depend on state outside the graph
    (a ``py_function``, say): ``WARN`` (TensorFlow's default) logs it, ``IGNORE`` does not,
    ``FAIL`` raises. The graph read is the same either way.
    """
    import tensorflow as tf

    policy = getattr(tf.data.experimental.ExternalStatePolicy, external_state)
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph(external_state_policy=policy).numpy())
    return graph
