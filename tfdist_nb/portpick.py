"""Drawing TCP ports that are free now and unlikely to be taken before TensorFlow binds them:
at random below the kernel's ephemeral range (where ``bind(0)`` callers would collide), checked
by binding. Stdlib only: the remote bootstrap (``tfdist_nb.worker.remote``) uses it on SSH hosts.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Collection

from tfdist_nb.host_os import ephemeral_low

LOW = 20000


def bindable(port: int, host: str = "0.0.0.0") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def draw(n: int, avoid: Collection[int] = (), rng: random.Random | None = None,
         free: Callable[[int], bool] = bindable) -> list[int]:
    """``n`` distinct ports outside ``avoid`` that ``free`` accepts; OSError if none are left."""
    rng = rng or random.SystemRandom()
    high = max(ephemeral_low() - 1, LOW + 1000)
    chosen: list[int] = []
    for _ in range(50 * n + 100):
        if len(chosen) == n:
            return chosen
        port = rng.randrange(LOW, high)
        if port not in avoid and port not in chosen and free(port):
            chosen.append(port)
    if len(chosen) < n:
        raise OSError(f"could not find {n} free TCP ports in {LOW}-{high}")
    return chosen
