"""Tasks whose process ends while no cell runs on them: found within ``WATCH_S``, marked dead
and said as an alert naming the task and how it ended.

During a cell the runner notices an exit itself (:mod:`.runner`); between cells nothing else
would, and the dashboard would show a dead task as idle until the next cell failed on it
(docs/reference.md, States).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from tfdist_nb.cluster.state import TaskEvent, TaskState
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.topology import TaskId

logger = logging.getLogger(__name__)

WATCH_S = 1.0


class ExitWatch:
    """Polls every idle task's process (cheap for each launcher: a ``waitpid``, the SSH
    process's return code, the SLURM job state already known, an attached kernel's
    heartbeat)."""

    def __init__(self, tasks: dict[TaskId, TaskRuntime],
                 note: Callable[[str, str, str], None]) -> None:
        self._tasks = tasks
        self._note = note
        self._job: asyncio.Future[None] | None = None

    def start(self) -> None:
        if self._job is None or self._job.done():
            self._job = asyncio.ensure_future(self._watch())

    async def close(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            for rt in list(self._tasks.values()):
                await self.check(rt)

    async def check(self, rt: TaskRuntime) -> bool:
        """Whether ``rt`` was found dead now (an idle task whose process is gone)."""
        handle = rt.handle
        if rt.state is not TaskState.IDLE or handle is None:
            return False
        try:
            code = await handle.poll()
        except Exception:  # a launcher that cannot tell now; the next poll asks again
            logger.debug("%s: poll failed", rt.name, exc_info=True)
            return False
        if code is None or rt.state is not TaskState.IDLE or rt.handle is not handle:
            return False  # alive, or a cell / restart / stop took the task meanwhile
        rt.transition(TaskEvent.EXITED)
        what = await asyncio.to_thread(handle.describe_exit, code)
        self._note(rt.name, f"{rt.name} {what} while no cell was running on it; bring it back "
                   "with %tfdist_restart (its process log is in the run directory)", "ERROR")
        return True
