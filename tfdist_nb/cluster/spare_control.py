"""One cluster's spare kernels (docs/design.md, Spare kernels): how many it keeps, which pool its
:class:`~.lifecycle.Lifecycle` holds from start to stop, and lending that pool to the clusters
started beside it (``isolate()``'s variants).

The pool itself (warming, handing out) is :mod:`.spares`; a pool that outlives its cluster (left
to the cluster that replaces it, or lent) is kept by the session (:mod:`.session`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tfdist_nb.cluster.lifecycle import STOP_TIMEOUT_S, Lifecycle
from tfdist_nb.cluster.loop import LoopThread
from tfdist_nb.cluster.session import SESSION
from tfdist_nb.cluster.spare import WarmOutcome
from tfdist_nb.cluster.spares import SparePool, spare_count
from tfdist_nb.cluster.start_steps import Setup
from tfdist_nb.cluster.state import TaskState
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.errors import ClusterNotRunningError
from tfdist_nb.launchers.base import StopReport
from tfdist_nb.topology import TaskId


class ClusterSpares:
    """The spare kernels of one cluster: ``count`` kept at most (0: none) and the pool its
    lifecycle holds while the cluster runs (``running()``)."""

    def __init__(self, setup: Setup, warm: bool | int | None,
                 tasks: Mapping[TaskId, TaskRuntime], note: Callable[[str, str], None],
                 running: Callable[[], bool]) -> None:
        self.count = spare_count(warm, setup.launcher, setup)
        self._setup, self._tasks, self._note, self._running = setup, tasks, note, running
        self._lifecycle: Lifecycle | None = None
        self._loop: LoopThread | None = None
        self._base: Path | None = None

    @property
    def pool(self) -> SparePool | None:
        return self._lifecycle.spares if self._lifecycle is not None else None

    @property
    def outcome(self) -> WarmOutcome | None:
        """How the last start or restart used spares; None before the first start."""
        return self._lifecycle.warm if self._lifecycle is not None else None

    def begin(self, lifecycle: Lifecycle, loop: LoopThread, base: Path) -> None:
        """At the cluster's start: the pool the cluster it replaces left (a resize) or a new one,
        filled in the background while the tasks start; without spares a kept pool ends."""
        self._lifecycle, self._loop, self._base = lifecycle, loop, base
        if not self.count:
            SESSION.drop_pool()
            return
        lifecycle.spares = self._attach(SESSION.take_pool() or SparePool(self.count))
        loop.call_soon(lifecycle.spares.start_refill)  # CPU allowing: beside the tasks' start

    def hand_over(self) -> list[StopReport] | None:
        """``stop(keep_spares=True)``: the tasks killed without grace and the pool kept in the
        session for the cluster that replaces this one; None without a pool (stop as usual)."""
        if self._lifecycle is None or self._lifecycle.spares is None:
            return None
        reports, pool = self._loop_now().run(self._lifecycle.stop_for_handoff(),
                                             STOP_TIMEOUT_S)
        if pool is not None:
            SESSION.keep_pool(pool)
        return reports

    def end(self) -> None:
        """The cluster stopped: nothing more is done on the loop for it."""
        self._loop = None

    def summary(self) -> dict[str, Any]:
        """``Cluster.spares()``: the pool's summary, or an empty one (``note`` "off": none)."""
        pool = self.pool
        if pool is None:
            return {"count": 0, "ready": 0, "warming": 0, "pids": [],
                    "note": None if self.count else "off"}
        return pool.summary()

    def set_count(self, warm: bool | int | None) -> None:
        """``Cluster.set_warm``: a running cluster's pool ends, is resized or starts now."""
        self.count = spare_count(warm, self._setup.launcher, self._setup)
        lifecycle = self._lifecycle
        if not self._running() or lifecycle is None:
            return
        loop = self._loop_now()
        if not self.count:
            loop.run(lifecycle.close_spares(), STOP_TIMEOUT_S)
        elif lifecycle.spares is not None:
            lifecycle.spares.count = self.count
        else:
            lifecycle.spares = self._attach(SparePool(self.count))
            loop.call_soon(lifecycle.spares.start_refill)

    def lend(self) -> bool:
        """``Cluster._lend_spares``: the pool, detached, kept in the session; False if none."""
        lifecycle = self._lifecycle
        if not self._running() or lifecycle is None or lifecycle.spares is None:
            return False
        pool, lifecycle.spares = lifecycle.spares, None
        self._loop_now().run(pool.detach(), STOP_TIMEOUT_S)
        SESSION.keep_pool(pool)
        return True

    def reclaim(self, lent: bool) -> None:
        """``Cluster._reclaim_spares``: the session's pool back if ``lent`` (else it ends)."""
        lifecycle = self._lifecycle
        if not lent or not self._running() or lifecycle is None or not self.count:
            SESSION.drop_pool()
            return
        lifecycle.spares = self._attach(SESSION.take_pool() or SparePool(self.count))
        self._loop_now().call_soon(lifecycle.spares.start_refill)

    def _attach(self, pool: SparePool) -> SparePool:
        assert self._base is not None
        pool.attach(self._setup, self._base, self._busy, self._note, count=self.count,
                    starting=lambda: sum(rt.state is TaskState.STARTING
                                         for rt in list(self._tasks.values())))
        return pool

    def _busy(self) -> bool:
        """No spare starts while tasks are being restarted: the restart takes what the pool
        has. Otherwise (a cell running, the cluster's own start) the pool looks at the host's
        CPU and memory."""
        return any(rt.state is TaskState.RESTARTING for rt in list(self._tasks.values()))

    def _loop_now(self) -> LoopThread:
        if self._loop is None:
            raise ClusterNotRunningError("the cluster is not running")
        return self._loop
