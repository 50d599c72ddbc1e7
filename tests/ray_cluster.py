"""A real two-node Ray cluster for the Ray launcher's tests: ``ray start --head`` on the first
network-namespace host of ``tests/remote_hosts.py`` and ``ray start --address`` on the second.

Why: the launcher has to be tested against Ray itself (placement groups placed or refused by
Ray's scheduler, actors on two nodes, a raylet that dies, Ray Client from a process that is not a
Ray node), not a stand-in. The notebook (the test process) runs in the root network namespace
and reaches the head through Ray Client (``ray://HEAD:10001``) over the tests' bridge, as a
laptop reaches a cluster. Each node runs ``ray start --block`` through ``nsenter --net`` (as
tests/slurm_cluster.py runs slurmd), with its own ``--temp-dir`` (the hosts share one file
system), one logical CPU, no dashboard and a small object store: this machine has 2 cores.

``remove()`` ends every process in the namespaces (raylets, GCS, workers, kernels) and removes
the hosts. Needs what remote_hosts needs plus nsenter and the ``ray`` extra (``.[ray]``);
``require_available()`` skips, or fails under CI, saying why not.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests import remote_hosts

GCS_PORT = 6379
CLIENT_PORT = 10001
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's floor is 75 MiB
_READY_TIMEOUT_S = 90.0
#: the Ray of the version-mismatch test's cluster (the second when the notebook has the first)
OTHER_RAY, OTHER_RAY_TOO = "2.58.0", "2.59.0"
AGENT_PORTS = {"dashboard-agent-listen-port": 52365, "dashboard-agent-grpc-port": 52366,
               "runtime-env-agent-port": 52367, "metrics-export-port": 52368}
#: what a cluster started on a node: its tasks' actors (``ray::TaskNode`` once Ray names the
#: process) and kernels; everything else there is Ray's own (GCS, raylet, agents, Ray Client's
#: servers, idle workers of Ray's pool)
OURS = ("TaskNode", "tfdist_nb")


class RayClusterError(RuntimeError):
    """The Ray cluster could not be made (the message has the node's own output)."""


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """None if the two-node Ray cluster can be made here, else why not."""
    if importlib.util.find_spec("ray") is None:
        return "ray is not installed (pip install -e '.[ray]'; the test extra includes it)"
    if shutil.which("nsenter") is None:
        return "nsenter not found (apt-get install util-linux)"
    return remote_hosts.available()


def require_available() -> None:
    """Skip when a Ray test cluster cannot be made here, saying why; under CI fail instead."""
    remote_hosts.require(available(), "a test Ray cluster")


def ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def other_ray_version() -> str:
    """A Ray release other than the notebook's (the version-mismatch test's cluster)."""
    import ray

    return OTHER_RAY if ray.__version__ != OTHER_RAY else OTHER_RAY_TOO


def install_other_ray(venv: Path) -> str:
    """A virtual environment at ``venv`` with ``other_ray_version()`` installed from the
    package registry (``ray[client]``, as a cluster's head has it); its ``ray`` command."""
    version = other_ray_version()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                           f"ray[client]=={version}"], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RayClusterError(f"pip install ray[client]=={version} failed: "
                              + (done.stderr or done.stdout)[-2000:])
    return str(venv / "bin" / "ray")


@dataclass(eq=False)
class RayCluster:
    """Two Ray nodes on fake hosts; ``client_address`` is what the notebook connects to."""

    __test__ = False

    hosts: remote_hosts.TestHosts
    workdir: Path
    ray: str = field(default_factory=ray_bin)  # the ``ray`` command its nodes run
    nodes: list[str] = field(default_factory=list)  # node addresses, head first
    alias_of: dict[str, str] = field(default_factory=dict)
    #: Ray's --temp-dir of each node is below this short one: a Unix socket path is at most
    #: 107 bytes, and pytest's temp dirs are deep
    short_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tfdr-")))
    _blocks: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _removed: bool = False

    @property
    def auth(self) -> dict[str, str]:
        """Ray's token authentication of this cluster: what its nodes and the notebook set
        (the token is this cluster's own, never ~/.ray/auth_token)."""
        token = self.workdir / "auth_token"
        if not token.exists():
            fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}

    @property
    def head(self) -> str:
        return self.nodes[0]

    @property
    def client_address(self) -> str:
        return f"ray://{self.head}:{CLIENT_PORT}"

    def pids(self, node: str) -> list[int]:
        return self.hosts.pids(self.alias_of[node])

    def processes(self, node: str) -> list[str]:
        """Command lines of every process on ``node`` (but its sshd listener)."""
        out = []
        for pid in self.pids(node):
            with contextlib.suppress(psutil.Error):
                out.append(" ".join(psutil.Process(pid).cmdline()) or psutil.Process(pid).name())
        return out

    def ours(self, node: str) -> list[str]:
        """Processes on ``node`` that a tfdist_nb cluster started: actors and kernels."""
        return [cmd for cmd in self.processes(node) if any(word in cmd for word in OURS)]

    def raylet_pid(self, node: str) -> int:
        for pid in self.pids(node):
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).name() == "raylet":
                    return pid
        raise RayClusterError(f"no raylet on {node}")

    def client_server_logs(self, tail: int = 3000) -> str:
        """The head's Ray Client server logs: the proxy's on port 10001 and each connection's
        own ("specific") server's, ``ray_client_server_230NN.err``: why a connection failed."""
        logs = sorted((self.short_dir / self.head.rpartition(".")[2]).glob(
            "session_latest/logs/ray_client_server*.err"))
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-tail:]}" for p in logs)

    def log(self, node: str) -> str:
        path = self.workdir / f"ray-{node}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_node(self, node: str) -> None:
        """``ray start --block`` on ``node`` (the head first); returns once it has joined."""
        head = node == self.head
        argv = [self.ray, "start", "--block", f"--node-ip-address={node}", "--num-cpus=1",
                "--num-gpus=0", f"--object-store-memory={OBJECT_STORE_BYTES}",
                f"--temp-dir={self.short_dir / node.rpartition('.')[2]}",
                "--disable-usage-stats",
                # fixed agent ports (each node has its own network namespace): with dynamic
                # ones the raylet waits at most 15 s for the agents to write them, which a
                # loaded 2-core machine misses ("Timed out waiting for file ...agent_port")
                *(f"--{flag}={port}" for flag, port in AGENT_PORTS.items())]
        argv += (["--head", f"--port={GCS_PORT}", "--include-dashboard=false",
                  f"--ray-client-server-port={CLIENT_PORT}"] if head
                 else [f"--address={self.head}:{GCS_PORT}"])
        netns = self.hosts.namespaces[self.alias_of[node]]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(self.auth, RAY_USAGE_STATS_ENABLED="0")
        with open(self.workdir / f"ray-{node}.out", "ab") as out:
            self._blocks[node] = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{netns}", *argv], stdin=subprocess.DEVNULL,
                stdout=out, stderr=out, start_new_session=True, env=env)
        port = CLIENT_PORT if head else None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not self._joined(node, port):
            if self._blocks[node].poll() is not None or time.monotonic() > deadline:
                raise RayClusterError(f"ray start on {node} did not come up: "
                                      + self.log(node)[-3000:])
            time.sleep(0.2)

    def _joined(self, node: str, port: int | None) -> bool:
        if "Ray runtime started" not in self.log(node):
            return False
        if port is None:
            return True
        try:
            socket.create_connection((node, port), 1).close()
        except OSError:
            return False
        return True

    def kill_raylet(self, node: str) -> int:
        """SIGKILL the raylet of ``node``, as when a node is lost; its ``ray start --block``
        then ends the rest of the node's Ray processes."""
        pid = self.raylet_pid(node)
        os.kill(pid, 9)
        return pid

    def remove(self) -> None:
        """End every process on the nodes and remove the hosts. Safe to call twice."""
        if self._removed:
            return
        for proc in self._blocks.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self._blocks.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.hosts.remove()  # whatever is left in the namespaces: SIGTERM, then SIGKILL
        shutil.rmtree(self.short_dir, ignore_errors=True)
        with contextlib.suppress(Exception):
            atexit.unregister(self.remove)
        self._removed = True


def make_ray(workdir: Path, nodes: int = 2, ray: str | None = None) -> RayCluster:
    """A head and ``nodes - 1`` worker nodes on fake hosts, each running ``ray`` (default:
    the notebook's Ray); removed on failure and at exit."""
    reason = available()
    if reason:
        raise RayClusterError(reason)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    hosts = remote_hosts.make_hosts(nodes, workdir / "hosts")
    cluster = RayCluster(hosts=hosts, workdir=workdir, ray=ray or ray_bin(),
                         nodes=[hosts.addresses[a] for a in hosts.aliases],
                         alias_of={hosts.addresses[a]: a for a in hosts.aliases})
    atexit.register(cluster.remove)  # removes the hosts too, also after a failed start
    try:
        for node in cluster.nodes:
            cluster.start_node(node)
    except BaseException:
        cluster.remove()
        raise
    return cluster
