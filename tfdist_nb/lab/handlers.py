"""REST and websocket handlers of the tfdist server extension, under the server's own auth.

``GET /tfdist/api/clusters``                 summaries of every cluster found (a JSON list)
``GET /tfdist/api/clusters/<id>``            one cluster: summary, alerts, log tail, series
``WS  /tfdist/api/clusters/<id>/stream``     a ``snapshot`` message, then ``update`` messages
                                             with what was appended to its files since

One :class:`ClusterIndex` per server owns the watches; a periodic callback polls the watched
clusters' files (only their new bytes) and pushes the news to their subscribers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.ioloop import PeriodicCallback
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from tfdist_nb.lab.discovery import CLUSTER_ID, find_clusters
from tfdist_nb.lab.model import ClusterWatch

AUTH_RESOURCE = "tfdist"
SCAN_CACHE_S = 2.0
HEARTBEAT_S = 10.0  # an update with the summary at least this often to a subscriber


class ClusterIndex:
    """Clusters found in the bases, a watch for each, and who listens to which."""

    def __init__(self, bases: Callable[[], list[Path]], log: Any = None,
                 poll_interval: float = 0.5) -> None:
        self._bases = bases
        self.log = log
        self.poll_interval = poll_interval
        self._poller: PeriodicCallback | None = None
        self.watches: dict[str, ClusterWatch] = {}
        self.subscribers: dict[str, set[Any]] = {}
        self._scanned = 0.0
        self._paths: dict[str, Path] = {}
        self._beat: dict[str, float] = {}

    def scan(self, force: bool = False) -> dict[str, Path]:
        if force or time.monotonic() - self._scanned > SCAN_CACHE_S:
            self._paths = find_clusters(self._bases())
            self._scanned = time.monotonic()
            for cid in list(self.watches):
                if cid not in self._paths and not self.subscribers.get(cid):
                    del self.watches[cid]
        return self._paths

    def get(self, cluster_id: str) -> ClusterWatch | None:
        if not CLUSTER_ID.match(cluster_id):
            return None
        path = self.scan().get(cluster_id) or self.scan(force=True).get(cluster_id)
        if path is None:
            return self.watches.get(cluster_id)
        watch = self.watches.get(cluster_id)
        if watch is None or watch.path != path:
            watch = self.watches[cluster_id] = ClusterWatch(cluster_id, path)
        watch.refresh_state()
        return watch

    def summaries(self) -> list[dict[str, Any]]:
        out = []
        for cid in self.scan():
            watch = self.get(cid)
            if watch is not None:
                out.append(watch.summary())
        return out

    def detail(self, cluster_id: str) -> dict[str, Any] | None:
        watch = self.get(cluster_id)
        if watch is None:
            return None
        self.poll(watch)
        return watch.detail()

    # ------------------------------------------------------------------ streams
    def subscribe(self, watch: ClusterWatch, sock: Any) -> None:
        self.subscribers.setdefault(watch.id, set()).add(sock)
        if self._poller is None:  # started in a handler: the server's loop is running
            self._poller = PeriodicCallback(self.tick, self.poll_interval * 1000)
            self._poller.start()

    def unsubscribe(self, cluster_id: str, sock: Any) -> None:
        self.subscribers.get(cluster_id, set()).discard(sock)

    def poll(self, watch: ClusterWatch) -> None:
        """Read the watch's new lines and state; send them to its subscribers."""
        changed = watch.refresh_state()
        news = watch.poll()
        now = time.monotonic()
        beat = now - self._beat.get(watch.id, 0.0) >= HEARTBEAT_S
        if not (changed or beat or news["events"] or news["telemetry"] or news["lateness"]):
            return
        self._beat[watch.id] = now
        socks = list(self.subscribers.get(watch.id, ()))
        if not socks:
            return
        message = json.dumps({"type": "update", "cluster": watch.summary(alert_list=True), **news},
                             default=str)
        for sock in socks:
            try:
                sock.write_message(message)
            except WebSocketClosedError:
                self.unsubscribe(watch.id, sock)

    def tick(self) -> None:
        for cid, socks in list(self.subscribers.items()):
            watch = self.watches.get(cid)
            if not socks or watch is None:
                continue
            try:
                self.poll(watch)
            except Exception:  # one broken run directory must not stop the others
                if self.log is not None:
                    self.log.exception("tfdist: polling cluster %s failed", cid)


def _index(handler: web.RequestHandler) -> ClusterIndex:
    return handler.settings["tfdist_index"]


class ClustersHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    def get(self) -> None:
        self.finish(json.dumps(_index(self).summaries(), default=str))


class ClusterHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    def get(self, cluster_id: str) -> None:
        found = _index(self).detail(cluster_id)
        if found is None:
            raise web.HTTPError(404, f"no cluster {cluster_id!r} in the run directories")
        self.finish(json.dumps(found, default=str))


class StreamHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):  # type: ignore[misc]
    auth_resource = AUTH_RESOURCE
    watch: ClusterWatch | None = None

    @ws_authenticated
    async def get(self, cluster_id: str) -> None:  # type: ignore[override]
        user = self.current_user
        allowed = await ensure_async(self.authorizer.is_authorized(self, user, "read",
                                                                   AUTH_RESOURCE))
        if not allowed:
            raise web.HTTPError(403)
        self.watch = _index(self).get(cluster_id)
        if self.watch is None:
            raise web.HTTPError(404, f"no cluster {cluster_id!r} in the run directories")
        await super().get(cluster_id)

    def open(self, cluster_id: str) -> None:  # type: ignore[override]
        super().open()
        index, watch = _index(self), self.watch
        assert watch is not None
        index.poll(watch)  # bring it up to date (and tell the others) before the snapshot
        index.subscribe(watch, self)
        self.write_message(json.dumps({"type": "snapshot", "cluster": watch.detail()},
                                      default=str))

    def on_message(self, message: str | bytes) -> None:
        """Nothing to receive: the stream is read-only."""

    def on_close(self) -> None:
        if self.watch is not None:
            _index(self).unsubscribe(self.watch.id, self)
