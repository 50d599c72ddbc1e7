"""A JupyterLab console on a task's kernel (docs/reference.md, Consoles on a task).

The kernel is registered as one the server does not own (jupyter_client's ``owns_kernel=False``,
as ``ServerApp.allow_external_kernels`` does), so it is reached through the server's own
authenticated kernel websocket and shutting it down only forgets it. Only a connection file named
by a live cluster's ``state.json``, a regular file of this user that nobody else can read, is used
(docs/security.md, The Jupyter server extension).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.ioloop import PeriodicCallback

from tfdist_nb.lab.handlers import ClusterIndex
from tfdist_nb.lab.model import NO_KERNEL
from tfdist_nb.owned_files import read_regular, regular_stat

if TYPE_CHECKING:
    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

TASK = re.compile(r"^(chief|worker|ps|evaluator):\d{1,6}$")
#: The private names a console leans on to register a kernel the server does not own (as
#: jupyter_client registers external ones), by the class that has them, and the releases they
#: were read in (docs/design.md, Kernel internals); a server lacking one refuses the console
#: saying so, and tests/test_kernel_internals.py fails outside these releases until read.
SERVER_INTERNALS = {"MappingKernelManager": ("_kernels", "_kernel_connections",
                                             "_finish_kernel_start"),
                    "KernelManager": ("_launch_args",)}
CHECKED = {"jupyter_server": ((2, 4), (2, 21)), "jupyter_client": ((8, 6), (8, 10))}
PRUNE_S = 5.0  # how often registered task kernels are checked against their clusters
KERNEL_NAME = "tfdist-worker"


class ConnectionInfo(TypedDict, total=False):
    """A kernel connection file (jupyter_client's ``KernelConnectionInfo``, which the lab may
    not import), as ``connection_of`` read and checked it."""

    transport: str  # ipc | tcp
    ip: str
    key: str
    signature_scheme: str
    kernel_name: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    hb_port: int


class Refused(Exception):
    """Why no console can be opened on the task, with the HTTP status said."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def connection_of(index: ClusterIndex, cluster_id: str, task: str) -> tuple[str, ConnectionInfo]:
    """(reading thread) The path and contents of the live task's kernel connection file."""
    watch = index.get(cluster_id)
    if watch is None:
        raise Refused(404, f"no cluster {cluster_id!r} in the run directories")
    if watch.status != "live":
        raise Refused(409, f"cluster {cluster_id} is {watch.status}: a console needs a running "
                           "cluster")
    entry = next((t for t in (watch.state or {}).get("tasks") or []
                  if isinstance(t, dict) and t.get("task") == task), None)
    if entry is None:
        raise Refused(404, f"cluster {cluster_id} has no task {task}")
    if entry.get("state") in NO_KERNEL:
        raise Refused(409, f"{task} is {entry.get('state')}: it has no kernel to open a console "
                           "on")
    path = entry.get("connection_file")
    if not isinstance(path, str) or not os.path.isabs(path):
        raise Refused(409, f"{task}'s kernel has no connection file on this host (a task "
                           "started over ssh is reached through its tunnel only)")
    st = regular_stat(Path(path))
    if st is None or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise Refused(403, f"{task}'s connection file {path} is missing, not a regular file of "
                           "this user, or readable by others: not used")
    try:
        info = json.loads((read_regular(Path(path)) or b"").decode())
    except ValueError:
        info = None
    if not isinstance(info, dict) or not info.get("key") or info.get("transport") not in (
            "ipc", "tcp"):
        raise Refused(409, f"{task}'s connection file {path} is not a whole kernel connection "
                           "file (yet)")
    return path, cast(ConnectionInfo, info)  # JSON, its key and transport checked


class TaskKernels:
    """The task kernels registered with the server's kernel manager, by (cluster, task)."""

    def __init__(self, manager: MappingKernelManager, index: ClusterIndex) -> None:
        self.manager = manager
        self.index = index
        self.known: dict[tuple[str, str], tuple[str, str, str]] = {}  # -> kernel id, path, key
        self._pruner: PeriodicCallback | None = None
        self._lock = asyncio.Lock()

    async def kernel_for(self, cluster_id: str, task: str, path: str,
                         info: ConnectionInfo) -> str:
        """(loop) The kernel id of the task's kernel, registered now unless it already is."""
        async with self._lock:  # one registration at a time (a double click: one kernel)
            known = self.known.get((cluster_id, task))
            if known is not None:
                if known[0] in self.manager and known[1:] == (path, info["key"]):
                    return known[0]
                await self.forget(cluster_id, task)
            manager = self.manager
            km = manager.kernel_manager_factory(parent=manager, log=manager.log, owns_kernel=False)
            lacking = [n for obj, kind in ((manager, "MappingKernelManager"), (km, "KernelManager"))
                       for n in SERVER_INTERNALS[kind] if not hasattr(obj, n)]
            if lacking:
                raise Refused(501, "this Jupyter server's kernel manager has no "
                                   f"{', '.join(lacking)} (consoles on a task were read against "
                                   f"{_releases()}): open one with `jupyter console --existing` "
                                   "on the task's connection file instead")
            km.load_connection_info(info)
            kernel_id = manager.new_kernel_id()
            km.kernel_id = kernel_id
            km.kernel_name = info.get("kernel_name") or KERNEL_NAME
            km.execution_state, km.reason = "idle", ""
            km.ready.set_result(None)
            # a restart from JupyterLab is refused at once: with launch arguments ({} by default) it
            # would start a kernel of that name in the server instead (or fail half-way)
            km._launch_args = None
            # as jupyter_client registers an external kernel (MultiKernelManager.list_kernel_ids),
            # then jupyter_server's own end of a start: ports, activity watch
            manager._kernels[kernel_id] = km
            manager._kernel_connections[kernel_id] = 0
            await manager._finish_kernel_start(kernel_id)
            self.known[(cluster_id, task)] = (kernel_id, path, info["key"])
            manager.log.info("tfdist_nb.lab: %s of cluster %s is kernel %s (a console on the task)",
                             task, cluster_id, kernel_id)
            if self._pruner is None:
                self._pruner = PeriodicCallback(self.prune, PRUNE_S * 1000)
                self._pruner.start()
            return kernel_id

    async def forget(self, cluster_id: str, task: str) -> None:
        """(loop) Drop the registration; the task's process is not touched (not ours)."""
        kernel_id = self.known.pop((cluster_id, task))[0]
        if kernel_id in self.manager:
            await self.manager.shutdown_kernel(kernel_id)

    async def prune(self) -> None:
        """(loop) Forget the kernels whose cluster stopped or whose task's kernel changed."""
        for (cluster_id, task), (_, path, key) in list(self.known.items()):
            try:
                now = await self.index.off_loop(connection_of, self.index, cluster_id, task)
            except (Refused, web.HTTPError):
                now = None
            if now is None or now[0] != path or now[1].get("key") != key:
                async with self._lock:
                    if self.known.get((cluster_id, task), ("",))[1:] == (path, key):
                        await self.forget(cluster_id, task)


class ConsoleHandler(APIHandler):
    """``POST {"task": "worker:1"}``: the task's kernel id for a console. Running code in a
    task is what it gives, so it asks for the right to execute in kernels."""

    @web.authenticated
    @authorized("execute", resource="kernels")
    async def post(self, cluster_id: str) -> None:
        body = self.get_json_body() or {}
        task = body.get("task") if isinstance(body, dict) else None
        if not isinstance(task, str) or not TASK.match(task):
            raise web.HTTPError(400, 'the body names one task: {"task": "worker:1"}')
        kernels: TaskKernels = self.settings["tfdist_kernels"]
        try:
            path, info = await kernels.index.off_loop(connection_of, kernels.index, cluster_id,
                                                      task)
            kernel_id = await kernels.kernel_for(cluster_id, task, path, info)
        except Refused as exc:
            raise web.HTTPError(exc.status, str(exc)) from None
        self.finish(json.dumps({"kernel_id": kernel_id, "cluster": cluster_id, "task": task}))


def _releases() -> str:
    return ", ".join(f"{name} {a[0]}.{a[1]}-{b[0]}.{b[1]}" for name, (a, b) in CHECKED.items())
