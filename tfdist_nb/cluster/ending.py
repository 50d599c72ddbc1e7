"""The one way a kernel this package started ends: a task, a restart's old process, a spare.
The channel is closed first, so nothing waits for a reply on a socket about to go, and a channel
that fails to close never keeps the process alive; then the launcher's stop.
"""

from __future__ import annotations

import logging

from tfdist_nb.debuglog import swallowed
from tfdist_nb.launchers.base import StopReport, TaskHandle
from tfdist_nb.transport.channel import KernelChannel

logger = logging.getLogger(__name__)


async def end_kernel(handle: TaskHandle | None, channel: KernelChannel | None,
                     grace_s: float) -> StopReport | None:
    """Close ``channel``, then stop ``handle`` within ``grace_s``; None without a process."""
    if channel is not None:
        with swallowed(logger):
            await channel.close()
    if handle is None:
        return None
    return await handle.stop(grace_s)
