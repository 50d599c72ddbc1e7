"""Choosing TensorFlow server ports that are free now and unlikely to be taken before TF binds.

Ports are drawn at random below the kernel's ephemeral range (where outgoing connections and
``bind(0)`` callers, jupyter_client's kernel ports included, would collide with them), checked by
binding, and remembered for the life of the process so two clusters here never share one. The
worker re-checks its own port at start-up; the core retries on a clash.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_lock = threading.Lock()
_held: set[int] = set()
_LOW = 20000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int, host: str = "0.0.0.0") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def reserve(n: int, avoid: set[int] | frozenset[int] = frozenset(),
            rng: random.Random | None = None) -> list[int]:
    """``n`` distinct ports, bindable on all addresses right now, held until :func:`release`."""
    rng = rng or random.SystemRandom()
    high = max(_ephemeral_low() - 1, _LOW + 1000)
    chosen: list[int] = []
    with _lock:
        for _ in range(50 * n + 100):
            if len(chosen) == n:
                break
            port = rng.randrange(_LOW, high)
            if port in _held or port in avoid or port in chosen:
                continue
            if bindable(port):
                chosen.append(port)
        if len(chosen) < n:
            raise OSError(f"could not find {n} free TCP ports in {_LOW}-{high}")
        _held.update(chosen)
    return chosen


def release(ports: list[int]) -> None:
    with _lock:
        _held.difference_update(ports)
