"""Which clusters this process has started, and which one the magics drive (``current()``).

Every started cluster is tracked until it stops, so an interpreter exit (``atexit``) or unloading
the extension stops them all: no worker outlives the notebook kernel (docs/design.md, Stopping).
"""

from __future__ import annotations

import atexit
import logging
import weakref
from typing import TYPE_CHECKING

from tfdist_nb.debuglog import swallowed

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tfdist_nb.cluster.facade import Cluster

_current: Cluster | None = None
_live: weakref.WeakSet[Cluster] = weakref.WeakSet()
_last: weakref.ref[Cluster] | None = None


def current() -> Cluster | None:
    """The notebook's active cluster (the one the magics drive), or None."""
    return _current if _current is not None and _current.running else None


def set_current(cluster: Cluster | None) -> None:
    global _current, _last
    _current = cluster
    if cluster is not None:
        _last = weakref.ref(cluster)


def last_cluster() -> Cluster | None:
    """The cluster that was current last, also after it stopped (``%tfdist_export``)."""
    return _last() if _last is not None else None


def track(cluster: Cluster) -> None:
    _live.add(cluster)


def forget(cluster: Cluster) -> None:
    """A stopped cluster: no longer live, and no longer current if it was."""
    _live.discard(cluster)
    if _current is cluster:
        set_current(None)


def live_clusters() -> list[Cluster]:
    """Clusters started in this process and not yet stopped."""
    return list(_live)


@atexit.register
def stop_all() -> None:
    for cluster in live_clusters():
        with swallowed(logger):
            cluster.stop()
