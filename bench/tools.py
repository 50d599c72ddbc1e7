"""The three ways to get N Python kernels that run the same cell, as the benchmarks drive them.

- ``tfdist_nb``: ``Cluster(workers=n, warm=False).start()`` then ``Cluster.run``.
- ``ipyparallel``: ``Cluster(n=n).start_and_connect_sync()`` then ``DirectView.execute``.
- ``jupyter_client``: what a user could hand-roll without either: N ``python -m ipykernel_launcher``
  kernels (the default ``python3`` kernel spec), each given a TF_CONFIG, started in parallel with
  ``AsyncKernelManager``, ``wait_for_ready``, then an execute request sent to each and its reply
  (and idle status) awaited.

Each tool's ``start(n, tf)`` returns a :class:`Started` with the wall time until every task is
ready (``tf``: has finished ``import tensorflow``) and per-phase times, measured from the call:
``phases[name]`` is when the *last* task finished that phase. ``rtt(handle)`` sends ``x = 1`` to
every task and returns the seconds until all replied and their output is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

TRIVIAL = "x = 1"


@dataclass
class Started:
    took_s: float
    handle: Any
    phases: dict[str, float] = field(default_factory=dict)  # phase -> s after start (last task)
    phase_each: dict[str, float] = field(default_factory=dict)  # phase -> median s per task


class _Phases:
    """Records when each task enters and leaves each phase (``perf_counter`` seconds)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.spans: list[tuple[str, str, float, float]] = []

    def add(self, phase: str, task: str, began: float, ended: float) -> None:
        self.spans.append((phase, task, began, ended))

    def summary(self) -> tuple[dict[str, float], dict[str, float]]:
        done: dict[str, float] = {}
        each: dict[str, list[float]] = {}
        for phase, _, began, ended in self.spans:
            done[phase] = max(done.get(phase, 0.0), ended - self.t0)
            each.setdefault(phase, []).append(ended - began)
        return done, {k: sorted(v)[len(v) // 2] for k, v in each.items()}


# ---------------------------------------------------------------------------- tfdist_nb
# Where tfdist_nb's start-up time goes, seen from outside: each probe wraps one step of
# Cluster.start() for every task (a name that no longer exists is skipped, not an error).
_TFDIST_PROBES = [
    # (module, class, method, phase, how to name the task from the call's arguments)
    ("tfdist_nb.launchers.local", "LocalLauncher", "tf_addresses", "0 TF ports chosen",
     lambda a: "all"),
    ("tfdist_nb.launchers.local", "LocalLauncher", "private_network",
     "0 private network decided", lambda a: "all"),
    ("tfdist_nb.launchers.local", "LocalLauncher", "start", "1 process spawned",
     lambda a: str(a[1].task)),
    ("tfdist_nb.transport.channel", "KernelChannel", "start", "2 kernel ready (wait_for_ready)",
     lambda a: a[0].task),
    ("tfdist_nb.cluster.agent_client", "AgentClient", "describe",
     "3 preload imported (handshake)", lambda a: a[0].task),
    ("tfdist_nb.transport.channel", "KernelChannel", "create_subshell", "4 subshell created",
     lambda a: a[0].task),
]


@contextlib.contextmanager
def _probed(phases: _Phases) -> Iterator[None]:
    import importlib

    undo = []
    for mod_name, cls_name, meth, phase, task_of in _TFDIST_PROBES:
        cls = getattr(importlib.import_module(mod_name), cls_name, None)
        orig = getattr(cls, meth, None) if cls is not None else None
        if orig is None:
            continue
        setattr(cls, meth, _timed(orig, phase, task_of, phases))
        undo.append((cls, meth, orig))
    try:
        yield
    finally:
        for cls, meth, orig in undo:
            setattr(cls, meth, orig)


def _timed(fn: Callable, phase: str, task_of: Callable, phases: _Phases) -> Callable:
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                phases.add(phase, task_of(args), began, time.perf_counter())
        return timed_async

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases.add(phase, task_of(args), began, time.perf_counter())
    return timed


class Tfdist:
    name = "tfdist_nb"

    def start(self, n: int, tf: bool = True) -> Started:
        from tfdist_nb.launchers import forkserver

        forkserver.close_all()  # a first start: its fork server imports TensorFlow, timed
        return self.timed_start(n, tf)

    @staticmethod
    def timed_start(n: int, tf: bool) -> Started:
        from tfdist_nb import Cluster

        phases = _Phases()
        with _probed(phases):
            # no spare kernels: their warm-up, right after the start, would share the cores
            # with the round trips timed next (what spares cost and save is bench.warm's)
            cluster = Cluster(workers=n, preload=("tensorflow",) if tf else (),
                              warm=False).start()
        took = time.perf_counter() - phases.t0
        done, each = phases.summary()
        return Started(took, cluster, done, each)

    def rtt(self, cluster: Any) -> float:
        t0 = time.perf_counter()
        result = cluster.run(TRIVIAL)
        took = time.perf_counter() - t0
        assert result.ok, result.summary()
        return took

    def stop(self, cluster: Any) -> None:
        cluster.stop()


# ---------------------------------------------------------------------------- ipyparallel
class Ipyparallel:
    name = "ipyparallel"

    def start(self, n: int, tf: bool = True) -> Started:
        import ipyparallel as ipp

        t0 = time.perf_counter()
        cluster = ipp.Cluster(n=n, log_level=40, engine_timeout=180)
        rc = cluster.start_and_connect_sync()
        handle = (cluster, rc)
        try:
            rc.wait_for_engines(n, timeout=180)
            up = time.perf_counter() - t0
            phases = {"1 controller + engines up (start_and_connect, wait_for_engines)": up}
            if tf:
                rc[:].execute("import tensorflow", block=True)
                phases["2 tensorflow imported (execute)"] = time.perf_counter() - t0
        except BaseException:
            self.stop(handle)
            raise
        return Started(time.perf_counter() - t0, handle, phases)

    def rtt(self, handle: Any, silent: bool = True) -> float:
        _, rc = handle
        view = rc[:]
        t0 = time.perf_counter()
        view.execute(TRIVIAL, silent=silent, block=True)
        return time.perf_counter() - t0

    def rtt_loud(self, handle: Any) -> float:
        """What a notebook cell does (history, execute_result): ``silent=False``."""
        return self.rtt(handle, silent=False)

    def stop(self, handle: Any) -> None:
        cluster, rc = handle
        with contextlib.suppress(Exception):
            rc.close()
        cluster.stop_cluster_sync()


# ---------------------------------------------------------------------------- jupyter_client
def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("localhost", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class BareKernels:
    loop: asyncio.AbstractEventLoop
    managers: list[Any]
    clients: list[Any]
    workdir: str


async def _execute(kc: Any, code: str, timeout: float = 600) -> dict[str, Any]:
    """Send ``code``; return its reply once the kernel has also gone idle (output complete)."""
    msg_id = kc.execute(code)

    async def reply() -> dict[str, Any]:
        while True:
            msg = await kc.get_shell_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]

    async def idle() -> None:
        while True:
            msg = await kc.get_iopub_msg(timeout=timeout)
            if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"):
                return

    content, _ = await asyncio.gather(reply(), idle())
    if content.get("status") != "ok":
        raise RuntimeError(f"{code!r} failed: {content.get('ename')}: {content.get('evalue')}")
    return content


class JupyterClient:
    name = "jupyter_client"

    def start(self, n: int, tf: bool = True) -> Started:
        phases = _Phases()
        loop = asyncio.new_event_loop()
        handle = BareKernels(loop, [], [], tempfile.mkdtemp(prefix="bench_kernels_"))
        try:
            loop.run_until_complete(self._start_all(handle, n, tf, phases))
        except BaseException:
            self.stop(handle)
            raise
        took = time.perf_counter() - phases.t0
        done, each = phases.summary()
        return Started(took, handle, done, each)

    async def _start_all(self, h: BareKernels, n: int, tf: bool, phases: _Phases) -> None:
        from jupyter_client.manager import AsyncKernelManager

        addresses = [f"localhost:{p}" for p in _free_ports(n)]
        kms = [AsyncKernelManager(kernel_name="python3") for _ in range(n)]
        h.managers.extend(kms)

        async def one(i: int, km: Any) -> None:
            task = f"worker:{i}"
            km.connection_file = os.path.join(h.workdir, f"kernel-{i}.json")
            tf_config = json.dumps({"cluster": {"worker": addresses},
                                    "task": {"type": "worker", "index": i}})
            began = time.perf_counter()
            with open(os.path.join(h.workdir, f"kernel-{i}.log"), "ab") as log:
                await km.start_kernel(env={**os.environ, "TF_CONFIG": tf_config},
                                      stdout=log, stderr=log)
            phases.add("1 process spawned", task, began, mark := time.perf_counter())
            kc = km.client()
            h.clients.append(kc)
            kc.start_channels()
            await kc.wait_for_ready(timeout=120)
            phases.add("2 kernel ready (wait_for_ready)", task, mark, mark2 := time.perf_counter())
            if tf:
                await _execute(kc, "import tensorflow")
                phases.add("3 tensorflow imported (execute)", task, mark2, time.perf_counter())

        await asyncio.gather(*(one(i, km) for i, km in enumerate(kms)))

    def rtt(self, h: BareKernels) -> float:
        async def broadcast() -> None:
            await asyncio.gather(*(_execute(kc, TRIVIAL, timeout=60) for kc in h.clients))

        t0 = time.perf_counter()
        h.loop.run_until_complete(broadcast())
        return time.perf_counter() - t0

    def stop(self, h: BareKernels) -> None:
        async def down() -> None:
            for kc in h.clients:
                with contextlib.suppress(Exception):
                    kc.stop_channels()
            await asyncio.gather(*(km.shutdown_kernel(now=True) for km in h.managers
                                   if km.has_kernel), return_exceptions=True)

        with contextlib.suppress(Exception):
            h.loop.run_until_complete(down())
        h.loop.close()
        with contextlib.suppress(OSError):
            for name in os.listdir(h.workdir):
                os.unlink(os.path.join(h.workdir, name))
            os.rmdir(h.workdir)


class TfdistNext(Tfdist):
    """The next cluster of the same notebook (a ``%%tfcluster`` resize, isolate's variants): its
    fork server is up, made (untimed) by a cluster started and stopped before."""

    name = "tfdist_nb_next"

    def start(self, n: int, tf: bool = True) -> Started:
        from tfdist_nb import Cluster
        from tfdist_nb.launchers import forkserver

        if not any(s.alive() for s in forkserver.live_servers()):
            Cluster(workers=1, preload=("tensorflow",) if tf else (), warm=False).start().stop()
        return self.timed_start(n, tf)


TOOLS: dict[str, Any] = {"tfdist_nb": Tfdist(), "ipyparallel": Ipyparallel(),
                         "jupyter_client": JupyterClient(), "tfdist_nb_next": TfdistNext()}


def start(name: str, n: int, tf: bool, failures: list[str]) -> Started:
    """``TOOLS[name].start``, tried once more if it fails; each failure is kept in ``failures``
    (and so in the results), not hidden: on 2 cores with 16 kernels starting, a kernel port that
    jupyter_client picked can be taken before the kernel binds it."""
    try:
        return TOOLS[name].start(n, tf=tf)
    except Exception as exc:
        failures.append(f"{name} x{n}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        print(f"bench: {failures[-1]}; trying once more", flush=True)
        return TOOLS[name].start(n, tf=tf)


def rotated(names: list[str], i: int) -> list[str]:
    """The order of the ``i``-th round: each tool goes first in turn, so drift hits all alike."""
    k = i % len(names)
    return names[k:] + names[:k]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]
