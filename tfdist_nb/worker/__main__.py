"""A worker that a scheduler starts and the controller attaches to.

    python -m tfdist_nb.worker --task worker:1 --connection-dir /shared/run42 [--tf-port 23456]

SLURM ``srun``, a Kubernetes Job or a shell loop starts one of these per task. Each is an ordinary
tfdist_nb worker kernel: it writes its kernel connection file (owner-only, with its own signing
key) and a small ``<role>-<index>.tfdist.json`` beside it naming its task, host, pid and the
address its TensorFlow server will use, then waits. ``Cluster(launcher="attach",
launcher_options={"connection_dir": ...})`` reads those files, sends every task its TF_CONFIG
before any cell runs, and drives the tasks as if it had started them. A TF_CONFIG that the
scheduler already set is kept: its address for this task is the one announced.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

TASK = re.compile(r"(chief|worker|ps|evaluator):(\d+)")
SIDECAR_SUFFIX = ".tfdist.json"


def _tf_address(task: str, host: str | None, port: int | None) -> str:
    """This task's TF server address: the scheduler's TF_CONFIG, else ``host:port`` (a free
    port and this host's name when not given)."""
    with contextlib.suppress(KeyError, ValueError, IndexError, TypeError):
        cfg = json.loads(os.environ["TF_CONFIG"])
        return cfg["cluster"][cfg["task"]["type"]][int(cfg["task"]["index"])]
    from tfdist_nb.portpick import draw

    return f"{host or socket.gethostname()}:{port or draw(1)[0]}"


def _write_private(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)  # readers never see half a file


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tfdist_nb.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, help="this task, e.g. worker:1 or chief:0")
    parser.add_argument("--connection-dir", required=True, type=Path,
                        help="directory the controller reads (shared with it; made owner-only)")
    parser.add_argument("--ip", default="127.0.0.1",
                        help="address the kernel's channels listen on (default: loopback only; "
                             "reach other hosts through SSH tunnels)")
    parser.add_argument("--tf-host", help="host name other tasks reach this one at "
                                          "(default: this host's name)")
    parser.add_argument("--tf-port", type=int, help="TensorFlow server port (default: a free one)")
    args = parser.parse_args(argv)
    if not TASK.fullmatch(args.task):
        parser.error(f"--task must look like worker:1 or chief:0, got {args.task!r}")
    role, index = args.task.split(":")
    os.environ["TFDIST_TASK"] = args.task
    import tfdist_nb.worker as tw

    tw.task = (role, int(index))
    args.connection_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    slug = f"{role}-{index}"
    connection_file = args.connection_dir / f"{slug}.json"
    sidecar = args.connection_dir / f"{slug}{SIDECAR_SUFFIX}"
    for stale in (sidecar, connection_file):  # a previous worker of this task that was killed
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()

    import zmq
    from ipykernel.kernelapp import IPKernelApp

    from tfdist_nb.worker import agent

    # Attached kernels may listen beyond loopback: their channels are encrypted with CurveZMQ
    # (the keypair goes into the owner-only connection file, which jupyter_client reads).
    curve = dict(zip(("curve_publickey", "curve_secretkey"), zmq.curve_keypair(),
                     strict=True)) if zmq.has("curve") else {}
    app = IPKernelApp.instance(connection_file=str(connection_file), ip=args.ip, **curve)
    app.initialize(["--HistoryManager.enabled=False"])
    agent.start(app.kernel)
    _write_private(sidecar, {
        "task": args.task, "connection_file": str(connection_file.resolve()),
        "tf_address": _tf_address(args.task, args.tf_host, args.tf_port),
        "pid": os.getpid(), "hostname": socket.gethostname(), "started": time.time(),
        "python": sys.executable,
    })
    atexit.register(lambda: sidecar.unlink(missing_ok=True))
    app.start()


if __name__ == "__main__":
    main()
