"""Who can reach a cluster's TensorFlow ports. TensorFlow's gRPC server binds every interface
whatever TF_CONFIG says and takes any request unauthenticated (docs/security.md, "What
TensorFlow itself opens"). A local cluster's tasks share the controller's network namespace, so
their sockets are read here; remote tasks' tables are on their hosts, so there the line follows
what the tasks did (a strategy started, a parameter-server cluster's servers).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tfdist_nb import host_os
from tfdist_nb.strenum import StrEnum

if TYPE_CHECKING:
    from tfdist_nb.cluster.task import TaskRuntime
    from tfdist_nb.launchers.base import Launcher
    from tfdist_nb.store.tails import LiveStore


class Scope(StrEnum):
    """How a listening socket is bound: who can reach it (docs/security.md, "What TensorFlow
    itself opens")."""

    EVERY_INTERFACE = "every interface"  # 0.0.0.0 or ::, what TensorFlow's server binds
    LOOPBACK = "loopback"
    ONE_ADDRESS = "one address"


def listening(sockets: Iterable[tuple[str, int]]) -> dict[int, set[Scope]]:
    """Listening TCP ports and how each is bound, ``{20001: {Scope.EVERY_INTERFACE}}``, from
    ``(address, port)`` pairs (:func:`tfdist_nb.host_os.tcp_listeners`)."""
    found: dict[int, set[Scope]] = {}
    for address, port in sockets:
        ip = ipaddress.ip_address(address)
        ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:127.0.0.1 is loopback too
        found.setdefault(port, set()).add(Scope.EVERY_INTERFACE if ip.is_unspecified else
                                          Scope.LOOPBACK if ip.is_loopback else
                                          Scope.ONE_ADDRESS)
    return found


def exposed(ports: dict[str, int], sockets: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The tasks (of ``ports``, task -> its TF port) whose port listens on every interface."""
    bound = listening(sockets)
    return {task: port for task, port in ports.items()
            if Scope.EVERY_INTERFACE in bound.get(port, set())}


def describe(open_ports: dict[str, int]) -> str:
    """The one line said about a local cluster's exposed ports (task -> port)."""
    return _line({t: f"port {p}" for t, p in open_ports.items()}, "this host", "you", "your")


def _line(named: dict[str, str], host: str, user: str, whose: str) -> str:
    tasks = ", ".join(f"{task} ({where})" for task, where in sorted(named.items()))
    return (f"TensorFlow's gRPC server of {tasks} listens on every interface of {host}, "
            f"without authentication: whoever can reach {host} on that port can run TensorFlow "
            f"ops in the task as {user} (read and write {whose} files). Keep the hosts on a "
            "private network or firewall those ports to the cluster's own hosts; "
            "docs/security.md, 'What TensorFlow itself opens'")


def open_ports(tasks: Iterable[TaskRuntime]) -> dict[str, int]:
    """Of local ``tasks`` with a process, those whose TF port listens on every interface of
    this host now (task -> port)."""
    mine = [rt for rt in tasks
            if rt.handle is not None and rt.address.rpartition(":")[2].isdigit()]
    ports = {rt.name: int(rt.address.rpartition(":")[2]) for rt in mine}
    pids = [rt.pid for rt in mine if rt.pid is not None]
    return exposed(ports, host_os.tcp_listeners(pids)) if ports else {}


class SaidOnce:
    """A set of exposed ports is said once (a restart onto fresh ports is said again)."""

    def __init__(self) -> None:
        self._said: frozenset[tuple[str, int | str]] = frozenset()

    def first_time(self, found: Mapping[str, int | str]) -> bool:
        key = frozenset(found.items())
        if not found or key <= self._said:
            return False
        self._said |= key
        return True


def local_exposure(launcher: Launcher, tasks: Iterable[TaskRuntime]) -> dict[str, int]:
    """``open_ports`` for a local launcher's tasks; none for a remote one (``exposure_line``
    says what its tasks serve) or a confined one (the ports are in the tasks' netns)."""
    if launcher.remote or launcher.confined:
        return {}
    return open_ports(tasks)


def exposure_line(said: SaidOnce, launcher: Launcher, tasks: Iterable[TaskRuntime],
                  has_ps: bool, live: LiveStore | None) -> str | None:
    """The line naming the exposed TF ports of a cluster's tasks the first time ``said`` sees
    this set of them (``live``: the cluster's live store, for remote tasks), else None."""
    if launcher.remote:
        # remote tasks whose TF server runs (task -> TF_CONFIG address): a strategy's start-up
        # completed in their ledger, or a parameter-server cluster's ps and workers, which
        # serve from their start
        serving = {}
        for rt in list(tasks):
            if rt.handle is None or live is None:
                continue
            rows = live.view(rt.name).ledger.recent()
            if (has_ps and rt.task.role in ("ps", "worker")) or any(
                    r.get("kind") == "startup" and r.get("state") == "done" for r in rows):
                serving[rt.name] = rt.address
        if not said.first_time(serving):
            return None
        return _line(serving, "its host", "the user it runs as", "its")
    if not said.first_time(open_now := local_exposure(launcher, tasks)):
        return None
    line = describe(open_now)
    if why := launcher.why_not_confined:
        line += f". They are not confined to a private network: {why}"
    return line
