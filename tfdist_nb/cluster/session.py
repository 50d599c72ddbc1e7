"""What outlives one cluster in this process (docs/design.md, "Who owns what"): the loop thread
every cluster's kernel channels live on, and the spare pool a stopped cluster leaves to the one
that replaces it (a ``%%tfcluster`` resize).

A cluster borrows the loop and gives its pool back; nothing passes from one ``Cluster`` to
another by hand. The loop thread is started on first use and lives as long as the process (a
daemon thread); a kept pool is taken by the next cluster that wants spares, ended by the next one
that does not, and at exit (the spares also die with this process, like tasks).
"""

from __future__ import annotations

import atexit
import logging
import threading

from tfdist_nb.cluster.loop import LoopThread
from tfdist_nb.cluster.spares import SparePool
from tfdist_nb.debuglog import swallowed

logger = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = 30.0


class Session:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._kept: SparePool | None = None

    def loop(self) -> LoopThread:
        """The loop thread, started now if there is none (or it died)."""
        with self._lock:
            if self._loop is None or not self._loop.alive:
                self._loop = LoopThread("tfdist-loop")
            return self._loop

    def keep_pool(self, pool: SparePool) -> None:
        """A stopped cluster's pool (detached), for the cluster that replaces it; a pool kept
        before and never taken ends now."""
        with self._lock:
            old, self._kept = self._kept, pool
        if old is not None:
            self._close(old)

    def take_pool(self) -> SparePool | None:
        """The kept pool, if any (the caller attaches it)."""
        with self._lock:
            pool, self._kept = self._kept, None
        return pool

    def drop_pool(self) -> None:
        """End a kept pool nobody takes (a cluster without spares started)."""
        pool = self.take_pool()
        if pool is not None:
            self._close(pool)

    def _close(self, pool: SparePool) -> None:
        loop = self._loop
        if loop is not None and loop.alive:
            with swallowed(logger):
                loop.run(pool.close(), CLOSE_TIMEOUT_S)


SESSION = Session()
atexit.register(SESSION.drop_pool)
