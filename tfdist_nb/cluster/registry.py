"""Which clusters this process has started, and which one the magics drive (``current()``).

Every started cluster is tracked until it stops, so an interpreter exit (``atexit``) or unloading
the extension stops them all: no worker outlives the notebook kernel (docs/design.md, Stopping).
The state is the session's (:class:`~.session.Clusters`, docs/design.md "Who owns what"); these
functions are the one way the rest of the package reads and changes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfdist_nb.cluster.session import SESSION

if TYPE_CHECKING:
    from tfdist_nb.cluster.facade import Cluster


def current() -> Cluster | None:
    """The notebook's active cluster (the one the magics drive), or None."""
    return SESSION.clusters.current()


def set_current(cluster: Cluster | None) -> None:
    SESSION.clusters.set_current(cluster)


def last_cluster() -> Cluster | None:
    """The cluster that was current last, also after it stopped (``%tfdist_export``)."""
    return SESSION.clusters.last()


def track(cluster: Cluster) -> None:
    SESSION.clusters.track(cluster)


def forget(cluster: Cluster) -> None:
    """A stopped cluster: no longer live, and no longer current if it was."""
    SESSION.clusters.forget(cluster)


def live_clusters() -> list[Cluster]:
    """Clusters started in this process and not yet stopped."""
    return SESSION.clusters.live()

