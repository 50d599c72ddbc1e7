"""A worker that a scheduler starts and the controller attaches to.

    python -m tfdist_nb.worker --task worker:1 --connection-dir /shared/run42 [--tf-port 23456]

SLURM ``srun``, a Kubernetes Job or a shell loop starts one of these per task. Each is an ordinary
tfdist_nb worker kernel: it writes its kernel connection file (owner-only, with its own signing
key) and a small ``<role>-<index>.tfdist.json`` beside it naming its task, host, pid and the
address its TensorFlow server will use, then waits. ``Cluster(launcher="attach",
launcher_options={"connection_dir": ...})`` reads those files, sends every task its TF_CONFIG
before any cell runs, and drives the tasks as if it had started them. A TF_CONFIG that the
scheduler already set is kept: its address for this task is the one announced.

The connection directory must be this user's and writable by nobody else (it is made ``0700``);
channels beyond loopback are refused unless CurveZMQ encrypts them (docs/security.md).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ipaddress
import json
import os
import re
import secrets
import socket
import stat
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from tfdist_nb.accounts import user_name
from tfdist_nb.host_os import boot_id

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ipykernel.kernelapp import IPKernelApp

TASK = re.compile(r"(chief|worker|ps|evaluator):(\d+)")
SIDECAR_SUFFIX = ".tfdist.json"


class Sidecar(TypedDict):
    """What an attached worker announces in its ``SIDECAR_SUFFIX`` file (read by the attach
    launcher): its files and address, and what tells its process from a reuse of its pid."""

    task: str
    connection_file: str
    connection_dir: str
    tf_address: str
    pid: int
    create_time: float
    hostname: str
    boot_id: str | None
    uid: int
    started: float
    python: str


class Refused(Exception):
    """A setting this worker will not run with; the message says why and what to do."""


def _tf_address(task: str, host: str | None, port: int | None) -> str:
    """This task's TF server address: the scheduler's TF_CONFIG, else ``host:port`` (a free
    port and this host's name when not given)."""
    with contextlib.suppress(KeyError, ValueError, IndexError, TypeError):
        cfg = json.loads(os.environ["TF_CONFIG"])
        return cfg["cluster"][cfg["task"]["type"]][int(cfg["task"]["index"])]
    from tfdist_nb.portpick import draw

    return f"{host or socket.gethostname()}:{port or draw(1)[0]}"


def is_loopback(ip: str) -> bool:
    """True for addresses only this host can reach (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:  # a host name or 0.0.0.0-style wildcard spelled otherwise: the network
        return False


def curve_keys(ip: str) -> dict[str, bytes]:
    """A CurveZMQ keypair for the kernel's channels (docs/security.md, "Attach launcher").

    Without CurveZMQ in this zmq, only loopback is allowed: a kernel port on the network with
    nothing but the HMAC key between it and anyone who can reach it is refused, not degraded.
    """
    import zmq

    if zmq.has("curve"):
        public, secret = zmq.curve_keypair()
        return {"curve_publickey": public, "curve_secretkey": secret}
    if not is_loopback(ip):
        raise Refused(f"--ip {ip} would open the kernel's channels to the network, but this zmq "
                      f"(libzmq {zmq.zmq_version()}) has no CurveZMQ to encrypt them; keep the "
                      "default --ip 127.0.0.1 and tunnel (ssh -L), or install a pyzmq wheel "
                      "(they include CurveZMQ)")
    return {}


def private_dir(path: Path) -> Path:
    """The connection directory, made ``0700`` or checked: it must be this user's and writable
    by nobody else, since the controller trusts what it finds there (docs/security.md)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise Refused(f"--connection-dir {path} belongs to {user_name(st.st_uid)}, not to you "
                          f"({user_name(os.geteuid())}): its owner could read the kernel's key or "
                          "plant files there; use a directory of your own")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise Refused(f"--connection-dir {path} is writable by group or others (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}), so anyone there could plant a "
                          "connection file the controller trusts; use a new directory or "
                          f"chmod 700 {path} first")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)  # ours: readable by nobody else from now on
    finally:
        os.close(fd)
    return path


def write_private(path: Path, data: Mapping[str, object]) -> None:
    """``data`` as JSON at ``path``, owner-only and whole: written to a fresh name opened with
    O_EXCL|O_NOFOLLOW (never a file or symlink planted beforehand), then renamed into place."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)  # readers never see half a file
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _kernel_app_class() -> type[IPKernelApp]:
    """IPKernelApp whose connection file goes through ``write_private`` (jupyter_client's own
    writer removes and reopens the path, following whatever is there then)."""
    from ipykernel.kernelapp import IPKernelApp

    class AttachedKernelApp(IPKernelApp):
        def write_connection_file(self, **kwargs: object) -> None:
            # jupyter_client's fields (the CurveZMQ keys too, when set), the key as text
            write_private(Path(self.abs_connection_file), {
                **self.get_connection_info(), "key": self.session.key.decode(),
                "kernel_name": ""})

    return AttachedKernelApp


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tfdist_nb.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, help="this task, e.g. worker:1 or chief:0")
    parser.add_argument("--connection-dir", required=True, type=Path,
                        help="directory the controller reads (yours; made owner-only)")
    parser.add_argument("--ip", default="127.0.0.1",
                        help="address the kernel's channels listen on (default: loopback only; "
                             "reach other hosts through SSH tunnels; beyond loopback needs "
                             "CurveZMQ)")
    parser.add_argument("--tf-host", help="host name other tasks reach this one at "
                                          "(default: this host's name)")
    parser.add_argument("--tf-port", type=int, help="TensorFlow server port (default: a free one)")
    args = parser.parse_args(argv)
    if not TASK.fullmatch(args.task):
        parser.error(f"--task must look like worker:1 or chief:0, got {args.task!r}")
    try:  # before anything starts or is written
        curve = curve_keys(args.ip)
        directory = private_dir(args.connection_dir)
    except (Refused, OSError) as exc:
        parser.error(str(exc))
    role, index = args.task.split(":")
    os.environ["TFDIST_TASK"] = args.task
    from tfdist_nb.worker import state

    state.set_task((role, int(index)))  # the package, imported to run this, read it already
    slug = f"{role}-{index}"
    connection_file = directory / f"{slug}.json"
    sidecar = directory / f"{slug}{SIDECAR_SUFFIX}"
    for stale in (sidecar, connection_file):  # a previous worker of this task that was killed
        stale.unlink(missing_ok=True)

    import psutil

    from tfdist_nb.worker import agent

    app = _kernel_app_class().instance(connection_file=str(connection_file), ip=args.ip,
                                       **curve)
    app.initialize(["--HistoryManager.enabled=False"])
    agent.start(app.kernel)
    # pid, create_time and boot_id let the controller signal this process and no other.
    announced: Sidecar = {
        "task": args.task, "connection_file": str(connection_file.resolve()),
        "connection_dir": str(directory.resolve()),
        "tf_address": _tf_address(args.task, args.tf_host, args.tf_port),
        "pid": os.getpid(), "create_time": psutil.Process().create_time(),
        "hostname": socket.gethostname(), "boot_id": boot_id(), "uid": os.geteuid(),
        "started": time.time(), "python": sys.executable,
    }
    write_private(sidecar, announced)
    atexit.register(lambda: sidecar.unlink(missing_ok=True))
    app.start()


if __name__ == "__main__":
    main()
