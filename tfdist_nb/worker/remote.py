"""The remote end of the SSH launcher: what ``ssh HOST python -m tfdist_nb.worker.remote`` runs.

``probe`` prints one JSON line: the address this host was reached at (``SSH_CONNECTION``, which
other hosts can reach, unlike ``localhost``), free TF ports and versions. ``serve`` starts one
kernel on ``ipc://`` sockets in a fresh owner-only directory (reached through SSH's forwards,
docs/security.md) and stays beside it: the key and environment arrive as one JSON line on stdin
(never on a command line ``ps`` shows), the rest of stdin is control (``interrupt``, ``stop
GRACE``, ``kill``; end of file kills the kernel's process group), stdout carries only ``ready
PID`` / ``exit CODE``, and the kernel's output goes to stderr (the task's process log).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from tfdist_nb.debuglog import swallowed
from tfdist_nb.portpick import draw

if TYPE_CHECKING:
    from jupyter_client.connect import KernelConnectionInfo

logger = logging.getLogger(__name__)


class ChannelPorts(TypedDict):
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    hb_port: int


class KernelSetup(TypedDict):
    """The controller's first word to a node's end (a JSON line; a Ray call): never on a
    command line."""

    key: str
    env: dict[str, str]
    cwd: str | None


class HostProbe(TypedDict):
    """:func:`probe`'s JSON line."""

    address: str
    hostname: str
    ports: list[int]
    python: str
    executable: str
    tfdist_nb: str | None
    user: str | None


#: ZeroMQ channel -> ipc "port" (the socket is ``<dir>/k-<port>``); both ends agree on these.
CHANNEL_PORTS: ChannelPorts = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3,
                               "control_port": 4, "hb_port": 5}
SOCKET_PREFIX = "k"
READY_TIMEOUT_S = 120.0


def probe(n_ports: int, avoid: list[int]) -> HostProbe:
    """Where and what this host is, and ``n_ports`` TF ports that are free on it now."""
    from tfdist_nb.worker.agent import dist_version

    conn = os.environ.get("SSH_CONNECTION", "").split()
    return {
        "address": conn[2] if len(conn) == 4 else socket.getfqdn(),
        "hostname": socket.gethostname(),
        "ports": draw(n_ports, avoid=set(avoid)),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "tfdist_nb": dist_version("tfdist_nb"),
        "user": os.environ.get("USER") or os.environ.get("LOGNAME"),
    }


def _emit(line: str) -> None:
    """A protocol line on stdout; a vanished controller is not an error here."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class _Lifeline:
    """Runs the kernel and obeys the controller's control lines until the kernel is gone."""

    def __init__(self, directory: Path, setup: KernelSetup) -> None:
        self.dir = directory
        self.connection_file = directory / "kernel.json"
        self.setup = setup
        self.proc: subprocess.Popen[bytes] | None = None
        self.how = "exit"
        self.created = False
        self.output = sys.stderr  # where the kernel's own stdout and stderr go

    def channels(self) -> KernelConnectionInfo:
        """Where the kernel's channels listen: ``ipc://`` sockets in the directory."""
        return {"transport": "ipc", "ip": str(self.dir / SOCKET_PREFIX), **CHANNEL_PORTS}

    def start(self) -> None:
        self.dir.mkdir(mode=0o700)  # fails if anything is already there: never reuse a dir
        self.created = True
        info = {**self.channels(), "key": self.setup["key"], "signature_scheme": "hmac-sha256",
                "kernel_name": "tfdist-worker"}
        fd = os.open(self.connection_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        env = {**os.environ, **self.setup.get("env", {}), "JPY_PARENT_PID": str(os.getpid())}
        cwd = self.setup.get("cwd")
        self.proc = subprocess.Popen(  # this interpreter: the one ssh was asked to run
            [sys.executable, "-m", "tfdist_nb.worker.kernel", "-f", str(self.connection_file),
             "--HistoryManager.enabled=False"],
            env=env, cwd=cwd if cwd and Path(cwd).is_dir() else None, stdin=subprocess.DEVNULL,
            stdout=self.output.fileno(), stderr=self.output.fileno(), start_new_session=True)

    def wait_ready(self) -> bool:
        """True once the kernel has bound every channel socket; False if it died first."""
        assert self.proc is not None
        sockets = [self.dir / f"{SOCKET_PREFIX}-{p}" for p in CHANNEL_PORTS.values()]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if all(s.exists() for s in sockets):
                return True
            time.sleep(0.02)
        return False

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def request_shutdown(self, grace_s: float) -> None:
        """Ask the kernel to shut down over its own control socket, then kill it after grace."""
        assert self.proc is not None
        deadline = time.monotonic() + grace_s
        client = None
        with swallowed(logger):
            from jupyter_client import BlockingKernelClient

            client = BlockingKernelClient(connection_file=str(self.connection_file))
            client.load_connection_file()
            client.control_channel.send(client.session.msg("shutdown_request",
                                                           {"restart": False}))
            client.control_channel.get_msg(timeout=grace_s)  # its reply: the request arrived
            self.how = "request"
        try:
            self.proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.how = "kill"
            self.signal(signal.SIGKILL)
        finally:
            if client is not None:
                with swallowed(logger):
                    client.stop_channels()

    def obey(self) -> None:
        """Control lines from the controller; end of input means it is gone."""
        for raw in sys.stdin:
            word, _, arg = raw.strip().partition(" ")
            if word == "interrupt":
                self.signal(signal.SIGINT)
            elif word == "stop":
                self.request_shutdown(float(arg or 1.0))
            elif word == "kill":
                self.how = "kill"
                self.signal(signal.SIGKILL)
        self.how = "lifeline"
        self.signal(signal.SIGKILL)

    def finish(self) -> int:
        assert self.proc is not None
        code = self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # whatever the user's code left in the kernel's session
            os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)
        return code


def serve(directory: Path) -> int:
    line = sys.stdin.readline()
    if not line:
        return 2
    life = _Lifeline(directory, json.loads(line))
    try:
        life.start()
    except OSError as exc:
        print(f"tfdist_nb remote: cannot start the worker kernel: {exc}", file=sys.stderr)
        if life.created:
            shutil.rmtree(directory, ignore_errors=True)
        _emit(f"failed {exc}")
        return 3
    threading.Thread(target=life.obey, name="tfdist-lifeline", daemon=True).start()
    if life.wait_ready():
        _emit(f"ready {life.proc.pid if life.proc else 0}")
    code = life.finish()
    _emit(f"exit {code} {life.how}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfdist_nb.worker.remote")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe", help="print this host's address and free TF ports as JSON")
    p.add_argument("--ports", type=int, default=1)
    p.add_argument("--avoid", default="", help="comma-separated ports not to choose")
    s = sub.add_parser("serve", help="start one worker kernel; setup JSON on stdin")
    s.add_argument("--dir", required=True, type=Path, help="new owner-only socket directory")
    args = parser.parse_args(argv)
    if args.command == "probe":
        avoid = [int(p) for p in args.avoid.split(",") if p]
        print(json.dumps(probe(args.ports, avoid)), flush=True)
        return 0
    with contextlib.suppress(AttributeError):
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel gets interrupts, not its lifeline
    return serve(args.dir)


if __name__ == "__main__":
    sys.exit(main())
