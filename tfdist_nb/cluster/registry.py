"""Which clusters this process has started, and which one the magics drive (``current()``).

Every started cluster is tracked until it stops, so an interpreter exit (``atexit``) or unloading
the extension stops them all: no worker outlives the notebook kernel (docs/design.md, Stopping).
The state is the session's (:class:`~.session.Clusters`, docs/design.md "Who owns what"): a
cluster registers itself there as it starts and stops; the rest of the package reads it through
these functions, typed as the facade's ``Cluster`` (the session sits below the facade).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from tfdist_nb.cluster.session import SESSION

if TYPE_CHECKING:  # one way: the facade registers itself through the session, not here
    from tfdist_nb.cluster.facade import Cluster


def current() -> Cluster | None:
    """The notebook's active cluster (the one the magics drive), or None."""
    return cast("Cluster | None", SESSION.clusters.current())


def set_current(cluster: Cluster | None) -> None:
    SESSION.clusters.set_current(cluster)


def last_cluster() -> Cluster | None:
    """The cluster that was current last, also after it stopped (``%tfdist_export``)."""
    return cast("Cluster | None", SESSION.clusters.last())


def live_clusters() -> list[Cluster]:
    """Clusters started in this process and not yet stopped."""
    return cast("list[Cluster]", SESSION.clusters.live())

