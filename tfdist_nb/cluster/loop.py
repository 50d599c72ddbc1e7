"""The one async→sync bridge: a private event loop on a daemon thread that lives as long as the
process. The notebook's own loop is busy running the cell, so the cluster drives jupyter_client's
async API on this thread and the caller waits on concurrent futures with deadlines.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import TypeVar

T = TypeVar("T")
#: a coroutine the loop runs: it is sent None and its yields go to asyncio alone
Job = Coroutine[object, None, T]


class LoopThread:
    def __init__(self, name: str = "tfdist-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def submit(self, coro: Job[T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Job[T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait at most ``timeout`` seconds for its result."""
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"gave up after {timeout:.0f}s") from None

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        self.loop.call_soon_threadsafe(fn, *args)


async def gather(*coros: Awaitable[T]) -> list[T]:
    """``asyncio.gather`` as a coroutine, created on the loop thread (for ``LoopThread.run``)."""
    return list(await asyncio.gather(*coros))
