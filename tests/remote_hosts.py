"""Fake remote hosts for SSH launcher tests: network namespaces on a private bridge, real sshd.

Why: an SSH launcher has to be tested against real OpenSSH (key auth, ProxyJump, a host that is
down, a connection that is lost) without real machines. Each fake host is a network namespace
with its own address on a bridge that only this set of hosts uses, and runs Debian's sshd on port
2222 of that address. File system, users and Python are shared with the test process, so
``sys.executable`` works "remotely" too.

Nothing is routed, NATed or forwarded past the bridge (no default route inside, iptables is not
touched). Needs root, iproute2, openssh-client and openssh-server; ``available()`` says why not,
and ``require_available()`` turns that into a skip, or a failure under CI.

The hosts' aliases live in their own ``workdir/ssh_config`` (given to ssh with ``-F``, or to the
launcher with ``ssh_config=`` / ``$TFDIST_SSH_CONFIG``), with its own known_hosts: nothing here
reads or writes the user's ``~/.ssh``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

SSHD = Path("/usr/sbin/sshd")
PORT = 2222
ALIAS_PREFIX = "tfdhost"
DOWN_ALIAS = "tfdhost-down"
JUMP_SUFFIX = "-via-jump"
_HOST_OFFSET = 10  # host i (1-based) gets .(i + 10)
_DOWN_HOST = 250  # an address in the subnet where nothing answers
_MAX_HOSTS = 200
_PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without its privilege separation dir


class HostsError(RuntimeError):
    """Setting up or tearing down the fake hosts failed (the message has the command's stderr)."""


def _run(argv: list[str], check: bool = True,
         timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a setup command; with ``check``, fail with its stderr rather than a bare exit code."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)
    if check and proc.returncode != 0:
        raise HostsError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """None if fake hosts can be made here, else why not (a reason for ``pytest.skip``).

    Probes by making and deleting a namespace and a bridge: root alone is not enough in an
    unprivileged container or without the bridge module.
    """
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "fake SSH hosts need root (network namespaces, a bridge)"
    for tool, package in (("ip", "iproute2"), ("ssh", "openssh-client"),
                          ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install {package})"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found (apt-get install openssh-server)"
    token = secrets.token_hex(2)
    netns, bridge = f"tfdp{token}", f"tfdbp{token}"
    try:
        _ip("netns", "add", netns)
        _ip("link", "add", bridge, "type", "bridge")
    except (HostsError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot make a network namespace and a bridge here: {exc}"
    finally:
        _ip("netns", "del", netns, check=False)
        _ip("link", "del", bridge, check=False)
    return None


def in_ci() -> bool:
    """True under a CI service (``CI=true``, as GitHub Actions, GitLab and most others set)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_available() -> None:
    """Skip the calling test when fake hosts cannot be made here, saying why; under CI fail
    instead, so a runner that lost its privileges does not pass by skipping every remote test."""
    require(available(), "SSH test hosts")


def require(reason: str | None, what: str) -> None:
    """Skip saying why ``what`` cannot be made here (``reason``; None: it can), or fail under
    CI (tests/ray_cluster.py too)."""
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"CI: {what} cannot be made here: {reason}")
    pytest.skip(f"{what} cannot be made here: {reason}")


_LIVE: list[TestHosts] = []  # sets made and not yet removed, for the leak check


@contextlib.contextmanager
def fake_hosts(n: int, workdir: Path, home: Path | None = None) -> Iterator[TestHosts]:
    """``make_hosts`` for a test or fixture: skipped (failed under CI) where hosts cannot be
    made, removed afterwards whatever happens."""
    require_available()
    made = make_hosts(n, workdir, home)
    try:
        yield made
    finally:
        made.remove()


def namespace_ids() -> set[tuple[int, int]]:
    """(device, inode) of the network namespace of every fake host still up in this process:
    a process whose ``/proc/PID/ns/net`` has one of them runs "on" one of this run's hosts."""
    ids = set()
    for hosts in list(_LIVE):
        for netns in hosts.namespaces.values():
            if netns not in hosts._deleted:
                with contextlib.suppress(OSError):
                    st = os.stat(f"/run/netns/{netns}")
                    ids.add((st.st_dev, st.st_ino))
    return ids


@dataclass(eq=False)
class TestHosts:
    """A set of fake hosts made by ``make_hosts``; ``remove()`` tears it down (idempotent).

    ``aliases`` are the Host names in ``ssh_config`` (``tfdhost1``...); ``addresses`` and
    ``namespaces`` map an alias to its IP and network namespace. ``ssh_config`` also has
    ``<last alias>-via-jump`` (ProxyJump through the first host) and ``tfdhost-down``.
    """

    __test__ = False  # a helper, not a pytest test class

    aliases: list[str]
    addresses: dict[str, str]
    namespaces: dict[str, str]
    ssh_config: Path
    bridge: str
    subnet: str
    workdir: Path
    home: Path | None = None  # HOME of ssh sessions; None: the account's own (/root)
    token: str = ""
    veths: list[str] = field(default_factory=list)
    jump_alias: str = ""
    down_alias: str = DOWN_ALIAS
    _sshd: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _own_bridge: bool = field(default=False, repr=False)
    _deleted: set[str] = field(default_factory=set, repr=False)  # namespaces and veths

    def ssh_argv(self, alias: str, command: str, *options: str) -> list[str]:
        """The ssh command line for ``alias`` (for Popen); ``options`` go before the alias."""
        return ["ssh", "-F", str(self.ssh_config), *options, "--", alias, command]

    def ssh(self, alias: str, command: str, timeout: float = 20,
            options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``alias`` through its remote shell; stdin is /dev/null."""
        return subprocess.run(self.ssh_argv(alias, command, *options), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)

    def sshd_pid(self, alias: str) -> int:
        """PID of the listening sshd of ``alias`` (``ip netns exec`` execs it, same PID)."""
        proc = self._sshd.get(alias)
        if proc is None or proc.poll() is not None:
            raise HostsError(f"no sshd running for {alias}")
        return proc.pid

    def pids(self, alias: str) -> list[int]:
        """PIDs of every process in the namespace of ``alias`` but its listening sshd:
        per-connection sshd processes and whatever was started over ssh."""
        listener = self._sshd.get(alias)
        return [pid for pid in _netns_pids(self.namespaces[alias])
                if listener is None or pid != listener.pid]

    def drop_connections(self, alias: str, timeout: float = 10) -> list[int]:
        """Kill the per-connection sshd processes of ``alias`` (SIGKILL), keep its listener.

        The ssh clients connected to it end with exit 255, as on a lost connection. Commands
        they started keep running (no pty, so no SIGHUP), as on a real host; ``remove()`` or
        the test ends them. Returns the PIDs killed, once they are gone.
        """
        listener = psutil.Process(self.sshd_pid(alias))
        victims = []
        for child in listener.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.name().startswith("sshd"):  # sshd, or sshd-session on OpenSSH >= 9.8
                    child.kill()
                    victims.append(child)
        _, alive = psutil.wait_procs(victims, timeout=timeout)
        if alive:
            raise HostsError(f"sshd connection processes of {alias} survived SIGKILL: {alive}")
        return [p.pid for p in victims]

    def remove(self) -> None:
        """Kill every process in the namespaces, delete namespaces, veths and bridge.

        Safe to call twice and after a partial ``make_hosts``: it only deletes what this set
        created, and leaves the files in ``workdir`` (keys, configs, sshd logs) for debugging.
        """
        errors = []
        # What is deleted is never touched again: a later set may reuse the name.
        live = [ns for ns in self.namespaces.values() if ns not in self._deleted]
        for netns in live:
            try:
                _kill_netns(netns)
            except HostsError as exc:
                errors.append(str(exc))
        for proc in self._sshd.values():
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for netns in live:
            if netns in _netns_names() and _ip("netns", "del", netns, check=False).returncode:
                errors.append(f"could not delete namespace {netns}")
            else:
                self._deleted.add(netns)
        for veth in self.veths:  # normally gone with its namespace already
            if veth in self._deleted:
                continue
            if _link_exists(veth):
                _ip("link", "del", veth, check=False)
            if _link_exists(veth):
                errors.append(f"could not delete veth {veth}")
            else:
                self._deleted.add(veth)
        if self._own_bridge:
            _ip("link", "del", self.bridge, check=False)
            self._own_bridge = _link_exists(self.bridge)
            if self._own_bridge:
                errors.append(f"could not delete bridge {self.bridge}")
        with contextlib.suppress(Exception):
            atexit.unregister(self.remove)
        if self.removed and self in _LIVE:
            _LIVE.remove(self)
        if errors:
            raise HostsError("; ".join(errors))

    @property
    def removed(self) -> bool:
        """True once ``remove()`` has deleted everything this set created."""
        return (not self._own_bridge
                and {*self.namespaces.values(), *self.veths} <= self._deleted)


def _netns_names() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}


def _netns_pids(netns: str) -> list[int]:
    """PIDs in ``netns`` (empty if it does not exist)."""
    proc = _ip("netns", "pids", netns, check=False)
    return [int(pid) for pid in proc.stdout.split()] if proc.returncode == 0 else []


def _link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _kill_netns(netns: str, grace: float = 3, timeout: float = 10) -> None:
    """End everything in ``netns``: SIGTERM, then SIGKILL what is left after ``grace``.

    SIGTERM first because a remote shell killed outright while it runs root's ~/.bashrc can
    leave lock files behind (pyenv's rehash lock makes every later bash wait 60 s).
    """
    _signal_all(_netns_pids(netns), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _netns_pids(netns) and time.monotonic() < deadline:
        time.sleep(0.05)
    deadline = time.monotonic() + timeout
    while pids := _netns_pids(netns):  # sshd may still fork meanwhile
        _signal_all(pids, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise HostsError(f"processes in {netns} survived SIGKILL: {pids}")
        time.sleep(0.05)


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network routed (any table, but default) or on an interface here."""
    nets = []
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        with contextlib.suppress(ValueError, KeyError):
            if route["dst"] != "default":
                nets.append(ipaddress.IPv4Network(route["dst"], strict=False))
    for link in json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]"):
        for addr in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}",
                                              strict=False))
    return nets


def _others_in(net: ipaddress.IPv4Network, bridge: str) -> list[str]:
    """Interfaces but ``bridge`` with an address in ``net`` (a parallel run's pick, say)."""
    found = []
    for link in json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]"):
        for addr in link.get("addr_info", []):
            if link["ifname"] != bridge and ipaddress.IPv4Address(addr["local"]) in net:
                found.append(link["ifname"])
    return found


def _make_bridge(hosts: TestHosts) -> None:
    """A bridge with a fresh token in its name and .1 of a 10.x.y.0/24 nothing else uses."""
    rng = secrets.SystemRandom()
    for _ in range(20):
        token = secrets.token_hex(2)
        bridge = f"tfdbr{token}"
        if _link_exists(bridge) or any(n.startswith(f"tfdh{token}-") for n in _netns_names()):
            continue
        used = _used_networks()
        net = ipaddress.IPv4Network(f"10.{rng.randrange(64, 255)}.{rng.randrange(256)}.0/24")
        if any(net.overlaps(u) for u in used):
            continue
        if _ip("link", "add", bridge, "type", "bridge", check=False).returncode:
            continue  # taken by a parallel run a moment ago
        hosts.bridge, hosts.token, hosts._own_bridge = bridge, token, True
        _ip("addr", "add", f"{net[1]}/{net.prefixlen}", "dev", bridge)
        _ip("link", "set", bridge, "up")
        if _others_in(net, bridge):  # a parallel run picked the same subnet
            _ip("link", "del", bridge)
            hosts._own_bridge = False
            continue
        hosts.subnet = str(net)
        return
    raise HostsError("found no free bridge name and 10.x.y.0/24 subnet in 20 tries")


def _keygen(path: Path, comment: str) -> None:
    """An ed25519 key pair without passphrase at ``path`` (replacing an old one)."""
    for old in (path, path.with_name(path.name + ".pub")):
        old.unlink(missing_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _add_host(hosts: TestHosts, index: int) -> str:
    """Namespace ``tfdh<token>-<index>`` joined to the bridge by a veth, eth0 = .(index+10)."""
    net = ipaddress.IPv4Network(hosts.subnet)
    alias = f"{ALIAS_PREFIX}{index}"
    netns, veth = f"tfdh{hosts.token}-{index}", f"tfdv{hosts.token}-{index}"
    address = str(net[index + _HOST_OFFSET])
    hosts.aliases.append(alias)
    hosts.addresses[alias] = address
    _ip("netns", "add", netns)
    hosts.namespaces[alias] = netns
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    hosts.veths.append(veth)
    _ip("link", "set", veth, "master", hosts.bridge, "up")
    _ip("-n", netns, "addr", "add", f"{address}/{net.prefixlen}", "dev", "eth0")
    _ip("-n", netns, "link", "set", "eth0", "up")
    _ip("-n", netns, "link", "set", "lo", "up")
    return alias


def _sshd_config(hosts: TestHosts, alias: str, index: int) -> Path:
    """This host's sshd_config: its address only, keys only, forwarding on, all in workdir."""
    wd = hosts.workdir
    host_key = wd / f"ssh_host_ed25519_key-{index}"
    _keygen(host_key, f"{alias} host key")
    path = wd / f"sshd_config-{index}"
    path.write_text("\n".join([
        f"# {alias}: network namespace {hosts.namespaces[alias]} (tests/remote_hosts.py)",
        f"Port {PORT}",
        f"ListenAddress {hosts.addresses[alias]}:{PORT}",
        f"HostKey {host_key}",
        f"PidFile {wd / f'sshd-{index}.pid'}",
        f"AuthorizedKeysFile {wd / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",  # workdir is under /tmp, which is world-writable
        "AllowTcpForwarding yes",
        "AllowStreamLocalForwarding yes",
        "StreamLocalBindUnlink yes",
        "X11Forwarding no",
        "PrintMotd no",
        "PrintLastLog no",
        "AcceptEnv LANG LC_*",  # as Debian's default: no TF_CONFIG through SendEnv
        "MaxStartups 100",  # launchers open connections in parallel
        "MaxSessions 100",
        "LogLevel VERBOSE",
        "Subsystem sftp internal-sftp",
        *([f"SetEnv HOME={hosts.home}"] if hosts.home else []),
        "",
    ]))
    return path


def _start_sshd(hosts: TestHosts, alias: str) -> None:
    """``ip netns exec NS sshd -D -e -f CONFIG``, stderr to ``workdir/sshd-<i>.log``."""
    index = hosts.aliases.index(alias) + 1
    config = _sshd_config(hosts, alias, index)
    (hosts.workdir / f"sshd-{index}.pid").unlink(missing_ok=True)
    with open(hosts.workdir / f"sshd-{index}.log", "ab") as log:
        hosts._sshd[alias] = subprocess.Popen(
            ["ip", "netns", "exec", hosts.namespaces[alias], str(SSHD), "-D", "-e",
             "-f", str(config)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def _wait_listening(hosts: TestHosts, alias: str, timeout: float = 20) -> None:
    """Until sshd of ``alias`` accepts TCP on its address; fail with its log if it exits."""
    proc = hosts._sshd[alias]
    index = hosts.aliases.index(alias) + 1
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            log = (hosts.workdir / f"sshd-{index}.log").read_text(errors="replace")
            raise HostsError(f"sshd of {alias} exited ({proc.returncode}): {log.strip()}")
        try:
            socket.create_connection((hosts.addresses[alias], PORT), 1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise HostsError(f"sshd of {alias} not listening after {timeout}s") from None
            time.sleep(0.05)


def _host_block(alias: str, address: str, key: Path, known_hosts: Path,
                connect_timeout: int = 5, jump: str | None = None) -> list[str]:
    lines = [
        f"Host {alias}",
        f"    HostName {address}",
        "    User root",
        f"    Port {PORT}",
        f"    IdentityFile {key}",
        "    IdentitiesOnly yes",
        "    StrictHostKeyChecking no",
        f"    UserKnownHostsFile {known_hosts}",
        "    LogLevel ERROR",
        f"    ConnectTimeout {connect_timeout}",
        "    BatchMode yes",
    ]
    if jump:
        lines.append(f"    ProxyJump {jump}")
    return [*lines, ""]


def _write_ssh_config(hosts: TestHosts, key: Path) -> None:
    """``workdir/ssh_config``: the hosts, ``<last>-via-jump`` and ``tfdhost-down``."""
    known = hosts.workdir / "known_hosts"
    lines = [f"# Fake hosts on bridge {hosts.bridge} ({hosts.subnet}), tests/remote_hosts.py", ""]
    for alias in hosts.aliases:
        lines += _host_block(alias, hosts.addresses[alias], key, known)
    first, last = hosts.aliases[0], hosts.aliases[-1]
    hosts.jump_alias = last + JUMP_SUFFIX
    lines += _host_block(hosts.jump_alias, hosts.addresses[last], key, known, jump=first)
    down = str(ipaddress.IPv4Network(hosts.subnet)[_DOWN_HOST])
    lines += _host_block(DOWN_ALIAS, down, key, known, connect_timeout=3)
    hosts.ssh_config.write_text("\n".join(lines))


def _config_safe(path: Path, what: str) -> Path:
    """``path`` made absolute, refused if the unquoted ssh/sshd config lines would misread it."""
    path = Path(path).resolve()
    if any(c.isspace() or c in "%\"'#" for c in str(path)):
        raise ValueError(f"{what} must not have spaces, quotes, % or # (ssh configs): {path}")
    return path


def make_hosts(n: int, workdir: Path, home: Path | None = None) -> TestHosts:
    """Make ``n`` fake hosts with sshd on port 2222, config and keys in ``workdir``.

    Sessions log in as root with HOME=/root, so root's ~/.bashrc runs for every command (as on
    a real host). ``home`` (created if missing) replaces HOME for hermetic tests: no dotfiles,
    PATH is then sshd's default ``/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin``.

    On any failure it removes what it made and re-raises. A successful set is also removed at
    interpreter exit, in case a test run is interrupted before its ``remove()``.
    """
    if not 1 <= n <= _MAX_HOSTS:
        raise ValueError(f"n must be 1..{_MAX_HOSTS}, got {n}")
    reason = available()
    if reason:
        raise HostsError(reason)
    workdir = _config_safe(workdir, "workdir")
    workdir.mkdir(parents=True, exist_ok=True)
    if home is not None:
        home = _config_safe(home, "home")
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    hosts = TestHosts(aliases=[], addresses={}, namespaces={}, ssh_config=workdir / "ssh_config",
                      bridge="", subnet="", workdir=workdir, home=home)
    _LIVE.append(hosts)
    try:
        _PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        key = workdir / "id_ed25519"
        _keygen(key, "tfdist_nb test client")
        (workdir / "authorized_keys").write_text(key.with_name(key.name + ".pub").read_text())
        (workdir / "known_hosts").unlink(missing_ok=True)
        _make_bridge(hosts)
        for index in range(1, n + 1):
            _add_host(hosts, index)
        for alias in hosts.aliases:
            _start_sshd(hosts, alias)
        for alias in hosts.aliases:
            _wait_listening(hosts, alias)
        _write_ssh_config(hosts, key)
    except BaseException:
        with contextlib.suppress(Exception):
            hosts.remove()
        raise
    atexit.register(hosts.remove)
    return hosts
