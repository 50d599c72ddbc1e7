"""The clusters of this process, typed as the facade's ``Cluster``: the one home of ``current()``
(``tfdist_nb.current``). The state is the session's (docs/design.md, "Who owns what"), which sits
below the facade and cannot name it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from tfdist_nb.cluster.session import SESSION

if TYPE_CHECKING:  # one way: the facade registers itself through the session, not here
    from tfdist_nb.cluster.facade import Cluster


def current() -> Cluster | None:
    """The notebook's active cluster (the one the magics drive), or None."""
    return cast("Cluster | None", SESSION.clusters.current())


def last_cluster() -> Cluster | None:
    """The cluster that was current last, also after it stopped (``%tfdist_export``)."""
    return cast("Cluster | None", SESSION.clusters.last())


def live_clusters() -> list[Cluster]:
    """Clusters started in this process and not yet stopped."""
    return cast("list[Cluster]", SESSION.clusters.live())

