"""What outlives one cluster in this process (docs/design.md, "Who owns what"): the loop thread,
the spare pools and which clusters run. Clusters borrow these so that nothing passes from one
``Cluster`` to another by hand; at exit all is closed, so no worker outlives the notebook kernel.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Protocol

from tfdist_nb.cluster.loop import LoopThread
from tfdist_nb.cluster.spares import PoolUser, SparePool
from tfdist_nb.debuglog import swallowed

logger = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = 30.0


class Cluster(Protocol):
    """What the session needs of a cluster (this module sits below the facade, so it does not
    import it; :mod:`.registry` hands clusters out typed as the facade's)."""

    running: bool

    def stop(self) -> object: ...


class Clusters:
    """The clusters started in this process and not yet stopped, the one the magics drive
    (``current``), and the one they drove last (``%tfdist_export`` after a stop). Only the
    current one is held strongly: one nobody holds any more is forgotten."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: Cluster | None = None
        self._live: weakref.WeakSet[Cluster] = weakref.WeakSet()
        self._last: weakref.ref[Cluster] | None = None

    def current(self) -> Cluster | None:
        """The cluster the magics drive, while it runs; else None."""
        cluster = self._current
        return cluster if cluster is not None and cluster.running else None

    def set_current(self, cluster: Cluster | None) -> None:
        with self._lock:
            self._current = cluster
            if cluster is not None:
                self._last = weakref.ref(cluster)

    def last(self) -> Cluster | None:
        """The cluster that was current last, also after it stopped."""
        last = self._last
        return last() if last is not None else None

    def track(self, cluster: Cluster) -> None:
        with self._lock:
            self._live.add(cluster)

    def forget(self, cluster: Cluster) -> None:
        """A stopped cluster: no longer live, and no longer current if it was."""
        with self._lock:
            self._live.discard(cluster)
            if self._current is cluster:
                self._current = None

    def live(self) -> list[Cluster]:
        """Clusters started in this process and not yet stopped."""
        with self._lock:
            return list(self._live)

    def stop_all(self) -> None:
        """Stop every live cluster (at exit, or when the extension is unloaded)."""
        for cluster in self.live():
            with swallowed(logger):
                cluster.stop()


class Session:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._pools: list[SparePool] = []  # one per kernel key
        self.clusters = Clusters()

    def loop(self) -> LoopThread:
        """The loop thread, started now if there is none (or it died)."""
        with self._lock:
            if self._loop is None or not self._loop.alive:
                self._loop = LoopThread("tfdist-loop")
            return self._loop

    def take_pool(self, user: PoolUser | None) -> SparePool | None:
        """The spare pool of ``user``'s kernel key (kept, in use, or new), served to it until
        given back (None: no spares). Kept pools nobody uses that it does not take end now."""
        key = user.key if user is not None else None
        with self._lock:
            pool = next((p for p in self._pools if p.key == key), None)
            if user is not None and pool is None:
                pool = SparePool(user)
                self._pools.append(pool)
            idle = [p for p in self._pools if p is not pool and not p.users]
            self._pools = [p for p in self._pools if p not in idle]
        for old in idle:
            self._close(old)
        if pool is not None and user is not None:
            pool.serve(user)
            self.loop().call_soon(pool.start_refill)
        return pool

    def give_back(self, pool: SparePool, user: PoolUser, keep: bool = False) -> None:
        """A cluster done with its pool: the pool serves its previous user, is kept for the
        next cluster of its key (``keep``), or ends."""
        loop = self.loop()
        if loop.run(pool.release(user, keep), CLOSE_TIMEOUT_S) or keep:
            return
        with self._lock:
            self._pools = [p for p in self._pools if p is not pool]
        self._close(pool)

    def end_idle(self) -> None:
        """After ``isolate()``: the kept pools nobody uses end, those in use refill again."""
        self.take_pool(None)
        for pool in list(self._pools):
            self.loop().call_soon(pool.start_refill)

    def close(self) -> None:
        """At exit and at ``%unload_ext``, in dependency order: running clusters (through
        their stop path), the pools, the fork servers (their kernels are gone by then), then
        the private network they all ran in."""
        from tfdist_nb.launchers import forkserver, private_net

        self.clusters.stop_all()
        with self._lock:
            pools, self._pools = self._pools, []
        for pool in pools:
            self._close(pool)
        with swallowed(logger):
            forkserver.close_all()
        with swallowed(logger):
            private_net.close_shared()

    def _close(self, pool: SparePool) -> None:
        loop = self._loop
        if loop is not None and loop.alive:
            with swallowed(logger):
                loop.run(pool.close(), CLOSE_TIMEOUT_S)


SESSION = Session()
atexit.register(SESSION.close)
