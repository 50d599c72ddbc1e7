"""What the preflight checks ask of each task (docs/reference.md, Checks): facts as the task
sees them, as JSON; the controller lines them up and :mod:`tfdist_nb.diagnostics` judges.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from tfdist_nb.debuglog import swallowed
from tfdist_nb.portpick import bindable
from tfdist_nb.worker import gpu_probe
from tfdist_nb.worker.agent import own_address, versions
from tfdist_nb.worker.ops import PortState
from tfdist_nb.worker.replies import Bandwidth, BandwidthRow, EnvReport, PeerReach, TfConfigView

if TYPE_CHECKING:  # never at run time: the worker imports TensorFlow only when the cell does
    import tensorflow as tf

logger = logging.getLogger(__name__)

RESOLVE_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 2.0
_listeners: list[socket.socket] = []  # the network check's stand-ins for TF servers not up yet


def _split(addr: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port``; None when it is not one (the analysis says why)."""
    host, _, port = str(addr).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def _resolve(host: str) -> str:
    """``"ok"`` or why ``host`` does not resolve here, within RESOLVE_TIMEOUT_S."""
    out: dict[str, str] = {}

    def look() -> None:
        try:
            socket.getaddrinfo(host, None)
            out["r"] = "ok"
        except OSError as exc:
            out["r"] = f"does not resolve ({exc.strerror or exc})"

    t = threading.Thread(target=look, daemon=True)
    t.start()
    t.join(RESOLVE_TIMEOUT_S)
    return out.get("r", f"did not resolve within {RESOLVE_TIMEOUT_S:.0f}s")


def _listening_here(port: int) -> bool:
    """Whether this process itself listens on ``port`` (its TensorFlow server, say)."""
    try:
        import psutil

        return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                   for c in psutil.Process().net_connections("tcp"))
    except Exception:  # psutil missing or not permitted: unknown, treat as not ours
        logger.debug("cannot list this process's connections", exc_info=True)
        return False


def port_state(port: int, own: bool = True) -> PortState:
    """``free``, ``served by this task`` (``own``: this process is the task) or ``in use`` on
    this host."""
    if own and _listening_here(port):
        return PortState.SERVED
    return PortState.FREE if bindable(port) else PortState.IN_USE


def tf_config_view(tf_config: str | None = None) -> TfConfigView:
    """TF_CONFIG as this task sees it now, whether each cluster host resolves here, and the
    state of this task's own port (or of every local port of a given config)."""
    text = os.environ.get("TF_CONFIG") if tf_config is None else tf_config
    view = TfConfigView(host=socket.gethostname(), tf_config=text, resolve={}, ports={})
    try:
        cfg = json.loads(text or "")
        cluster = cfg["cluster"]
        addresses = [a for addrs in cluster.values() for a in addrs]
    except (ValueError, KeyError, TypeError, AttributeError):
        return view  # the analysis reports what is malformed
    hosts = {p[0] for a in addresses if (p := _split(a))}
    view["resolve"] = {h: _resolve(h) for h in sorted(hosts)}
    mine = [own] if (own := own_address(text)) is not None else []
    if tf_config is not None:  # a config given to check: every address of this host
        local = {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}
        mine = [a for a in addresses if (p := _split(a)) and p[0] in local]
    view["ports"] = {a: port_state(p[1], own=tf_config is None) for a in mine
                     if (p := _split(a))}
    return view


def open_stand_in() -> str:
    """Listen on this task's TF port if TensorFlow does not serve it yet, so that the others
    can test the path to it; ``served``, ``listening`` or why it could not."""
    own = own_address(os.environ.get("TF_CONFIG"))
    parsed = _split(own) if own is not None else None
    if parsed is None:
        return "no TF_CONFIG address"
    if _listening_here(parsed[1]):
        return "served"
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", parsed[1]))
        s.listen(64)
    except OSError as exc:
        s.close()
        return f"port {parsed[1]} in use by another process ({exc.strerror or exc})"
    _listeners.append(s)
    return "listening"


def close_stand_ins() -> int:
    n = len(_listeners)
    while _listeners:
        _listeners.pop().close()
    return n


def connect_peers(addresses: dict[str, str]) -> dict[str, PeerReach]:
    """TCP connect to each ``name -> host:port``: ``{"ok", "ms", "error"}`` per peer, in
    parallel, each within CONNECT_TIMEOUT_S."""
    out: dict[str, PeerReach] = {}

    def one(name: str, addr: str) -> None:
        parsed = _split(addr)
        if parsed is None:
            out[name] = {"ok": False, "ms": None, "error": f"bad address {addr!r}"}
            return
        try:
            infos = socket.getaddrinfo(parsed[0], parsed[1], type=socket.SOCK_STREAM)
        except OSError as exc:
            out[name] = {"ok": False, "ms": None, "error": f"DNS: {exc.strerror or exc}"}
            return
        family, kind, proto, _, sockaddr = infos[0]
        started = time.perf_counter()
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(CONNECT_TIMEOUT_S)
                s.connect(sockaddr)
            out[name] = {"ok": True, "ms": (time.perf_counter() - started) * 1000, "error": None}
        except TimeoutError:
            out[name] = {"ok": False, "ms": None,
                         "error": f"timed out after {CONNECT_TIMEOUT_S:.0f}s"}
        except ConnectionRefusedError:
            out[name] = {"ok": False, "ms": None, "error": "refused"}
        except OSError as exc:
            out[name] = {"ok": False, "ms": None, "error": exc.strerror or str(exc)}

    threads = [threading.Thread(target=one, args=item, daemon=True)
               for item in addresses.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CONNECT_TIMEOUT_S + RESOLVE_TIMEOUT_S + 1)
    return out


def _user_ns() -> dict[str, object]:
    try:
        from IPython import get_ipython

        shell = get_ipython()
        return shell.user_ns if shell is not None else {}
    except ImportError:
        return {}


def find_strategy() -> tf.distribute.Strategy | None:
    """The multi-worker strategy the user's cells made, if any (the newest is not known, so
    the one with the most replicas)."""
    if "tensorflow" not in sys.modules:
        return None
    import tensorflow as tf

    found = [v for v in list(_user_ns().values()) if isinstance(v, tf.distribute.Strategy)]
    return max(found, key=lambda s: s.num_replicas_in_sync, default=None)


def allreduce_bandwidth(sizes_mb: list[float], repeats: int = 3,
                        implementation: str | None = None) -> Bandwidth:
    """All-reduce of float32 tensors of ``sizes_mb`` through the user's strategy, every task at
    once (the controller calls all tasks together): best time per size. Algorithm bandwidth is
    size / time; bus bandwidth scales it by 2(n-1)/n, as nccl-tests report all-reduce.
    ``implementation`` (``RING``, ``NCCL``): that collective for these calls only (the GPU
    check compares them); the reply names the strategy's own and its devices."""
    strategy = find_strategy()
    if strategy is None:
        return {"skipped": "no tf.distribute strategy in this task's namespace: create one "
                           "(e.g. MultiWorkerMirroredStrategy) and check again"}
    import tensorflow as tf

    n = strategy.num_replicas_in_sync
    impl = tf.distribute.experimental.CommunicationImplementation
    options = (tf.distribute.experimental.CommunicationOptions(implementation=impl[implementation])
               if implementation else None)
    own = getattr(getattr(strategy.extended, "_communication_options", None),
                  "implementation", None)
    rows: list[BandwidthRow] = []
    for mb in sizes_mb:
        elements = int(mb * 2**20 / 4)
        value = tf.ones([elements], tf.float32)

        def reduce(v: tf.Tensor = value) -> tf.Tensor:
            return tf.distribute.get_replica_context().all_reduce("sum", v, options=options)

        best = float("inf")
        for _ in range(repeats + 1):  # the first run warms the collective up
            started = time.perf_counter()
            out = strategy.run(reduce)
            _ = strategy.experimental_local_results(out)[0].numpy()[:1]
            best = min(best, time.perf_counter() - started)
        algbw = mb / 1024 / best  # GB/s
        rows.append({"size_mb": mb, "time_ms": best * 1000, "algbw_gb_s": algbw,
                     "busbw_gb_s": algbw * 2 * (n - 1) / n if n > 1 else algbw})
    devices = list(getattr(strategy.extended, "worker_devices", ()))
    return {"replicas": n, "rows": rows, "devices": devices,
            "implementation": getattr(own, "name", None)}


ENV_PREFIXES = ("TF_", "CUDA_", "NCCL_", "XLA_")


def env_report() -> EnvReport:
    """This task's environment now (read when asked, so a variable a cell set shows up):
    interpreter, TensorFlow and its CUDA/cuDNN build, Keras flavour, numpy, GPUs and driver,
    OS, host, every TF_/CUDA_/NCCL_/XLA_ variable, and every installed distribution."""
    import importlib.metadata

    props: dict[str, Any] = dict(versions())
    if "tensorflow" in sys.modules:  # what the TF build expects (no import just for this)
        with swallowed(logger):  # a CPU-only or unusual build: nothing to say
            info = dict(sys.modules["tensorflow"].sysconfig.get_build_info())
            props["tf_cuda_build"] = info.get("cuda_version")
            props["tf_cudnn_build"] = info.get("cudnn_version")
    props.update(_gpus())
    for key in sorted(os.environ):
        if key.startswith(ENV_PREFIXES):
            props[f"${key}"] = os.environ[key]
    packages = {}
    for dist in importlib.metadata.distributions():
        try:
            name = dist.name
        except KeyError:  # a distribution without a Name in its metadata
            continue
        if name:
            packages[name.lower()] = dist.version
    return {"props": props, "packages": packages}


def _gpus() -> dict[str, str | None]:
    """NVIDIA driver and the models of the GPUs the task was given, through NVML; empty without
    NVML (no GPU reads as empty)."""
    with swallowed(logger):  # NVML failing half-way: nothing to describe
        view = gpu_probe.nvml_view()
        if view["state"] == gpu_probe.NvmlState.OK:
            names = [str(d["name"]) for d in view["devices"] if d.get("name")]
            return {"nvidia_driver": view.get("driver"), "gpus": ", ".join(names) or None}
    return {}
