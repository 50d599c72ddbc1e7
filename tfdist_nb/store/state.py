"""``<run dir>/state.json`` (its fields: docs/reference.md, JupyterLab panes): written by the
controller, read by the server extension, so a live cluster is told from a finished or orphaned
one without talking to any kernel. Replaced atomically and owner-only (docs/security.md); a daemon
thread rewrites it on change and at least every ``HEARTBEAT_S``, so ``updated`` proves the
controller alive.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict, cast

import psutil

from tfdist_nb.debuglog import swallowed
from tfdist_nb.owned_files import read_regular, regular_stat
from tfdist_nb.store.rundir import replace_private
from tfdist_nb.store.snapshot import ClusterSnapshot
from tfdist_nb.store.tails import LiveStore

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
SCHEMA = 1
HEARTBEAT_S = 5.0
#: A controller on another host is taken as gone when its file is older than this.
REMOTE_STALE_S = 30.0


class StateTask(TypedDict, total=False):
    """One task in ``state.json`` (the controller writes every field; a reader finds the file
    of an older run, so it reads them with ``.get``)."""

    task: str  # "worker:1"
    role: str
    state: str  # docs/reference.md, States
    step: int | None
    pid: int | None
    host: str
    step_time_ms: float | None
    lateness_ms: float | None  # None: not a straggler
    straggler: bool
    waits_for_prompt: list[str]
    gpus: str
    connection_file: str | None  # its kernel's, on the controller's host


class StateController(TypedDict, total=False):
    """The process that writes ``state.json``: what ``controller_alive`` judges it by."""

    pid: int
    host: str
    create_time: float | None


class ClusterState(TypedDict):
    """What changes while a cluster runs (``state_doc``): merged into the file on each write."""

    tasks: list[StateTask]
    alerts: list[str]


class StateDoc(TypedDict, total=False):
    """The whole ``state.json`` (docs/reference.md, JupyterLab panes); ``total=False`` for a
    reader, which may find an older or half-known file."""

    schema: int
    id: str
    spec: str
    state: str  # starting | running | stopped | orphaned
    controller: StateController
    run_dir: str
    started: float
    updated: float | None
    stopped: float | None
    tasks: list[StateTask]
    alerts: list[str]


def state_doc(snap: ClusterSnapshot, live: LiveStore) -> ClusterState:
    """Tasks and alerts of a cluster for ``state.json`` (read from any thread)."""
    tasks: list[StateTask] = []
    for t in snap.tasks:
        view = live.view(t.name)
        tasks.append({
            "task": t.name, "role": t.role, "state": t.state, "step": view.step_count,
            "pid": t.pid, "host": t.host, "step_time_ms": view.step_time_ms(),
            "lateness_ms": snap.stragglers.get(t.name), "straggler": t.name in snap.stragglers,
            "waits_for_prompt": list(t.waits_for_prompt), "gpus": t.gpus,
            "connection_file": t.connection_file or None,
        })
    return {"tasks": tasks, "alerts": [str(a) for a in snap.alerts]}


def _own_create_time() -> float | None:
    with contextlib.suppress(psutil.Error):
        return psutil.Process().create_time()
    return None


class StateFile:
    """The controller's side: owns ``state.json`` of one cluster from start to stop."""

    def __init__(self, run_dir: Path, cluster_id: str, spec: str,
                 source: Callable[[], ClusterState], interval: float = 0.5) -> None:
        self.path = Path(run_dir) / STATE_FILE
        self.interval = interval
        self._source = source
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: ClusterState | None = None
        self._written = 0.0
        self._doc: StateDoc = {
            "schema": SCHEMA, "id": cluster_id, "spec": spec, "state": "starting",
            "controller": {"pid": os.getpid(), "host": socket.gethostname(),
                           "create_time": _own_create_time()},
            "run_dir": str(Path(run_dir).resolve()), "started": time.time(),
            "updated": None, "stopped": None, "tasks": [], "alerts": []}

    def start(self) -> StateFile:
        self.write()
        self._thread = threading.Thread(target=self._loop, name=f"tfdist-state-{self._doc['id']}",
                                        daemon=True)
        self._thread.start()
        return self

    def mark(self, state: str) -> None:
        """The cluster as a whole changed state (``running``): written at once."""
        self._doc["state"] = state
        self.write()

    def close(self, state: str = "stopped") -> None:
        """The cluster stopped cleanly: the thread ends and the final state is written."""
        thread, self._thread = self._thread, None
        self._wake.set()
        if thread is not None:
            thread.join(timeout=5)
        self._doc["state"] = state
        self._doc["stopped"] = time.time()
        self.write()

    def write(self) -> None:
        with self._lock:
            with swallowed(logger):  # a view read mid-change: the next write has it
                self._doc.update(self._source())
            now = time.time()
            self._doc["updated"] = now
            with contextlib.suppress(OSError):  # the run directory was removed under us
                replace_private(self.path, json.dumps(self._doc, default=str))
                self._written = now

    def _loop(self) -> None:
        with swallowed(logger):  # off the cluster's start: it reads every run of the root
            mark_orphans(self.path.parent.parent)
        while not self._wake.wait(self.interval):
            try:
                current = self._source()
            except Exception:  # the cluster changed under the reading: the next tick reads again
                logger.debug("state.json: reading the cluster failed", exc_info=True)
                continue
            if current != self._last or time.time() - self._written >= HEARTBEAT_S:
                self._last = current
                self.write()


# ---------------------------------------------------------------------- the reader's side
def read_state(run_dir: Path) -> StateDoc | None:
    """The state file of a run directory, or None when it has none (or not yet a whole one)."""
    raw = read_regular(Path(run_dir) / STATE_FILE)  # never a FIFO or a link (owned_files)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    # the writer's document (StateDoc); its fields are still read with .get, as an older run's
    return cast(StateDoc, data) if isinstance(data, dict) else None


def controller_alive(controller: StateController, updated: float | None,
                     now: float | None = None) -> bool:
    """Is the process that wrote the state file still there? Same host: its pid exists with the
    same start time (a reused pid is another process). Another host: the file is fresh."""
    now = time.time() if now is None else now
    if controller.get("host") != socket.gethostname():
        return updated is not None and now - float(updated) < REMOTE_STALE_S
    pid = controller.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except psutil.Error:
        return False
    expected = controller.get("create_time")
    return expected is None or abs(created - float(expected)) < 1.0


def mark_orphans(root: Path, now: float | None = None) -> list[Path]:
    """Mark ``orphaned`` (and return) the clusters under ``root`` whose controller on this host
    ended without stopping them (a SIGKILLed kernel), else their file says ``running`` forever.
    Another host's controller is left to that host; another user's file is not touched."""
    host, marked = socket.gethostname(), []
    for state_file in root.glob(f"*/{STATE_FILE}"):
        st = regular_stat(state_file)
        doc = read_state(state_file.parent) if st and st.st_uid == os.geteuid() else None
        if (doc is None or doc.get("state") not in ("starting", "running")
                or (doc.get("controller") or {}).get("host") != host
                or cluster_status(doc, now) != "orphaned"):
            continue
        doc.update({"state": "orphaned", "stopped": doc.get("updated")})
        replace_private(state_file, json.dumps(doc, default=str))
        marked.append(state_file.parent)
    return marked


def cluster_status(state: StateDoc | None, now: float | None = None) -> str:
    """``live``, ``finished`` (stopped cleanly), ``orphaned`` (its controller is gone without a
    clean stop) or ``unknown`` (no state file: a run of an older tfdist_nb)."""
    if state is None:
        return "unknown"
    if state.get("state") == "stopped":
        return "finished"
    if state.get("state") == "orphaned":  # written so by a later controller (mark_orphans)
        return "orphaned"
    alive = controller_alive(state.get("controller") or {}, state.get("updated"), now)
    return "live" if alive else "orphaned"
