"""Every collective this task issues goes into its ledger (``ledger``), eager or traced.

All of tf.distribute's collectives end in ``tensorflow.python.ops.collective_ops``, called
through the module attribute, so wrapping those functions sees each one. An eager one is a row
from launch to return; a traced one is an entry in its function graph's *manifest*, and each
call of the concrete function (``ConcreteFunction._call_flat``) adds one row per entry, so
executions are counted when they run. Cost: one dictionary lookup per function call (bench/,
part c).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

from tfdist_nb.debuglog import swallowed
from tfdist_nb.worker import cellmap
from tfdist_nb.worker.hooks import instrument, replace_method
from tfdist_nb.worker.ledger import LEDGER, Op

if TYPE_CHECKING:  # never at run time: the worker imports TensorFlow only when the cell does
    import tensorflow as tf

logger = logging.getLogger(__name__)

COLLECTIVE_OPS = "tensorflow.python.ops.collective_ops"
CONCRETE_FUNCTION = "tensorflow.python.eager.polymorphic_function.concrete_function"

PART = "collectives"
STOPS = ("the collective ledger and the hang rules (%tfdist_collectives), straggler detection "
         "from collective entry times in eager custom loops")

# name in collective_ops -> ledger kind; the first is required (MWMS all-reduce goes through it)
WRAPPED = {"all_reduce_v2": "all_reduce", "all_reduce": "all_reduce",
           "all_gather_v2": "all_gather", "all_gather": "all_gather",
           "broadcast_send_v2": "broadcast", "broadcast_send": "broadcast",
           "broadcast_recv_v2": "broadcast", "broadcast_recv": "broadcast"}

_manifests: weakref.WeakKeyDictionary[Any, list[Op]] = weakref.WeakKeyDictionary()
_calls: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_calls_lock = threading.Lock()


def patch_collective_ops(module: ModuleType) -> bool:
    """Wrap the collective ops; False if already done. Raises AttributeError when
    ``all_reduce_v2`` is gone (another TensorFlow release)."""
    if getattr(module, "all_reduce_v2", None) is None:
        raise AttributeError(f"{module.__name__}.all_reduce_v2 not found")
    done = False
    for name, kind in WRAPPED.items():
        fn = getattr(module, name, None)
        if fn is None or getattr(fn, "_tfdist_ledger", False):
            continue
        setattr(module, name, _recorded(fn, kind))
        done = True
    return done


def _recorded(fn: Callable[..., object], kind: str) -> Callable[..., object]:
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops

    from tfdist_nb.worker import state

    sig = inspect.signature(fn)
    receives = "t" not in sig.parameters  # broadcast_recv: the shape and dtype are arguments

    @functools.wraps(fn)
    def recorded(*args: object, **kwargs: object) -> object:
        eager = context.executing_eagerly()
        try:
            op = _describe(sig, args, kwargs, kind, receives, eager)
        except Exception:  # the ledger must never break a collective
            logger.debug("a %s left out of the ledger", kind, exc_info=True)
            op = None
        if op is None:
            return fn(*args, **kwargs)
        if not eager:
            _add_to_graph(ops.get_default_graph(), [op])
            return fn(*args, **kwargs)
        if kind == "all_reduce":
            state.entered_collective(time.time())
        return LEDGER.run(LEDGER.enter([op], "eager"), fn, *args, **kwargs)

    recorded._tfdist_ledger = True  # type: ignore[attr-defined]
    return recorded


def _describe(sig: inspect.Signature, args: tuple, kwargs: dict, kind: str, receives: bool,
              eager: bool) -> Op:
    bound = sig.bind_partial(*args, **kwargs).arguments
    if receives:
        dtype, shape = bound.get("dtype"), bound.get("shape")
    else:
        t = bound.get("t")
        dtype, shape = getattr(t, "dtype", None), getattr(t, "shape", None)
    dims = _dims(shape)
    dtype_name = getattr(dtype, "name", None) or str(dtype)
    size = getattr(dtype, "size", None)
    nbytes = None
    if dims is not None and size and all(d is not None for d in dims):
        nbytes = int(size) * math.prod(d or 0 for d in dims)  # every d known (not None)
    where = cellmap.main_thread_site() if eager else _traced_site()
    return Op(kind, _int(bound.get("group_size")), _int(bound.get("group_key")), dtype_name,
              dims, nbytes, where)


def _dims(shape: tf.TensorShape | None) -> tuple[int | None, ...] | None:
    if shape is None:
        return None
    as_list = getattr(shape, "as_list", None)
    if as_list is not None:
        try:
            return tuple(as_list())
        except ValueError:  # unknown rank
            return None
    try:
        return tuple(None if d is None else int(d) for d in shape)
    except TypeError:
        return None


def _int(value: tf.Tensor | int) -> int | None:
    try:
        return int(value)  # an int, or an eager scalar tensor
    except (TypeError, ValueError):
        return None


def _traced_site() -> str:
    """The user's line that traced a collective. TensorFlow's own stack maps autograph's
    generated code back to the cell; but a replica-context collective (``ctx.all_reduce`` in
    ``strategy.run``) is issued from the main thread's merge call while the line that asked for
    it waits on a replica thread, so that thread's frames are read too, through the same maps."""
    import sys

    from tensorflow.python.util import tf_stack

    maps: dict[tuple[str, int], tuple[str, int, str]] = {}
    for stack in list(tf_stack._source_mapper_stacks.values()):
        with swallowed(logger):  # a mapper we cannot read: its lines stay unmapped
            maps.update(stack[-1].get_effective_source_map())
    me = threading.current_thread()
    if type(me).__name__ != "_MirroredReplicaThread":
        frames = sys._current_frames()
        for th in threading.enumerate():
            if type(th).__name__ == "_MirroredReplicaThread" and th.ident in frames:
                site = cellmap.site(_mapped(cellmap.python_frames(frames[th.ident]), maps))
                if site.startswith("cell "):
                    return site
    stack = tf_stack.extract_stack()
    found = cellmap.site((fr.filename, fr.lineno) for fr in reversed(list(stack)))
    if found.startswith("cell ") or not maps:
        return found
    return cellmap.site(_mapped(cellmap.python_frames(sys._getframe(1)), maps))


def _mapped(frames: Iterable[tuple[str, int]], maps: dict[tuple[str, int], tuple[str, int, str]]
            ) -> Iterator[tuple[str, int]]:
    for filename, line in frames:
        origin = maps.get((filename, line))
        yield (origin[0], origin[1]) if origin else (filename, line)


def _add_to_graph(graph: tf.Graph, ops: list[Op]) -> None:
    """Record ``ops`` in the function graph being traced; one inside ``tf.cond`` or a loop body
    belongs to the function around it and may run any number of times per call."""
    in_flow = False
    while getattr(graph, "is_control_flow_graph", False) and getattr(graph, "outer_graph", None):
        in_flow = True
        graph = graph.outer_graph
    if not getattr(graph, "building_function", False):
        return  # a TF1-style graph: its runs are not function calls
    if in_flow:
        ops = [replace(o, in_control_flow=True) for o in ops]
    _manifests.setdefault(graph, []).extend(ops)


def _calling_function(depth: int = 16) -> tf.types.experimental.PolymorphicFunction | None:
    """The ``tf.function`` whose call runs this concrete function (a ``Function`` frame's
    ``self`` up the stack), or None for a concrete function called directly. Looked up once
    per concrete function, at its first run."""
    import sys

    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    frame: FrameType | None = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, polymorphic_function.Function):
            return owner
        frame = frame.f_back
    return None


def patch_concrete_function(module: ModuleType) -> bool:
    """Count the runs of every concrete function with collectives; False if already done."""
    def wrap(method: Callable[..., object]) -> Callable[..., object]:
        from tensorflow.python.eager import context
        from tensorflow.python.framework import ops

        from tfdist_nb.worker import agreement

        def call_flat(self: tf.types.experimental.ConcreteFunction, *args: object,
                      **kwargs: object) -> object:
            graph = getattr(self, "_func_graph", None)
            found = _manifests.get(graph) if _manifests and graph is not None else None
            if not found:
                return method(self, *args, **kwargs)
            if not context.executing_eagerly():  # called while another function is traced
                _add_to_graph(ops.get_default_graph(), found)
                return method(self, *args, **kwargs)
            with _calls_lock:
                call = _calls[graph] = _calls.get(graph, 0) + 1
            name = str(getattr(graph, "name", "?"))
            if call == 1:
                agreement.check(graph, name, found, owner=_calling_function())
            rows = LEDGER.enter(found, name, call=call, called_at=cellmap.main_thread_site())
            return LEDGER.run(rows, method, self, *args, **kwargs)
        return call_flat

    return replace_method(module, "ConcreteFunction", "_call_flat", wrap)


def install() -> None:
    instrument(PART, STOPS, {COLLECTIVE_OPS: patch_collective_ops,
                             CONCRETE_FUNCTION: patch_concrete_function})
