"""TensorFlow server ports for tasks on this machine, remembered so two clusters here never
share one (:mod:`tfdist_nb.portpick` draws them)."""

from __future__ import annotations

import random
import threading

from tfdist_nb.portpick import bindable, draw

__all__ = ["bindable", "release", "reserve"]

_lock = threading.Lock()
_held: set[int] = set()


def reserve(n: int, avoid: set[int] | frozenset[int] = frozenset(),
            rng: random.Random | None = None) -> list[int]:
    """``n`` distinct ports, bindable on all addresses right now, held until :func:`release`."""
    with _lock:
        chosen = draw(n, avoid=_held | set(avoid), rng=rng)
        _held.update(chosen)
    return chosen


def release(ports: list[int]) -> None:
    with _lock:
        _held.difference_update(ports)
