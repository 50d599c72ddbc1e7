"""Reading a task's kernel channels a burst at a time: jupyter_client waits for each message with
two futures, most of the controller's CPU at 1,024 tasks (docs/performance.md, "The controller at
1,024 tasks"); :func:`bursts` waits once, then reads what is waiting without a future.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

if TYPE_CHECKING:
    from jupyter_client.asynchronous import AsyncKernelClient

#: messages read in one go before the other sockets get the loop
BURST = 256
logger = logging.getLogger(__name__)


async def bursts(client: AsyncKernelClient, which: str,
                 ) -> AsyncIterator[list[dict[str, object]]]:
    """The messages of ``client``'s ``which`` channel ("iopub", "shell"), a burst per wait,
    checked by its signed ``Session``."""
    ready: zmq.asyncio.Socket = getattr(client, f"{which}_channel").socket
    drain = zmq.Socket.shadow(ready.underlying)  # the same socket, read without futures
    session = client.session
    while True:
        await ready.poll()  # readable (POLLIN)
        burst: list[dict[str, object]] = []
        while len(burst) < BURST and int(drain.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = drain.recv_multipart(zmq.NOBLOCK)
            try:
                burst.append(session.deserialize(session.feed_identities(frames)[1]))
            except Exception:  # unsigned or malformed: dropped and said; the channel goes on
                logger.warning("tfdist_nb: dropped a bad %s message from a task", which)
        yield burst
        await asyncio.sleep(0)  # the other tasks' channels between two bursts
