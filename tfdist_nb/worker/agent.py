"""The worker-side agent: what a worker kernel reports about itself to the controller.

Called by the controller through a silent execute request right after the kernel is up. It must
not create any TensorFlow op (the strategy has to come first in the process: docs/design.md,
Facts); importing TensorFlow is fine and is done here so the user's first cell does not pay for it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
import os
import platform
import socket
import sys
import sysconfig
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from tfdist_nb.portpick import bindable
from tfdist_nb.worker import kernel_internals, state
from tfdist_nb.worker.replies import Stacks, TaskInfo, Versions, Where

if TYPE_CHECKING:
    from IPython.core.interactiveshell import ExecutionResult

    from tfdist_nb.worker.inject import FaultParams
    from tfdist_nb.worker.kernel_internals import TaskKernel

logger = logging.getLogger(__name__)


def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def keras_flavour() -> str:
    """Which Keras ``tf.keras`` gives this task: ``"tf_keras"`` or ``"keras 3"``."""
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes")
    if legacy and dist_version("tf-keras"):
        return "tf_keras"
    keras = dist_version("keras") or ""
    return "keras 3" if keras.startswith("3") else (f"keras {keras}" if keras else "none")


def own_address(tf_config: str | None) -> str | None:
    """This task's own address in ``tf_config`` (TF_CONFIG's text), None when it names none."""
    try:
        cfg = json.loads(tf_config or "")
        return cfg["cluster"][cfg["task"]["type"]][cfg["task"]["index"]]
    except (KeyError, ValueError, IndexError, TypeError):
        return None


def own_port() -> int | None:
    address = own_address(os.environ.get("TF_CONFIG"))
    try:
        return int(address.rpartition(":")[2]) if address else None
    except (ValueError, AttributeError):
        return None


def versions() -> Versions:
    """This task's host, interpreter, system and the versions of what it trains with."""
    return {
        "host": socket.gethostname(), "python": platform.python_version(),
        "executable": sys.executable, "os": platform.platform(),
        "tensorflow": dist_version("tensorflow") or dist_version("tensorflow-cpu"),
        "keras": dist_version("keras"), "tf_keras": dist_version("tf-keras"),
        "numpy": dist_version("numpy"), "keras_flavour": keras_flavour(),
    }


def import_all(preload: list[str] | tuple[str, ...]) -> dict[str, str | None]:
    """Import each of ``preload``: its version by name."""
    return {name: getattr(__import__(name), "__version__", None) for name in preload}


def describe(preload: list[str] | tuple[str, ...] = ()) -> TaskInfo:
    """Who and where this task is, after importing ``preload`` (e.g. tensorflow)."""
    imported = import_all(preload)
    from tfdist_nb.worker import forked
    from tfdist_nb.worker.gpu import given

    forked.replay()  # a forked kernel's import ran in the fork server (docs/design.md)
    port = own_port()
    return {
        "pid": os.getpid(),
        **versions(),
        "task": list(task) if (task := state.get_task()) else None,
        "tf_config": os.environ.get("TF_CONFIG"),
        "port": port,
        # whether TensorFlow's gRPC server will be able to bind it (it binds all addresses)
        "port_free": bindable(port) if port else None,
        "gpus": given(),  # the GPUs it was given (docs/reference.md, GPUs)
        "imported": imported,
        # parts of the TensorFlow/Keras instrumentation that could not be installed so far
        # (importing ``preload`` runs the hooks); later ones come in telemetry samples too
        "instrumentation_errors": dict(state.instrumentation_errors),
    }


def _iopub_drained(kernel: TaskKernel, timeout_s: float) -> bool:
    """Whether the kernel's iopub thread has handed everything sent so far to zmq (whose own
    threads need no GIL) within ``timeout_s``: its events run in order."""
    thread = getattr(kernel, "iopub_thread", None)
    if thread is None:
        return False
    done = threading.Event()
    thread.schedule(done.set)
    return done.wait(timeout_s)


def start(kernel: TaskKernel) -> None:
    """Called by the worker kernel's entry point once the kernel exists, before any user cell."""
    from tfdist_nb.worker import _collectives, _keras, _sharding, _startup, _tfdata
    from tfdist_nb.worker.gpu import GpuSampler
    from tfdist_nb.worker.telemetry import INTERVAL_ENV, MSG_TYPE, Telemetry, telemetry_interval

    _tag_log_records()
    _flush_output_sooner()
    _reply_sooner(kernel)
    from tfdist_nb.worker import ordered_output

    ordered_output.install()  # before any cell: every write numbered and stamped

    try:
        interval = telemetry_interval(os.environ.get(INTERVAL_ENV))
    except ValueError:  # set on a remote host behind the controller's back: the default
        interval = 1.0
    # each message signed with the kernel's key, on its own iopub socket
    send = functools.partial(kernel.session.send, kernel.iopub_socket, MSG_TYPE,
                             ident=MSG_TYPE.encode())
    telemetry = Telemetry(send, interval_s=interval, gpu=GpuSampler())
    telemetry.drained = functools.partial(_iopub_drained, kernel)
    state.telemetry = telemetry  # before the instrumentation, so its failures can be said
    from tfdist_nb.worker import cellmap
    from tfdist_nb.worker.ledger import ABORT, LEDGER

    telemetry.ledger = LEDGER
    cellmap.install(kernel)
    kernel.shell.events.register("pre_run_cell", lambda *_: ABORT.clear())
    for module in (_keras, _tfdata, _sharding, _collectives, _startup):
        module.install()  # what fails is said once instead of losing the detection silently
    if not state.is_spare():  # a spare starts its telemetry when it is adopted as a task
        telemetry.start()
    # The steps of a cell go out at its end, on iopub before its idle status, so when the
    # controller sees a cell finish it already has that cell's exact step count.
    kernel.shell.events.register("post_execute", telemetry.flush_steps)
    kernel.shell.events.register("post_run_cell", _note_out_of_memory)
    from tfdist_nb.worker import postmortem

    postmortem.install()  # breakpoint() opens pdb (docs/reference.md, Input from the tasks)


def _note_out_of_memory(result: ExecutionResult) -> None:
    """A cell that ran out of memory without dying (MemoryError, TensorFlow's OOM
    ResourceExhaustedError: what an RLIMIT_AS limit gives) is said as such, with the limit it
    hit, as a WARNING note (docs/design.md, "Findings from inside the task")."""
    from tfdist_nb.worker.telemetry import out_of_memory_error

    exc = getattr(result, "error_in_exec", None)
    if exc is None or state.telemetry is None:
        return
    try:
        text = out_of_memory_error(type(exc).__name__, str(exc), state.telemetry.resources())
    except Exception:  # a diagnosis must never break the kernel
        logger.debug("the out-of-memory diagnosis failed", exc_info=True)
        return
    if text:
        state.note(text, "WARNING")
        state.telemetry.flush_steps()  # out before the cell's idle status: shown in the cell


def _flush_output_sooner() -> None:
    """ipykernel sends buffered output every 0.2 s, and what a SIGKILLed task printed in its
    last interval dies with it; a shorter interval shrinks that window (a flood still goes out
    as one message per interval)."""
    interval = float(os.environ.get("TFDIST_OUTPUT_FLUSH_S", "0.05"))
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "flush_interval"):
            stream.flush_interval = interval


def _reply_sooner(kernel: TaskKernel) -> None:
    """Drop what ipykernel spends on every request that a task's controller does not need
    (docs/performance.md): its 0.5 ms sleep before each execute reply (the controller takes a
    cell's output as complete at its idle status, which the IO thread sends after that output),
    and four DEBUG records per request that its WARNING handler then drops."""
    if not kernel_internals.lacking(kernel, "the reply without ipykernel's pause",
                                    "each cell's reply waits 0.5 ms more",
                                    (kernel_internals.EXECUTE_SLEEP,)):
        kernel._execute_sleep = 0.0
    log = getattr(kernel, "log", None)
    levels = [h.level for h in getattr(log, "handlers", ())]
    if isinstance(log, logging.Logger) and levels:
        log.setLevel(max(logging.DEBUG, min(levels)))


_log_task = "?"


def _tag_log_records() -> None:
    """Every logging record made in this task carries ``record.task`` (e.g. ``worker:1``);
    called again when a spare is adopted as a task."""
    global _log_task
    _log_task = state.task_name() or "?"
    make = logging.getLogRecordFactory()
    if getattr(make, "_tfdist", False):
        return

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = make(*args, **kwargs)
        record.task = _log_task
        return record

    factory._tfdist = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def set_log_level(level: str) -> str:
    """Python and TensorFlow logger level of this task (``%tfdist_loglevel``)."""
    logging.getLogger().setLevel(level)
    logging.getLogger("tensorflow").setLevel(level)
    return logging.getLevelName(logging.getLogger("tensorflow").level)


def stacks() -> Stacks:
    """Every thread's Python stack, main thread first, and where the main thread stands; run
    in the inspection subshell, so it answers while the main thread is inside a TF op."""
    import traceback

    frames = sys._current_frames()
    main_id = threading.main_thread().ident
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out = {names.get(i, f"thread {i}"): "".join(traceback.format_stack(frames[i]))
           for i in sorted(frames, key=lambda i: (i != main_id, names.get(i, ""))) if i != me}
    in_tf = [names.get(i, str(i)) for i, f in frames.items() if i != me and _inside_tf(f)]
    main = frames.get(main_id) if main_id is not None else None
    return {"threads": out, "main": _where(main), "in_tf": in_tf}


_TF_PARTS = (f"{os.sep}tensorflow{os.sep}", f"{os.sep}keras{os.sep}", f"{os.sep}tf_keras{os.sep}")


def _where(frame: FrameType | None) -> Where:
    """Where a main thread stands: ``at`` the innermost frame outside the standard library (a
    thread pool's wait is looked through), ``line`` the user's own cell line that led there
    (inside TensorFlow ``at`` alone helps nobody); idle when no cell of this kernel's is on
    its stack (the cell files IPython's compiler cached: docs/design.md)."""
    from tfdist_nb.worker import cellmap

    if frame is None:
        return {"kind": "unknown", "at": ""}
    frames = list(cellmap.python_frames(frame))
    if not any(cellmap.cell_of(filename) is not None for filename, _ in frames):
        return {"kind": "idle", "at": _at(frame)}
    kind = "tensorflow" if _inside_tf(frame) else "python"
    return {"kind": kind, "at": _at(_innermost_own(frame)), "line": cellmap.site(frames)}


def _inside_tf(frame: FrameType) -> bool:
    """Whether a thread's innermost frame outside the standard library is TensorFlow's (a
    thread waiting inside an op such as a collective)."""
    inner = _innermost_own(frame)
    return any(p in inner.f_code.co_filename for p in _TF_PARTS)


def _innermost_own(frame: FrameType) -> FrameType:
    stdlib = sysconfig.get_paths()["stdlib"]
    f: FrameType | None = frame
    while f is not None:
        fn = f.f_code.co_filename
        if not ((fn.startswith(stdlib) and "-packages" not in fn) or fn.startswith("<frozen")):
            return f
        f = f.f_back
    return frame


def _at(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def abort_collectives(reason: str) -> str:
    """Release a main thread blocked in a collective (docs/design.md, Facts: about 0.3 s).
    Collectives on this cluster then fail until the tasks are restarted."""
    from tfdist_nb.worker.ledger import ABORT

    ABORT.set()  # a task waiting in the manifest check (worker.agreement) gives up too
    if "tensorflow" not in sys.modules:
        return "no tensorflow"
    from tensorflow.python.eager import context

    context.context().abort_collective_ops(14, f"tfdist_nb: {reason}")  # 14 = UNAVAILABLE
    return "aborted"


def inject(kind: str, params: FaultParams) -> str:
    from tfdist_nb.worker import inject as faults

    return faults.clear() if kind == "clear" else faults.set_fault(kind, params)


def set_environment(env: dict[str, str]) -> str:
    """TF_CONFIG and ``env=`` for an attached worker, whose process the scheduler started;
    early enough before any cell: TensorFlow reads TF_CONFIG when a strategy is made."""
    os.environ.update(env)
    if ":" in env.get("TFDIST_TASK", ""):
        state.set_task(state.task_from_env())
    return "ok"


_server: Any = None


def start_tf_server() -> str:
    """Serve this task's part of a ParameterServerStrategy cluster on TensorFlow's threads,
    kept in a global instead of ``server.join()`` so the kernel stays free for cells."""
    global _server
    if _server is None:
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        _server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                       task_index=resolver.task_id,
                                       protocol=resolver.rpc_layer or "grpc", start=True)
    return str(_server.target)
