"""What ``%tfdist_check sharding`` asks of each task (docs/reference.md, Checks): the elements of
a dataset EXPR (evaluated in the user's namespace) as this task reads them, as JSON;
:mod:`tfdist_nb.diagnostics.sharding_check` says what is wrong.

Each element is a 64-bit BLAKE2b hash of its tensors' dtype, shape and bytes, after unbatching,
so that single examples are compared (a distributed dataset's per-replica values always, a plain
dataset's when its graph ends in a batch).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypedDict

from tfdist_nb.worker._sharding import dataset_graph
from tfdist_nb.worker.probes import _user_ns, find_strategy
from tfdist_nb.worker.replies import Described, Failure, Pipeline, Read, ShardCall, Skipped

if TYPE_CHECKING:  # never at run time: the worker imports TensorFlow only when the cell does
    import tensorflow as tf

logger = logging.getLogger(__name__)

MAX_ELEMENTS = 10_000
MAX_SECONDS = 30.0
PREVIEWS = 2000  # distinct elements whose short text is sent (for the evidence table)
PREVIEW_CHARS = 40
READER_OPS = frozenset({
    "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
    "FixedLengthRecordDatasetV2", "CSVDataset", "CSVDatasetV2", "ExperimentalCSVDataset",
    "ArrayRecordDataset", "RecordIODataset", "SSTableDataset"})
BATCH_OPS = frozenset({"BatchDataset", "BatchDatasetV2", "PaddedBatchDataset",
                       "PaddedBatchDatasetV2", "ParallelBatchDataset", "MapAndBatchDataset",
                       "ExperimentalMapAndBatchDataset", "RebatchDataset", "RebatchDatasetV2"})
UNBATCH_OPS = frozenset({"UnbatchDataset", "ExperimentalUnbatchDataset"})
# Shuffles whose seeds are inputs 2 and 3 (0 and 0: no seed given, nor a global one)
SHUFFLE_OPS = frozenset({"ShuffleDataset", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
                         "ShuffleAndRepeatDatasetV2"})
POLICIES = {-1: "OFF", 0: "AUTO", 1: "FILE", 2: "DATA", 3: "HINT"}


class _Resolved(TypedDict):
    kind: str  # "dataset" | "distributed"
    dataset: tf.data.Dataset | tf.distribute.DistributedDataset


class Resolved(_Resolved, total=False):
    """What EXPR evaluated to: the dataset, its undistributed ``source`` when found, and for a
    distributed one its strategy and how it was made (``_resolve_dataset``)."""

    source: tf.data.Dataset | None
    strategy: tf.distribute.Strategy | None
    strategy_name: str
    workers: int | None
    replicas: int | None
    made_by: str
    dataset_fn: Callable[[tf.distribute.InputContext], object] | None


def evaluate(expr: str) -> object:
    # the user's own expression in the user's own namespace, as a cell of theirs would
    return eval(expr, _user_ns())


def _const_strings(node: tf.compat.v1.NodeDef | None) -> int | None:
    """How many strings a Const node holds (a file list), None when it is not one."""
    if node is None or node.op != "Const" or "value" not in node.attr:
        return None
    tensor = node.attr["value"].tensor
    if tensor.dtype != 7:  # DT_STRING
        return None
    return math.prod(d.size for d in tensor.tensor_shape.dim)


def describe_pipeline(dataset: tf.data.Dataset) -> Pipeline:
    """What the dataset's graph says: batched at the end, its own ``shard()`` calls (each with
    whether an unseeded shuffle comes before it), whether its output passed an unseeded
    shuffle, and whether (and from how many files) it reads files. A graph that cannot be
    serialized is described as unknown; external state (a py_function) is ignored: only the ops
    are read."""
    try:
        graph = dataset_graph(dataset, external_state="IGNORE")
    except Exception:
        logger.debug("the graph of %r could not be read", dataset, exc_info=True)
        return {"graph": False, "batched": None, "shards": [], "unseeded_shuffle": None,
                "file_based": None, "files": None, "readers": []}
    nodes = {n.name: n for n in graph.node}

    def source(name: str) -> tf.compat.v1.NodeDef | None:
        return nodes.get(name.split(":")[0].lstrip("^"))

    def const_int(name: str) -> int | None:
        node = source(name)
        if node is None or node.op != "Const":
            return None
        vals = list(node.attr["value"].tensor.int64_val)
        return int(vals[0]) if vals else None

    def chain(name: str) -> Iterator[tf.compat.v1.NodeDef]:
        """The nodes from input ``name`` up to the source, along each node's first input."""
        node = source(name)
        while node is not None:
            yield node
            node = source(node.input[0]) if node.input else None

    def unseeded_upstream(name: str) -> bool:
        """An unseeded shuffle between this input and the source: its order differs from
        task to task (and from epoch to epoch)."""
        return any(n.op in SHUFFLE_OPS and len(n.input) >= 4 and const_int(n.input[2]) == 0
                   and const_int(n.input[3]) == 0 for n in chain(name))

    out = next((n for n in graph.node if n.op == "_Retval"), None)
    output = out.input[0] if out is not None and out.input else None
    # batched at the end: going up from the output, a batch comes before any unbatch
    batched = next((n.op in BATCH_OPS for n in (chain(output) if output else ())
                    if n.op in BATCH_OPS | UNBATCH_OPS), False)
    shards: list[ShardCall] = [{"num_shards": const_int(n.input[1]), "index": const_int(n.input[2]),
               "after_unseeded_shuffle": unseeded_upstream(n.input[0])}
              for n in graph.node if n.op == "ShardDataset" and len(n.input) >= 3]
    unseeded = bool(output and unseeded_upstream(output))
    every = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    readers = sorted({n.op for n in every if n.op in READER_OPS})
    files = max((c for n in graph.node if readers and n.input
                 and n.op in READER_OPS | {"TensorSliceDataset"}
                 if (c := _const_strings(source(n.input[0]))) is not None), default=None)
    return {"graph": True, "batched": batched, "shards": shards, "unseeded_shuffle": unseeded,
            "file_based": bool(readers), "files": files, "readers": readers}


def _policy(dataset: tf.data.Dataset) -> str | None:
    try:
        value = dataset.options().experimental_distribute.auto_shard_policy
    except Exception:
        logger.debug("no auto-shard policy read from %r", dataset, exc_info=True)
        return None
    return POLICIES.get(int(value), str(value))


def _num_workers(strategy: tf.distribute.Strategy) -> int | None:
    try:
        return int(strategy.extended._num_workers)
    except (AttributeError, TypeError, ValueError):
        return None


def _resolve_dataset(obj: object) -> Resolved:
    """``{"kind", ...}`` of what EXPR evaluated to, with the undistributed source when found."""
    import tensorflow as tf

    if isinstance(obj, tf.data.Dataset):
        return {"kind": "dataset", "dataset": obj, "source": None}
    if isinstance(obj, tf.distribute.DistributedDataset):
        strategy = getattr(obj, "_strategy", None)
        info: Resolved = {"kind": "distributed", "strategy": strategy, "dataset": obj,
                                "strategy_name": type(strategy).__name__,
                                "workers": _num_workers(strategy),
                                "replicas": getattr(strategy, "num_replicas_in_sync", None)}
        original = getattr(obj, "_original_dataset", None)
        if isinstance(original, tf.data.Dataset):
            return {**info, "made_by": "experimental_distribute_dataset", "source": original}
        return {**info, "made_by": "distribute_datasets_from_function", "source": None,
                "dataset_fn": getattr(obj, "_dataset_fn", None)}
    raise TypeError(f"{type(obj).__module__}.{type(obj).__name__} is neither a tf.data.Dataset "
                    "nor a distributed dataset (strategy.experimental_distribute_dataset / "
                    "distribute_datasets_from_function)")


def _whole_from_function(info: Resolved) -> tf.data.Dataset | None:
    """The undistributed dataset of ``distribute_datasets_from_function``: the function called
    with a context of one input pipeline (its ``shard(1, 0)`` keeps everything)."""
    import tensorflow as tf

    fn = info.get("dataset_fn")
    if fn is None:
        return None
    ctx = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                     num_replicas_in_sync=info.get("replicas") or 1)
    made = fn(ctx)
    return made if isinstance(made, tf.data.Dataset) else None


def sharding_describe(expr: str) -> Described:
    """EXPR's kind, its auto-shard policy and pipeline facts, without reading an element (asked
    first, so that a task where EXPR fails is known before any collective starts)."""
    import tensorflow as tf

    try:
        info = _resolve_dataset(evaluate(expr))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    out: Described = {"kind": info["kind"]}
    if info["kind"] == "distributed":
        out.update({"made_by": info["made_by"], "strategy_name": info["strategy_name"],
                    "workers": info["workers"], "replicas": info["replicas"]})
    base = info.get("dataset") if info["kind"] == "dataset" else info.get("source")
    if base is not None:
        out["policy"] = _policy(base)
        out["pipeline"] = describe_pipeline(base)
    elif info["kind"] == "distributed":  # from a function: this task's own dataset
        own = (getattr(info["dataset"], "_datasets", None) or [None])[0]
        if isinstance(own, tf.data.Dataset):
            out["pipeline"] = describe_pipeline(own)
    if info["kind"] == "dataset":
        strategy = find_strategy()
        out["workers"] = _num_workers(strategy) if strategy is not None else None
    return out


def _rows(value: tf.Tensor | tf.SparseTensor | tf.RaggedTensor, unbatch: bool) -> list[object]:
    """``value`` (one tensor or composite) as a list of per-example numpy values."""
    import numpy as np
    import tensorflow as tf

    if isinstance(value, tf.SparseTensor):
        value = tf.sparse.to_dense(value)
    if isinstance(value, tf.RaggedTensor):
        rows = [r.numpy() if hasattr(r, "numpy") else np.asarray(r) for r in value]
        return rows if unbatch else [np.asarray(value.to_list(), dtype=object)]
    arr = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    return list(arr) if unbatch and arr.ndim >= 1 else [arr]


def _fingerprint(parts: Sequence[object]) -> str:
    import numpy as np

    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        arr = np.asarray(part)
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        if arr.dtype == object:
            for item in arr.ravel():
                b = item if isinstance(item, bytes) else repr(item).encode()
                h.update(len(b).to_bytes(8, "little") + b)
        else:
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _preview(parts: Sequence[object]) -> str:
    import numpy as np

    def one(p: object) -> str:
        arr = np.asarray(p)
        if arr.ndim == 0:
            item = arr.item()
            return item.decode(errors="replace") if isinstance(item, bytes) else repr(item)
        return np.array2string(arr, threshold=6, edgeitems=2, separator=",")

    text = one(parts[0]) if len(parts) == 1 else "(" + ", ".join(one(p) for p in parts) + ")"
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 3] + "..."


class _Tally:
    def __init__(self, max_elements: int, max_seconds: float) -> None:
        self.counts: dict[str, int] = {}
        self.previews: dict[str, str] = {}
        self.examples = 0
        self.max_elements = max_elements
        self.max_seconds = max_seconds
        self.started = time.monotonic()

    def add(self, components: list[tf.Tensor | tf.SparseTensor | tf.RaggedTensor],
            unbatch: bool) -> None:
        # one example per position, as far as the shortest component goes
        for parts in zip(*(_rows(c, unbatch) for c in components), strict=False):
            fp = _fingerprint(parts)
            self.counts[fp] = self.counts.get(fp, 0) + 1
            if fp not in self.previews and len(self.previews) < PREVIEWS:
                self.previews[fp] = _preview(parts)
            self.examples += 1

    def bound(self) -> str | None:
        """The bound this reading reached (elements before time), if any."""
        if self.examples >= self.max_elements:
            return f"element bound ({self.max_elements})"
        if time.monotonic() - self.started > self.max_seconds:
            return f"time bound ({self.max_seconds:g} s)"
        return None

    def read(self, steps: int, cut: str | None) -> Read:
        return {"examples": self.examples, "steps": steps, "counts": self.counts,
                "previews": self.previews, "cut": cut,
                "seconds": round(time.monotonic() - self.started, 3)}


def _read_plain(dataset: tf.data.Dataset, unbatch: bool, max_elements: int,
                max_seconds: float) -> Read:
    import tensorflow as tf

    tally = _Tally(max_elements, max_seconds)
    cut = None
    steps = 0
    for element in dataset:
        tally.add(tf.nest.flatten(element), unbatch)
        steps += 1
        if cut := tally.bound():
            break
    return tally.read(steps, cut)


def _read_distributed(dist: tf.distribute.DistributedDataset, strategy: tf.distribute.Strategy,
                      max_elements: int, max_seconds: float) -> Read:
    """Every task takes the same steps (iterating runs MWMS's "has data" all-reduce): after each
    one, an all-reduce of "I reached a bound" tells all whether to stop, so none is left alone
    in a collective."""
    import tensorflow as tf

    def any_task(bound: bool, ended: bool) -> tuple[bool, bool]:
        """Whether any task reached a bound, and whether any ran out of data."""
        def reduce() -> tf.Tensor:
            return tf.distribute.get_replica_context().all_reduce(
                "sum", tf.constant([float(bound), float(ended)], tf.float32))

        got = strategy.experimental_local_results(strategy.run(reduce))[0].numpy()
        return bool(got[0] > 0), bool(got[1] > 0)

    tally = _Tally(max_elements, max_seconds)
    cut = None
    steps = 0
    iterator = iter(dist)
    while True:
        try:
            element = next(iterator)
        except (StopIteration, tf.errors.OutOfRangeError):
            # the others may still have a step: tell them this task is done
            any_task(False, True)
            break
        for local in range(len(strategy.experimental_local_results(
                tf.nest.flatten(element)[0]))):
            parts = [strategy.experimental_local_results(c)[local]
                     for c in tf.nest.flatten(element)]
            tally.add(parts, unbatch=True)
        steps += 1
        mine = tally.bound()
        bound, ended = any_task(mine is not None, False)
        if bound or ended:
            cut = mine or ("another task's bound" if bound else "another task ran out of data "
                           "first (uneven shards; no get_next_as_optional)")
            break
    return tally.read(steps, cut)


def sharding_fingerprints(expr: str, max_elements: int = MAX_ELEMENTS,
                          max_seconds: float = MAX_SECONDS, unbatch: bool | None = None,
                          reference: str | None = None, with_reference: bool = False,
                          ) -> Read:
    """This task's view of EXPR: per-example fingerprint counts, previews and which bound cut
    the reading short. ``with_reference``: also read the undistributed dataset (``reference``,
    an expression, or the distributed dataset's source) after the task's own reading, with
    ``max_elements`` times the number of workers as its bound."""
    info = _resolve_dataset(evaluate(expr))
    if info["kind"] == "dataset":
        dataset = info["dataset"]
        batched = describe_pipeline(dataset)["batched"] if unbatch is None else unbatch
        out = _read_plain(dataset, bool(batched), max_elements, max_seconds)
        out["unbatched"] = bool(batched)
    else:
        out = _read_distributed(info["dataset"], info["strategy"], max_elements, max_seconds)
        out["unbatched"] = True
    out["kind"] = info["kind"]
    if with_reference:
        out["reference"] = _read_reference(info, reference, out["unbatched"], max_elements,
                                           max_seconds)
    return out


def _read_reference(info: Resolved, reference: str | None, unbatch: bool,
                    max_elements: int, max_seconds: float) -> Read | Skipped | Failure:
    import tensorflow as tf

    try:
        if reference is not None:
            whole = evaluate(reference)
            if isinstance(whole, tf.distribute.DistributedDataset):
                raise TypeError("the reference must be a plain tf.data.Dataset (the "
                                "undistributed one), not a distributed dataset")
            origin = f"reference {reference}"
        elif info["kind"] == "distributed" and info.get("source") is not None:
            whole, origin = info["source"], "the dataset given to experimental_distribute_dataset"
        elif info["kind"] == "distributed":
            whole = _whole_from_function(info)
            origin = "the dataset function called with one input pipeline"
        else:
            return {"skipped": "a plain tf.data.Dataset has no undistributed source to compare "
                               "with: give one as reference"}
        if not isinstance(whole, tf.data.Dataset):
            return {"skipped": f"no undistributed dataset found ({origin} is "
                               f"{type(whole).__name__})"}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    batched = describe_pipeline(whole)["batched"]
    workers = info.get("workers") or 1
    got = _read_plain(whole, unbatch if batched is None else batched,
                      max_elements * max(workers, 1), max_seconds)
    got["origin"] = origin
    return got

