"""The node end of the Ray launcher: the Ray actor of one task (docs/remote.md, "Ray").

The actor lives in its task's placement-group bundle (Ray set ``CUDA_VISIBLE_DEVICES``), starts
the kernel as :mod:`.remote` does and hands its connection back through Ray (no shared file
system); the channels are CurveZMQ-encrypted (docs/security.md, "Ray launcher"), the output a
file on the node that ``poll`` ships back, and the kernel ends with the actor (:mod:`.lifeline`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypedDict, cast

import psutil

from tfdist_nb.portpick import draw
from tfdist_nb.worker.remote import CHANNEL_PORTS, ChannelPorts, KernelSetup, _Lifeline

if TYPE_CHECKING:
    from jupyter_client.connect import KernelConnectionInfo

    class StartedKernel(KernelConnectionInfo):
        """:meth:`TaskNode.start`'s answer: the kernel's connection, and its pid."""

        pid: int

LOG_CHUNK = 256 * 1024  # the most of the kernel's output one poll brings back
PREFIX = "tfdist-ray-"  # + the actor's pid: the kernel's files on its node


def _sweep() -> None:
    """Remove what actors that died with their node or raylet left on this host (a stop
    removes its own): directories of this user whose actor's pid is gone."""
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX):].split("-", 1)[0]
        with contextlib.suppress(OSError, ValueError):
            if path.stat().st_uid == os.geteuid() and not psutil.pid_exists(int(pid)):
                shutil.rmtree(path, ignore_errors=True)


def _janitor(home: Path, *pids: int) -> None:
    """Start, outside this actor's processes, what removes ``home`` once every one of ``pids``
    (the actor, the kernel) is gone, and ends when ``home`` is. Ray SIGKILLs a worker's child
    processes as the worker exits (a lost raylet ends its workers): neither the kernel nor the
    actor can then remove it (docs/remote.md, Ray: Stop). Double-forked, so Ray does not."""
    import subprocess

    subprocess.run([sys.executable, "-m", "tfdist_nb.worker.ray_node", str(home),
                    *map(str, pids)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, start_new_session=True, check=False, timeout=30)


def _watch(home: Path, pids: list[int]) -> None:
    if os.fork():  # the parent returns to the actor at once; this one is reparented
        os._exit(0)
    while home.exists():
        if not any(psutil.pid_exists(pid) for pid in pids):
            shutil.rmtree(home, ignore_errors=True)
            break
        time.sleep(0.5)
    os._exit(0)


class NodeWhere(TypedDict):
    """:meth:`TaskNode.where`'s answer."""

    address: str
    node_id: str
    hostname: str
    port: int  # free for the task's TF server
    gpus: str | None  # CUDA_VISIBLE_DEVICES, Ray's
    ray: str
    python: str
    pid: int  # the actor's


class _TcpLifeline(_Lifeline):
    """The kernel's channels on TCP ports of ``ip`` (free now), CurveZMQ where zmq has it."""

    def __init__(self, directory: Path, setup: KernelSetup, ip: str) -> None:
        super().__init__(directory, setup)
        import zmq

        self.ip = ip
        self.ports = cast("ChannelPorts", dict(zip(  # a free port for each of its keys
            CHANNEL_PORTS, draw(len(CHANNEL_PORTS)), strict=True)))
        self.curve: KernelConnectionInfo = {}
        if zmq.has("curve"):
            public, secret = zmq.curve_keypair()
            self.curve = {"curve_publickey": public.decode(), "curve_secretkey": secret.decode()}

    def channels(self) -> KernelConnectionInfo:
        return {"transport": "tcp", "ip": self.ip, **self.ports, **self.curve}

    def start(self) -> None:
        """As the lifeline's, with SIGINT unblocked: Ray's worker threads block it, and a child
        inherits the mask of the thread that starts it (an interrupt would never arrive)."""
        # Ray points a worker's breakpoint() at its own debugger, which fails in the kernel (not
        # a Ray worker): the task's breakpoint() is pdb, through the notebook
        # (docs/reference.md, Input from the tasks)
        if os.environ.get("PYTHONBREAKPOINT", "").startswith("ray."):
            del os.environ["PYTHONBREAKPOINT"]
        old = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


class TaskNode:
    """One task's Ray actor (the launcher wraps it with ``ray.remote``)."""

    def __init__(self, task: str) -> None:
        self.task = task
        self.life: _TcpLifeline | None = None
        self.home: Path | None = None
        self.log: BinaryIO | None = None

    def where(self, avoid: list[int]) -> NodeWhere:
        """This node's address, a TF port free on it, and what Ray gave the task."""
        import ray

        return {"address": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id(),
                "hostname": socket.gethostname(), "port": draw(1, avoid=set(avoid))[0],
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "ray": ray.__version__,
                "python": sys.version.split()[0], "pid": os.getpid()}

    def start(self, setup: KernelSetup) -> StartedKernel:
        """Start the task's kernel (a running one is ended first); its connection info."""
        self.stop(0.0)
        import ray

        _sweep()
        self.home = Path(tempfile.mkdtemp(
            prefix=f"{PREFIX}{os.getpid()}-{self.task.replace(':', '-')}-"))
        self.log = open(self.home / "kernel.log", "w+b")  # noqa: SIM115 - closed by stop
        self.life = _TcpLifeline(self.home / "kernel", setup, ray.util.get_node_ip_address())
        self.life.output = self.log
        self.life.start()
        assert self.life.proc is not None
        _janitor(self.home, os.getpid(), self.life.proc.pid)
        return {**self.life.channels(), "key": setup["key"], "signature_scheme": "hmac-sha256",
                "pid": self.life.proc.pid}

    def poll(self, offset: int) -> tuple[int | None, bytes, int]:
        """The kernel's exit code (None while it runs) and its output from ``offset`` on."""
        proc = self.life.proc if self.life is not None else None
        code = proc.poll() if proc is not None else None
        text = b""
        if self.log is not None:
            self.log.seek(offset)
            text = self.log.read(LOG_CHUNK)
        return code, text, offset + len(text)

    def signal(self, sig: int = signal.SIGINT) -> None:
        if self.life is not None:
            self.life.signal(sig)

    def stop(self, grace_s: float, offset: int = 0) -> tuple[int | None, str, bytes]:
        """End the kernel: a shutdown request, ``grace_s`` to exit, then SIGKILL. Its exit
        code, how it ended (``request``, ``kill``; ``exit``: it had ended already) and its
        output from ``offset`` on; its files on the node are removed."""
        life, self.life = self.life, None
        if life is None or life.proc is None:
            return None, "exit", b""
        if life.proc.poll() is None:
            if grace_s > 0:
                life.request_shutdown(grace_s)
            else:
                life.how = "kill"
                life.signal(signal.SIGKILL)
        code = life.finish()
        tail = b""
        if self.log is not None:
            self.log.seek(offset)
            tail = self.log.read(LOG_CHUNK)
            self.log.close()
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)
        return code, life.how, tail


if __name__ == "__main__":  # _janitor's watch: DIR PID...
    _watch(Path(sys.argv[1]), [int(pid) for pid in sys.argv[2:]])
