"""Hands a running cell's events from the loop thread to the caller's thread.

The notebook shows output only from the thread running the cell, so the loop thread queues each
batch and the caller drains the queue until the run's future is done. The user's interrupt
(KeyboardInterrupt in the caller) ends the run for every task instead of leaving them behind.
"""

from __future__ import annotations

import concurrent.futures
import queue
from collections.abc import Callable
from typing import Any

from tfdist_nb.events import Event

RUN_DONE = object()  # queued when the run's future completes, so the wait below wakes at once


def relay(events: queue.SimpleQueue[Any], on_event: Callable[[Event], None] | None,
          fut: concurrent.futures.Future[Any], interrupt: Callable[[], None],
          alive: Callable[[], bool]) -> None:
    while True:
        try:
            batch = events.get(timeout=0.5)
        except queue.Empty:
            if fut.done() or not alive():
                return
            continue
        except KeyboardInterrupt:
            interrupt()
            continue
        if batch is RUN_DONE:
            return
        if on_event is not None:
            for one in batch:
                on_event(one)
