"""What the host's operating system answers where Linux and macOS differ: the one platform seam.
``/proc`` answers exactly; without it (macOS) psutil does, and each function says what its
fallback lacks (docs/reference.md, "Platforms"). ``PROC`` is the switch the tests point at a
missing path to run the fallbacks on Linux. Stdlib at import: the remote bootstrap imports it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
#: IANA's dynamic ports (macOS's), where outgoing connections live when the host does not say
IANA_EPHEMERAL_LOW = 49152
#: psutil's process statuses as ``/proc/PID/stat`` letters them
_LETTERS = {"running": "R", "sleeping": "S", "disk-sleep": "D", "stopped": "T",
            "tracing-stop": "t", "zombie": "Z", "dead": "X", "idle": "I"}


def has_proc() -> bool:
    return (PROC / "self").is_dir()


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` from the state on (after the command's parentheses)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return []
    return stat[stat.rfind(")") + 2:].split()


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (R, S, D, T stopped, t traced, Z zombie, X dead),
    or None when there is no such process (or, without /proc, not one this user may look at)."""
    if has_proc():
        fields = _stat(pid)
        return fields[0] if fields else None
    import psutil

    try:
        return _LETTERS.get(psutil.Process(pid).status(), "S")
    except psutil.Error:
        return None


def zombie_status(pid: int) -> int | None:
    """The exit code of ``pid`` when it is a zombie, from ``/proc/PID/stat``'s exit_code field
    (Linux 3.5+); else None. Without /proc always None: only the parent's wait could say."""
    fields = _stat(pid) if has_proc() else []
    if len(fields) < 50 or fields[0] != "Z":
        return None
    with contextlib.suppress(ValueError):
        return os.waitstatus_to_exitcode(int(fields[-1]))
    return None


def tcp_table_listeners(text: str) -> list[tuple[str, int]]:
    """``(address, port)`` of each listening socket in ``/proc/net/tcp`` or ``tcp6``'s text
    (addresses in hex, each 32-bit word in host byte order)."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != "0A":  # TCP_LISTEN
            continue
        hexed, _, port = fields[1].partition(":")
        raw = b"".join(int(hexed[i:i + 8], 16).to_bytes(4, sys.byteorder)
                       for i in range(0, len(hexed), 8))
        found.append((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def tcp_listeners(pids: Iterable[int] | None) -> list[tuple[str, int]]:
    """``(address, port)`` of listening TCP sockets: with /proc every one of the host; without,
    those of ``pids`` (psutil), or with ``pids`` None every process's, which takes root on
    macOS (psutil.AccessDenied otherwise, for the caller to read as "cannot tell")."""
    if has_proc():
        return [found for name in ("tcp", "tcp6")
                for found in tcp_table_listeners(_read(PROC / "net" / name))]
    import psutil

    if pids is None:
        return [(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="tcp")
                if c.laddr and c.status == psutil.CONN_LISTEN]
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            # net_connections since psutil 6, connections before (pyproject admits 5.9)
            conns = getattr(proc, "net_connections", None) or proc.connections
            found += [(c.laddr.ip, c.laddr.port) for c in conns(kind="tcp")
                      if c.status == psutil.CONN_LISTEN]
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # no IPv6
        return ""


def umask() -> int:
    """This process's umask, read without changing it where /proc says it (``os.umask`` sets
    it, for a moment, for every thread)."""
    if has_proc():
        for line in _read(PROC / "self" / "status").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def deleted_cwd() -> str:
    """The path of this process's working directory once ``os.getcwd()`` said it is gone (it
    says only "No such file or directory"); without /proc "(unknown)"."""
    try:
        return os.readlink(PROC / "self" / "cwd").removesuffix(" (deleted)")
    except OSError:
        return "(unknown)"


def ephemeral_low() -> int:
    """The lowest port of the kernel's range for outgoing connections (``bind(0)``): Linux's
    ``ip_local_port_range`` (32768 by default), else IANA's 49152 (macOS)."""
    if not has_proc():
        return IANA_EPHEMERAL_LOW
    try:
        return int(_read(PROC / "sys/net/ipv4/ip_local_port_range").split()[0])
    except (ValueError, IndexError):
        return 32768


def boot_id() -> str | None:
    """This boot of this host, which with the hostname tells that a process runs here: Linux's
    boot_id, else the boot time (psutil), alike in every process of one boot."""
    if has_proc():
        return _read(PROC / "sys/kernel/random/boot_id").strip() or None
    import psutil

    with contextlib.suppress(psutil.Error, OSError):
        return f"boot-{psutil.boot_time():.0f}"
    return None


def threads() -> list[int] | None:
    """This process's threads as ``os.setpriority`` targets, or None where a thread id is not
    one: a nice value belongs to a thread on Linux alone (macOS would take it for a pid)."""
    try:
        return [int(tid) for tid in os.listdir(PROC / "self" / "task")]
    except (OSError, ValueError):
        return None


def seqpacket_pairs() -> bool:
    """Whether this host makes ``AF_UNIX`` ``SOCK_SEQPACKET`` socket pairs (Linux: the fork
    server's socket; macOS has none)."""
    kind = getattr(socket, "SOCK_SEQPACKET", None)
    if kind is None:
        return False
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, kind)
    except OSError:
        return False
    ours.close()
    theirs.close()
    return True
