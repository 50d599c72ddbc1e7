"""``%tfdist_numerics``: TensorFlow's NaN/Inf checking on this task, and Debugger V2 dumps.

The first op whose output holds NaN or Inf raises an ``InvalidArgumentError`` naming it, which
the controller lines up across tasks. One dump root per task: TensorBoard's Debugger V2 cannot
read a root shared by several tasks.
"""

from __future__ import annotations

import os

from tfdist_nb.worker.replies import NumericsState

_state: NumericsState = {"numerics": False, "dump_root": None}


def set_numerics(on: bool, dump_root: str | None = None) -> NumericsState:
    import tensorflow as tf

    if on and not _state["numerics"]:
        tf.debugging.enable_check_numerics(stack_height_limit=12, path_length_limit=60)
    elif not on and _state["numerics"]:
        tf.debugging.disable_check_numerics()
    _state["numerics"] = on
    if dump_root and on and _state["dump_root"] != dump_root:
        os.makedirs(dump_root, mode=0o700, exist_ok=True)
        tf.debugging.experimental.enable_dump_debug_info(
            dump_root, tensor_debug_mode="FULL_HEALTH", circular_buffer_size=1000)
        _state["dump_root"] = dump_root
    elif not on and _state["dump_root"]:
        tf.debugging.experimental.disable_dump_debug_info()
        _state["dump_root"] = None
    return _state.copy()
