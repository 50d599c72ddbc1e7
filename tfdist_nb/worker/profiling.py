"""``%tfdist_profile``: a TensorFlow profiler server in every task, one capture of all of them
into one logdir (started by one task on a thread of its own), and a short per-task summary read
from the trace files."""

from __future__ import annotations

import collections
import glob
import os
import socket
import threading

from tfdist_nb.worker.replies import CaptureState, ProfileSummary, TraceFile

_server_port: int | None = None
_capture: CaptureState = {}


def start_server() -> int:
    """This task's profiler server port, the server started on first use (once per process)."""
    global _server_port
    if _server_port is None:
        import tensorflow as tf

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        tf.profiler.experimental.server.start(port)
        _server_port = port
    return _server_port


def start_capture(service_addrs: list[str], logdir: str, duration_ms: int,
                  delay_ms: int) -> str:
    """Capture every task at once (``delay_ms`` lets a cell start first), on a thread so the
    kernel stays free; :func:`capture_state` says when it is done."""
    if _capture.get("running"):
        return "busy"
    import tensorflow as tf

    _capture.update({"running": True, "logdir": logdir, "error": None})

    def run() -> None:
        try:
            tf.profiler.experimental.client.trace(
                ",".join(service_addrs), logdir, duration_ms, num_tracing_attempts=3,
                options=tf.profiler.experimental.ProfilerOptions(delay_ms=delay_ms))
        except Exception as exc:  # said to the controller, which tells the user
            _capture["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            _capture["running"] = False

    threading.Thread(target=run, name="tfdist-profile", daemon=True).start()
    return "started"


def _op_name(event: str) -> str | None:
    """The TensorFlow op an event of the host plane ran (``EagerLocalExecute: MatMul`` ->
    ``MatMul``, a graph op by its own name); None for the runtime's own wrappers."""
    if event.startswith("EagerLocalExecute: "):
        return event.split(": ", 1)[1]
    if not event or event.startswith(("Eager", "TFE_", "KernelAndDevice", "ExecutorState",
                                      "$", "Iterator::", "Thread")):
        return None
    return event


def capture_state() -> CaptureState:
    return _capture.copy()


def summary(logdir: str, top: int = 5) -> ProfileSummary:
    """Per trace file of the newest capture in ``logdir``: its events and the ops that took
    the most time on the host."""
    runs = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*")))
    if not runs:
        return {"run": None, "files": {}}
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    files: dict[str, TraceFile] = {}
    for path in sorted(glob.glob(os.path.join(runs[-1], "*.xplane.pb"))):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        events, busy = 0, collections.Counter[str]()
        for plane in space.planes:
            names = {k: v.name for k, v in plane.event_metadata.items()}
            for line in plane.lines:
                events += len(line.events)
                if plane.name.startswith("/host:"):
                    for e in line.events:
                        if op := _op_name(names.get(e.metadata_id, "")):
                            busy[op] += e.duration_ps
        files[os.path.basename(path)] = {
            "events": events,
            "top_ms": [(name, ps / 1e9) for name, ps in busy.most_common(top)]}
    return {"run": runs[-1], "files": files}
