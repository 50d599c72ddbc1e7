"""What the views (dashboard, ``state.json``) are told about a cluster (``Cluster.snapshot()``), so
they never read its internals; per-task live data stays in the ``LiveStore`` given beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tfdist_nb.events import Alert


@dataclass(frozen=True)
class TaskSnapshot:
    name: str  # "worker:1"
    role: str
    state: str  # docs/reference.md, States
    pid: int | None
    host: str
    #: the tasks at an input prompt that this one waits for inside a collective (state
    #: ``prompt`` is theirs): a wait for a person, not a hang
    waits_for_prompt: tuple[str, ...] = ()
    gpus: str = ""  # the GPUs it was given ("" none or unknown; docs/reference.md, GPUs)
    #: its kernel's connection file on this host ("" none): what a lab console connects with
    connection_file: str = ""


@dataclass(frozen=True)
class ClusterSnapshot:
    id: str
    spec: str  # "2 workers"
    running: bool
    run_dir: str
    tasks: tuple[TaskSnapshot, ...]
    alerts: tuple[Alert, ...]
    #: straggler task -> how late it was on average (ms)
    stragglers: dict[str, float] = field(default_factory=dict)
    #: spare kernels: ``{"count", "ready", "warming", "pids", "note"}``
    spares: dict[str, Any] = field(default_factory=dict)
    disk_trouble: str | None = None  # the run directory's disk refusing writes, in words
    persistent_mode: bool = False  # every notebook cell runs on the cluster (%tfdist_mode on)

    def task(self, name: str) -> TaskSnapshot | None:
        return next((t for t in self.tasks if t.name == name), None)
