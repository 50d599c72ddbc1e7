"""The immutable records that flow one way: worker → transport → store → display.

Plain dataclasses with a ``to_json`` so the run directory and the in-memory views hold the same
thing. No I/O here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from tfdist_nb.strenum import StrEnum


class Finding(StrEnum):
    """Kinds of a task's note that the controller acts on (a note's text is for people)."""

    SECOND_STRATEGY = "second_strategy"  # another MWMS in a process that made one
    # a MWMS was made; its ``facts``: collectives ("AUTO", "RING", "NCCL"), device type, devices
    STRATEGY = "strategy"
    RING_ON_GPUS = "ring_on_gpus"  # the advice the controller derives from STRATEGY's facts
    GPU_XID = "gpu_xid"  # the driver reported an XID error on one of the task's GPUs


class _Output(TypedDict):
    time: float
    task: str
    stream: str
    text: str
    cell: int | None
    kind: str  # "output"


class OutputRecord(_Output, total=False):
    """An ``OutputLine`` as ``events.jsonl`` holds it (``to_json``)."""

    origin: str


class _Rich(TypedDict):
    time: float
    task: str
    msg_type: str
    data: dict[str, object]  # a MIME bundle, as the kernel sent it
    metadata: dict[str, object]
    cell: int | None
    kind: str  # "rich"


class RichRecord(_Rich, total=False):
    """A ``RichOutput`` as ``events.jsonl`` holds it."""

    origin: str


class _Note(TypedDict):
    time: float
    task: str
    text: str
    level: str
    kind: str  # "note"


class NoteRecord(_Note, total=False):
    """A ``TaskNote`` as ``events.jsonl`` holds it."""

    topic: str


class CellRecord(TypedDict):
    """A cell as the run directory keeps it (``cells.jsonl``), or as isolate re-runs it."""

    cell: int
    time: float
    targets: list[str] | None  # None: every task
    code: str


class RestartRecord(TypedDict):
    """A ``Restart`` as ``events.jsonl`` holds it; ``Restart(**record)`` reads it back."""

    time: float
    tasks: dict[str, str]
    moved: dict[str, str]
    seconds: float
    kind: str  # "restart"


@dataclass(frozen=True)
class Alert:
    """A warning the detectors or the controller raised: which task it is about, what kind
    (a ``Finding``, a note topic, or None), and every task it concerns (``about``), so views pick
    tasks by field, never from the words; ``str()`` is the sentence people read."""

    task: str
    text: str
    level: str = "WARNING"
    kind: str | None = None
    about: tuple[str, ...] = ()

    @property
    def tasks(self) -> tuple[str, ...]:
        """The task it is about first, then the others it names."""
        return (self.task, *(t for t in self.about if t != self.task))

    def __str__(self) -> str:
        return f"{self.task}: {self.text}"


@dataclass(frozen=True)
class OutputLine:
    """One line of text a task wrote: stdout/stderr stream, a traceback, or a rich output's text.

    ``cell`` is the sequence number of the cell the kernel attributed it to (``None`` for output
    outside any cell, e.g. at start-up); background-thread output keeps its task either way.
    ``origin`` is ``CONSOLE`` for what code run from a console on the task wrote (and, stream
    ``input``, that code itself), else None.
    """

    time: float
    task: str
    stream: str
    text: str
    cell: int | None = None
    kind: str = "output"
    origin: str | None = None

    def to_json(self) -> OutputRecord:
        # by hand: dataclasses.asdict deep-copies, and this runs for every line of a flood
        out: OutputRecord = {"time": self.time, "task": self.task, "stream": self.stream,
                             "text": self.text, "cell": self.cell, "kind": self.kind}
        if self.origin is not None:
            out["origin"] = self.origin
        return out


#: the ``origin`` of a line written by code run from a console on the task (a JupyterLab
#: console on its kernel, docs/reference.md, Consoles on a task), not by a cell of the cluster
CONSOLE = "console"


@dataclass(frozen=True)
class RichOutput:
    """A display_data / execute_result bundle from a task, kept whole for re-display."""

    time: float
    task: str
    msg_type: str
    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    cell: int | None = None
    kind: str = "rich"
    origin: str | None = None  # as OutputLine's

    def to_json(self) -> RichRecord:
        # as dataclasses.asdict gave it: the bundle deep-copied, no origin when it has none
        out: RichRecord = {"time": self.time, "task": self.task, "msg_type": self.msg_type,
                           "data": copy.deepcopy(self.data),
                           "metadata": copy.deepcopy(self.metadata), "cell": self.cell,
                           "kind": self.kind}
        if self.origin is not None:
            out["origin"] = self.origin
        return out


@dataclass(frozen=True)
class TaskNote:
    """Something the controller says about a task (state change, start, exit), kept in the log."""

    time: float
    task: str
    text: str
    level: str = "INFO"
    kind: str = "note"
    topic: str | None = None  # what a program reads it by (HANG), never by its text

    def to_json(self) -> NoteRecord:
        out: NoteRecord = {"time": self.time, "task": self.task, "text": self.text,
                           "level": self.level, "kind": self.kind}
        if self.topic is not None:
            out["topic"] = self.topic
        return out


#: a TaskNote's topic: the hang rules named a culprit, said the moment they did (the waiters are
#: released after it; at 1,024 tasks that takes seconds, docs/performance.md)
HANG = "hang"


@dataclass(frozen=True)
class TelemetrySample:
    """One heartbeat from a task's agent: resources, step count and the steps since the last.

    ``data`` is the agent's message as it came: a ``samples.Sample`` (resources, ``gpus``,
    ``steps`` rows), or a ``samples.LedgerMessage`` (``kind`` "ledger"). Kept a plain dict here:
    this layer sits below ``samples`` (which reads the ledger's rows).
    """

    time: float
    task: str
    data: dict[str, Any]
    kind: str = "telemetry"

    def to_json(self) -> dict[str, Any]:
        # built directly: ``asdict`` deep-copied every sample, half the idle controller's CPU
        # at 256 tasks (docs/performance.md, issue 40); the record is encoded at once
        return {"time": self.time, "task": self.task, "data": self.data, "kind": self.kind}


class CameBack(StrEnum):
    """How a restarted task came back (``Restart.tasks``)."""

    SPARE = "spare"  # a spare kernel was adopted as the task
    FORKED = "forked"  # forked from the fork server (TensorFlow imported already)
    COLD = "cold"  # spawned, importing everything itself


#: how each way back is said in a task's log
CAME_BACK: dict[str, str] = {CameBack.SPARE: "from a spare", CameBack.COLD: "spawned cold",
                             CameBack.FORKED: "forked from the fork server"}


@dataclass(frozen=True)
class Restart:
    """One restart, kept with the events when it is done (``kind == "restart"``, what a program
    finds it by; ``Restart(**record)`` reads it back): when it began, how each task came back
    (``tasks``: name -> ``CameBack``), each one's fresh TF address when they moved to fresh
    ports (``moved``; empty: the same TF_CONFIGs), how long it took. ``said(task)`` is its line
    in a task's log, ``str()`` the whole."""

    time: float
    tasks: dict[str, str]
    moved: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    kind: str = "restart"

    def said(self, task: str) -> str:
        where = (f"on a fresh TF port ({self.moved[task]})" if task in self.moved else
                 "with the same TF_CONFIG")
        return f"restarted in {self.seconds:.1f}s, {CAME_BACK[self.tasks[task]]}, {where}"

    def __str__(self) -> str:
        ways = [(how, [t for t, h in self.tasks.items() if h == how]) for how in CAME_BACK]
        said = "; ".join(f"{', '.join(names)} {CAME_BACK[how]}" for how, names in ways if names)
        ports = "on fresh TF ports" if self.moved else "with the same TF_CONFIGs"
        return f"restarted in {self.seconds:.1f}s, {ports}: {said}"

    def to_json(self) -> RestartRecord:
        return {"time": self.time, "tasks": dict(self.tasks), "moved": dict(self.moved),
                "seconds": self.seconds, "kind": self.kind}


Event = OutputLine | RichOutput | TaskNote | TelemetrySample | Restart


def describe_tensor(dtype: str, shape: Iterable[int | None] | None) -> str:
    """``float32[4,?]``: how a collective's tensor is named in the ledger, on the worker (its
    mismatch errors) and in the controller (hang causes) alike."""
    if shape is None:
        return f"{dtype}[?]"
    return f"{dtype}[{','.join('?' if d is None else str(d) for d in shape)}]"


def gpu_summary(gpus: object) -> tuple[float | None, float | None]:
    """Mean utilisation and summed memory of a task's GPUs, from a telemetry sample's ``gpus``
    (None, None without a GPU; values that are not numbers are left out). The memory is the
    task's own processes' (``task_mem_mb``) where NVML told them apart, else the GPUs' use."""
    if not isinstance(gpus, list) or not gpus:
        return None, None
    gpus = [g for g in gpus if isinstance(g, dict)]
    utils = [u for g in gpus if (u := as_float(g.get("util_percent"))) is not None]
    own = any(as_float(g.get("task_mem_mb")) is not None for g in gpus)
    mems = [m for g in gpus
            if (m := as_float(g.get("task_mem_mb" if own else "mem_used_mb"))) is not None]
    return (sum(utils) / len(utils) if utils else None, sum(mems) if mems else None)


def as_float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
