"""Tasks whose process ends while no cell runs on them, marked dead and said as an alert.
During a cell the runner notices an exit itself; between cells nothing else would, and the
dashboard would show a dead task as idle until the next cell failed on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from tfdist_nb.cluster.state import TaskEvent, TaskState
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.debuglog import swallowed
from tfdist_nb.launchers.base import NetTrouble
from tfdist_nb.topology import TaskId

logger = logging.getLogger(__name__)

WATCH_S = 1.0


class ExitWatch:
    """Says an idle task's exit, waiting on its exit future and looking again every ``WATCH_S``
    for tasks that became idle. ``network``: the launcher's ``network_trouble``, looked at as
    often, so the tasks' outbound network going (slirp4netns ending) is said once."""

    def __init__(self, tasks: dict[TaskId, TaskRuntime],
                 note: Callable[[str, str, str], None],
                 network: Callable[[], NetTrouble | None] = lambda: None) -> None:
        self._tasks = tasks
        self._note = note
        self._network = network
        self._trouble_said: NetTrouble | None = None
        self._job: asyncio.Future[None] | None = None

    def start(self) -> None:
        if self._job is None or self._job.done():
            self._job = asyncio.ensure_future(self._watch())

    async def close(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError), swallowed(logger):
                await job

    async def _watch(self) -> None:
        while True:
            exits = [rt.handle.exit_future() for rt in list(self._tasks.values())
                     if rt.state is TaskState.IDLE and rt.handle is not None]
            if exits:
                await asyncio.wait(exits, timeout=WATCH_S, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(WATCH_S)
            for rt in list(self._tasks.values()):  # an idle task whose process is gone
                handle = rt.handle
                if (rt.state is not TaskState.IDLE or handle is None
                        or (code := handle.exited()) is None):
                    continue
                rt.transition(TaskEvent.EXITED)
                what = await asyncio.to_thread(handle.describe_exit, code)
                self._note(rt.name, f"{rt.name} {what} while no cell was running on it; bring it "
                           "back with %tfdist_restart (its process log is in the run directory)",
                           "ERROR")
            # a sudden loss of the tasks' outbound network, said once (again only after a cure)
            with swallowed(logger):
                trouble = self._network()
                if trouble is not None and trouble.sudden and trouble != self._trouble_said:
                    self._note("cluster", f"{trouble.cause}; the tasks have no outbound network "
                               f"now (downloads and DNS fail): {trouble.cure}", "ERROR")
                self._trouble_said = trouble
