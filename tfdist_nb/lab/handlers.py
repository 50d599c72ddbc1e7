"""REST and websocket handlers of the tfdist server extension, under the server's own auth.

``GET /tfdist/api/clusters``                 summaries of every cluster found (a JSON list)
``GET /tfdist/api/clusters/<id>``            one cluster: summary, alerts, log tail, series
``WS  /tfdist/api/clusters/<id>/stream``     a ``snapshot`` message, then ``update`` messages
                                             with what was appended to its files since
``POST /tfdist/api/clusters/<id>/console``   a live task's kernel for a console (consoles.py)

No file is touched on the server's event loop: one reading thread does it all, and a request
waits for it at most ``IO_TIMEOUT_S`` (then 504), so a hung network filesystem slows the panes,
never the rest of Jupyter (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.ioloop import IOLoop, PeriodicCallback
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from tfdist_nb.lab.discovery import CLUSTER_ID, find_clusters
from tfdist_nb.lab.model import ClusterWatch, Detail, Summary

AUTH_RESOURCE = "tfdist"
T = TypeVar("T")
SCAN_CACHE_S = 2.0
HEARTBEAT_S = 10.0  # an update with the summary at least this often to a subscriber
IO_TIMEOUT_S = 10.0  # a request waits this long for the run directories, then 504
#: one poll of the watched clusters: each watch and its update message (None: nothing new)
Collected = list[tuple[ClusterWatch, str | None]]


class ClusterIndex:
    """Clusters found in the bases, a watch for each, and who listens to which."""

    def __init__(self, bases: Callable[[], list[Path]], log: logging.Logger | None = None,
                 poll_interval: float = 0.5) -> None:
        self._bases = bases
        self.log = log
        self.poll_interval = poll_interval
        self._poller: PeriodicCallback | None = None
        self.watches: dict[str, ClusterWatch] = {}
        self.subscribers: dict[str, set[StreamHandler]] = {}
        self._scanned = 0.0
        self._paths: dict[str, Path] = {}
        self._beat: dict[str, float] = {}
        # every read of the run directories, one at a time (the watches are not thread-safe)
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfdist-io")
        self._ticking = False

    async def off_loop(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the index's reading thread, awaited at most IO_TIMEOUT_S."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self._io.submit(fn, *args)),
                                          IO_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise web.HTTPError(504, "the run directories did not answer within "
                                     f"{IO_TIMEOUT_S:.0f}s (a hung filesystem?)") from None

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

    def summaries(self) -> list[Summary]:
        return [w.summary() for cid in self.scan() if (w := self.get(cid)) is not None]

    def detail(self, cluster_id: str) -> tuple[Detail, Callable[[], None]] | None:
        """(reading thread) One cluster's detail, and the delivery of its news to the
        subscribers, for the loop to call."""
        watch = self.get(cluster_id)
        if watch is None:
            return None
        message = self.collect(watch)
        return watch.detail(), lambda: self.deliver(watch, message)

    # ------------------------------------------------------------------ streams
    def subscribe(self, watch: ClusterWatch, sock: StreamHandler) -> None:
        self.subscribers.setdefault(watch.id, set()).add(sock)
        if self._poller is None:  # started in a handler: the server's loop is running
            self._poller = PeriodicCallback(self.tick, self.poll_interval * 1000)
            self._poller.start()

    def unsubscribe(self, cluster_id: str, sock: StreamHandler) -> None:
        self.subscribers.get(cluster_id, set()).discard(sock)

    def collect(self, watch: ClusterWatch) -> str | None:
        """(reading thread) The watch's new lines and state as an update message, or None
        when there is nothing to say."""
        changed = watch.refresh_state()
        news = watch.poll()
        now = time.monotonic()
        beat = now - self._beat.get(watch.id, 0.0) >= HEARTBEAT_S
        if not (changed or beat or news["events"] or news["telemetry"] or news["lateness"]):
            return None
        self._beat[watch.id] = now
        return json.dumps({"type": "update", "cluster": watch.summary(alert_list=True),
                           **news}, default=str)

    def deliver(self, watch: ClusterWatch, message: str | None) -> None:
        """(loop) Send an update to the watch's subscribers."""
        if message is None:
            return
        for sock in list(self.subscribers.get(watch.id, ())):
            try:
                sock.write_message(message)
            except WebSocketClosedError:
                self.unsubscribe(watch.id, sock)

    def tick(self) -> None:
        """(loop) Poll the watched clusters on the reading thread; deliver when it is done.
        A poll still running (a slow filesystem) is not queued behind."""
        if self._ticking:
            return
        watched = [(cid, w) for cid, socks in list(self.subscribers.items())
                   if socks and (w := self.watches.get(cid)) is not None]
        if not watched:
            return
        self._ticking = True
        done = self._io.submit(self._collect_all, watched)
        IOLoop.current().add_future(done, self._delivered)

    def _collect_all(self, watched: list[tuple[str, ClusterWatch]]) -> Collected:
        out: Collected = []
        for cid, watch in watched:
            try:
                out.append((watch, self.collect(watch)))
            except Exception:  # one broken run directory must not stop the others
                if self.log is not None:
                    self.log.exception("tfdist: polling cluster %s failed", cid)
        return out

    def _delivered(self, done: Future[Collected] | asyncio.Future[Collected]) -> None:
        self._ticking = False
        try:
            found = done.result()
        except Exception:  # logged per cluster already; a failure here is the executor's
            return
        for watch, message in found:
            self.deliver(watch, message)


def _index(handler: web.RequestHandler) -> ClusterIndex:
    return handler.settings["tfdist_index"]


class ClustersHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self) -> None:
        index = _index(self)
        self.finish(json.dumps(await index.off_loop(index.summaries), default=str))


class ClusterHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self, cluster_id: str) -> None:
        index = _index(self)
        found = await index.off_loop(index.detail, cluster_id)
        if found is None:
            raise web.HTTPError(404, f"no cluster {cluster_id!r} in the run directories")
        detail, deliver = found
        deliver()
        self.finish(json.dumps(detail, default=str))


class StreamHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    auth_resource = AUTH_RESOURCE
    watch: ClusterWatch | None = None

    @ws_authenticated
    async def get(self, cluster_id: str) -> None:
        user = self.current_user
        allowed = await ensure_async(self.authorizer.is_authorized(self, user, "read",
                                                                   AUTH_RESOURCE))
        if not allowed:
            raise web.HTTPError(403)
        index = _index(self)
        self.watch = await index.off_loop(index.get, cluster_id)
        if self.watch is None:
            raise web.HTTPError(404, f"no cluster {cluster_id!r} in the run directories")
        await super().get(cluster_id)

    async def open(self, cluster_id: str) -> None:
        super().open()
        index, watch = _index(self), self.watch
        assert watch is not None
        # bring it up to date (and tell the others) before the snapshot
        message, detail = await index.off_loop(lambda: (index.collect(watch), watch.detail()))
        index.deliver(watch, message)
        index.subscribe(watch, self)
        self.write_message(json.dumps({"type": "snapshot", "cluster": detail}, default=str))

    def on_message(self, message: str | bytes) -> None:
        """Nothing to receive: the stream is read-only."""

    def on_close(self) -> None:
        if self.watch is not None:
            _index(self).unsubscribe(self.watch.id, self)
