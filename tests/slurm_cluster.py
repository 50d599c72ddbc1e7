"""A real SLURM cluster for the SLURM launcher's tests: Debian's slurmctld, slurmd and munge on
the network-namespace hosts of ``tests/remote_hosts.py``.

Why: the launcher has to be tested against SLURM itself (``sbatch``'s refusals, ``squeue``
states and reasons, ``scancel``, tasks placed on two nodes), not a stand-in. Each node is one of
the fake hosts (a network namespace on a private bridge, file system and Python shared with the
test process, so the connection directory is "on a shared file system"); ``slurmd -D -N ADDR``
runs in it through ``nsenter --net`` (``ip netns exec`` remounts /sys, and slurmd 22.05 then
fails its cgroup set-up). ``slurmctld`` runs in the first node's namespace, so no SLURM port is
opened on this machine's own interfaces. Node names are their addresses so TensorFlow resolves
them. munged is this cluster's own: its own key and socket in ``workdir`` (slurm.conf points at
it with ``AuthInfo``), never ``/etc/munge`` or the system's socket.

Everything the cluster needs is in ``workdir`` (slurm.conf, munge key and socket, state, spool
and logs); ``env`` is what SLURM's tools take (``SLURM_CONF``). ``remove()`` cancels every job,
stops the daemons and removes the hosts: nothing is left running. Needs root, iproute2, nsenter
and the Debian packages ``slurmctld slurmd slurm-client munge``; ``available()`` says why not and
``require_available()`` turns that into a skip, or a failure under CI (as remote_hosts does).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests import remote_hosts

SLURMCTLD = Path("/usr/sbin/slurmctld")
SLURMD = Path("/usr/sbin/slurmd")
MUNGED = Path("/usr/sbin/munged")
CLIENT_TOOLS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")
PARTITION = "debug"
_READY_TIMEOUT_S = 30.0


class SlurmError(RuntimeError):
    """The SLURM cluster could not be made or removed (the message has the daemon's log)."""


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """None if a SLURM cluster can be made here, else why not (a reason for ``pytest.skip``)."""
    reason = remote_hosts.available()
    if reason is not None:
        return reason
    for path, package in ((SLURMCTLD, "slurmctld"), (SLURMD, "slurmd"), (MUNGED, "munge")):
        if not os.access(path, os.X_OK):
            return f"{path} not found (apt-get install {package})"
    for tool in CLIENT_TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install slurm-client)"
    if shutil.which("nsenter") is None:
        return "nsenter not found (apt-get install util-linux)"
    return None


def require_available() -> None:
    """Skip the calling test when a SLURM cluster cannot be made here, saying why; under CI
    fail instead, so a runner without SLURM does not pass by skipping every SLURM test."""
    reason = available()
    if reason is None:
        return
    if remote_hosts.in_ci():
        pytest.fail(f"CI: a test SLURM cluster cannot be made here: {reason}")
    pytest.skip(f"a test SLURM cluster cannot be made here: {reason}")


@dataclass(eq=False)
class SlurmCluster:
    """A running SLURM cluster made by ``make_slurm``; ``remove()`` ends it (idempotent).

    ``nodes`` are the node names, which are their addresses, in host order; ``alias_of`` maps a
    node to its fake host alias (for ``hosts.pids``); ``env`` has ``SLURM_CONF``.
    """

    __test__ = False

    hosts: remote_hosts.TestHosts
    workdir: Path
    conf: Path
    nodes: list[str] = field(default_factory=list)
    alias_of: dict[str, str] = field(default_factory=dict)
    _daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _removed: bool = field(default=False, repr=False)

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def tool(self, *argv: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client tool (sbatch, squeue, ...) against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False,
                              env={**os.environ, **self.env})

    def jobs(self) -> list[str]:
        """``JOBID STATE REASON`` of every job squeue lists (pending, running, completing)."""
        out = self.tool("squeue", "-h", "-o", "%i %T %r").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def node_pids(self, node: str) -> list[int]:
        """PIDs in the node's namespace but its daemons (slurmd, slurmctld and its slurmscriptd,
        sshd): job steps (slurmstepd) and whatever they started."""
        daemons = {p.pid for p in self._daemons.values()}
        with contextlib.suppress(psutil.Error, KeyError):
            ctld = psutil.Process(self._daemons["slurmctld"].pid)
            daemons |= {c.pid for c in ctld.children(recursive=True)}
        return [pid for pid in self.hosts.pids(self.alias_of[node]) if pid not in daemons]

    def daemon_log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill_node(self, node: str) -> None:
        """The node dies: every process in its namespace (slurmd, job steps, tasks) SIGKILLed."""
        import signal

        for pid in self.hosts.pids(self.alias_of[node]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def restart_slurmd(self, node: str) -> None:
        """Start the node's slurmd again (after ``kill_node``) and wait until it answers."""
        old = self._daemons.get(f"slurmd-{node}")
        if old is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                old.wait(timeout=5)
        log = self.workdir / f"slurmd-{node}.log"
        offset = log.stat().st_size if log.exists() else 0
        _nsenter(self, node, [str(SLURMD), "-D", "-N", node], f"slurmd-{node}")
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while "started on" not in self.daemon_log(f"slurmd-{node}")[offset:]:
            if self._daemons[f"slurmd-{node}"].poll() is not None or time.monotonic() > deadline:
                raise SlurmError(f"slurmd of {node} did not come back: "
                                 + self.daemon_log(f"slurmd-{node}")[offset:][-2000:])
            time.sleep(0.1)

    def remove(self) -> None:
        """Cancel every job, stop the daemons and munged, remove the hosts. Safe to call twice."""
        if self._removed:
            return
        errors = []
        if self._daemons.get("slurmctld") and self._daemons["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.tool("scancel", "--signal=KILL", "--full", f"--partition={PARTITION}",
                          timeout=10)
                self.tool("scancel", f"--partition={PARTITION}", timeout=10)
        for name in sorted(self._daemons, key=lambda n: n == "munged"):  # munged last
            proc = self._daemons[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        try:
            self.hosts.remove()  # also ends job steps and tasks left in the namespaces
        except remote_hosts.HostsError as exc:
            errors.append(str(exc))
        with contextlib.suppress(Exception):
            atexit.unregister(self.remove)
        self._removed = not errors
        if errors:
            raise SlurmError("; ".join(errors))


def _write_munge_key(path: Path) -> None:
    """32 random bytes, root-only: munged refuses a key that others can read."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))


def _start_munged(cluster: SlurmCluster) -> Path:
    wd = cluster.workdir
    mdir = wd / "munge"
    mdir.mkdir(mode=0o700, exist_ok=True)
    key, sock = mdir / "munge.key", mdir / "munge.socket"
    _write_munge_key(key)
    with open(wd / "munged.out", "ab") as out:
        cluster._daemons["munged"] = subprocess.Popen(
            [str(MUNGED), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={mdir / 'munged.pid'}", f"--log-file={wd / 'munged.log'}",
             f"--seed-file={mdir / 'munged.seed'}"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    deadline = time.monotonic() + 10
    while not sock.exists():
        if cluster._daemons["munged"].poll() is not None or time.monotonic() > deadline:
            raise SlurmError("munged did not start: "
                             + (wd / "munged.out").read_text(errors="replace")
                             + cluster.daemon_log("munged"))
        time.sleep(0.05)
    return sock


def _slurm_conf(cluster: SlurmCluster, munge_socket: Path, controller: str) -> str:
    wd = cluster.workdir
    lines = [
        f"# Test SLURM cluster on bridge {cluster.hosts.bridge} (tests/slurm_cluster.py)",
        "ClusterName=tfdisttest",
        # slurmctld recognises itself by host name; every namespace shares this one
        f"SlurmctldHost={socket.gethostname()}({controller})",
        "SlurmctldPort=6817",
        "SlurmdPort=6818",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={wd / 'state'}",
        f"SlurmdSpoolDir={wd / 'spool-%n'}",
        f"SlurmctldPidFile={wd / 'slurmctld.pid'}",
        f"SlurmdPidFile={wd / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={wd / 'slurmctld.log'}",
        f"SlurmdLogFile={wd / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MpiDefault=none",
        "InactiveLimit=0",
        "KillWait=5",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for node in cluster.nodes:
        lines.append(f"NodeName={node} NodeAddr={node} CPUs=2 State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _nsenter(cluster: SlurmCluster, node: str, argv: list[str], name: str) -> None:
    netns = cluster.hosts.namespaces[cluster.alias_of[node]]
    with open(cluster.workdir / f"{name}.out", "ab") as out:
        cluster._daemons[name] = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{netns}", *argv], stdin=subprocess.DEVNULL,
            stdout=out, stderr=out, start_new_session=True, env={**os.environ, **cluster.env})


def _wait_idle(cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while True:
        for name, proc in cluster._daemons.items():
            if proc.poll() is not None:
                raise SlurmError(f"{name} exited ({proc.returncode}): "
                                 + (cluster.workdir / f"{name}.out").read_text(errors="replace")
                                 + cluster.daemon_log(name)[-3000:])
        out = cluster.tool("sinfo", "-h", "-N", "-o", "%N %t").stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        if all(states.get(n) == "idle" for n in cluster.nodes):
            return
        if time.monotonic() > deadline:
            raise SlurmError(f"nodes not idle after {_READY_TIMEOUT_S:.0f}s: {states}; "
                             + cluster.daemon_log("slurmctld")[-3000:])
        time.sleep(0.1)


def make_slurm(workdir: Path, n_nodes: int = 2) -> SlurmCluster:
    """A SLURM cluster of ``n_nodes`` nodes (2 CPUs each) in one partition, ``debug``; its
    files in ``workdir``. On failure it removes what it made and re-raises; a cluster that
    started is also removed at interpreter exit."""
    reason = available()
    if reason:
        raise SlurmError(reason)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    hosts = remote_hosts.make_hosts(n_nodes, workdir / "hosts")
    cluster = SlurmCluster(hosts=hosts, workdir=workdir, conf=workdir / "slurm.conf")
    try:
        for alias in hosts.aliases:
            node = hosts.addresses[alias]
            cluster.nodes.append(node)
            cluster.alias_of[node] = alias
        (workdir / "state").mkdir(mode=0o700, exist_ok=True)
        munge_socket = _start_munged(cluster)
        cluster.conf.write_text(_slurm_conf(cluster, munge_socket, cluster.nodes[0]))
        _nsenter(cluster, cluster.nodes[0], [str(SLURMCTLD), "-D", "-i"], "slurmctld")
        for node in cluster.nodes:
            _nsenter(cluster, node, [str(SLURMD), "-D", "-N", node], f"slurmd-{node}")
        _wait_idle(cluster)
    except BaseException:
        with contextlib.suppress(Exception):
            cluster.remove()
        raise
    atexit.register(cluster.remove)
    return cluster
