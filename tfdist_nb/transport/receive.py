"""Reading a task's kernel channels a burst at a time.

jupyter_client's asyncio channels wait for each message with two futures (a poll, then a
receive). At 1,024 tasks, with a heartbeat a second from each, that path was most of the
controller's CPU, idle or releasing a hang (docs/performance.md, "The controller at 1,024
tasks"). :func:`bursts` waits once, then reads every message already waiting without a future.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

#: messages read in one go before the other sockets get the loop
BURST = 256
logger = logging.getLogger(__name__)


async def bursts(client: Any, which: str) -> AsyncIterator[list[dict[str, Any]]]:
    """The messages of ``client``'s ``which`` channel ("iopub", "shell") as they arrive: one
    wait for the socket (pyzmq's future, on whatever loop runs the caller), then every message
    already waiting read at once through the same signed ``Session``. A client whose channel is
    not a zmq.asyncio socket (the fake launcher's) is read a message at a time."""
    ready = getattr(getattr(client, f"{which}_channel", None), "socket", None)
    if not isinstance(ready, zmq.asyncio.Socket):
        get = getattr(client, f"get_{which}_msg")
        while True:
            yield [await get()]
    drain = zmq.Socket.shadow(ready.underlying)  # the same socket, read without futures
    session = client.session
    while True:
        await ready.poll()  # readable (POLLIN)
        burst: list[dict[str, Any]] = []
        while len(burst) < BURST and int(drain.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = drain.recv_multipart(zmq.NOBLOCK)
            try:
                burst.append(session.deserialize(session.feed_identities(frames)[1]))
            except Exception:  # unsigned or malformed: dropped and said; the channel goes on
                logger.warning("tfdist_nb: dropped a bad %s message from a task", which)
        yield burst
        await asyncio.sleep(0)  # the other tasks' channels between two bursts
