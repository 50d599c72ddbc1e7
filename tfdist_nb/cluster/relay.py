"""Hands a running cell's events, and the tasks' questions in order with them, from the loop
thread to the caller's thread: the notebook shows output only from the thread running the cell.
The user's interrupt there ends the run for every task instead of leaving them behind.
"""

from __future__ import annotations

import concurrent.futures
import queue
from collections.abc import Callable
from typing import Any

from tfdist_nb.events import Event
from tfdist_nb.transport.channel import Prompt

RUN_DONE = object()  # queued when the run's future completes, so the wait below wakes at once


def relay(events: queue.SimpleQueue[Any], on_event: Callable[[Event], None] | None,
          fut: concurrent.futures.Future[Any], interrupt: Callable[[], None],
          alive: Callable[[], bool], ask: Callable[[Prompt], None] | None = None) -> None:
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
        if isinstance(batch, Prompt):
            if ask is not None and batch.open:
                try:
                    ask(batch)
                except KeyboardInterrupt:  # at the question: the cell is interrupted
                    interrupt()
            continue
        if on_event is not None:
            for one in batch:
                on_event(one)
