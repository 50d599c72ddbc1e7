"""One cluster as the server sees it: its state file plus bounded tails of its JSON Lines files,
read only when changed or appended to, so memory and reads stay bounded whatever the run's size.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict, deque
from pathlib import Path
from typing import TypedDict, cast

from tfdist_nb import chart_axes
from tfdist_nb.diagnostics.hangs import describe_row
from tfdist_nb.diagnostics.straggler import MIN_LAG_MS, step_lags
from tfdist_nb.events import Restart, RestartRecord, as_float, gpu_summary
from tfdist_nb.lab.tail import JsonlTail
from tfdist_nb.owned_files import regular_stat
from tfdist_nb.store.collectives import LedgerView
from tfdist_nb.store.rundir import Record
from tfdist_nb.store.state import STATE_FILE, StateDoc, StateTask, cluster_status, read_state
from tfdist_nb.topology import spec_words, task_order

#: states of a task without a kernel to open a console on
NO_KERNEL = ("starting", "restarting", "dead", "stopped")

LINES_KEPT = 1000        # merged log tail of the cluster
LINES_PER_MESSAGE = 500  # a flood sends only the newest lines of a poll
SAMPLES_KEPT = 600       # per task (10 minutes at one a second)
STEPS_KEPT = 1000        # per task
PENDING_STEPS = 400      # steps waiting for the other tasks' rows (lateness)
TEXT_MAX = 4000
TASK_DIR = re.compile(r"^(chief|worker|ps|evaluator)-(\d+)$")

#: a chart row: ``[time, cpu, rss, gpu util, gpu mem]``, ``[step, begin, ms, input wait ms]``
#: or ``[step, lateness ms]``
Point = list[float | None]


class _Line(TypedDict):
    time: float | None
    task: str
    stream: str  # stdout | stderr | ... | note | rich
    text: str
    cell: object  # as the record has it


class PaneLine(_Line, total=False):
    """A line of a pane's log (``compact_event``); a note's has its level."""

    level: str


class CollectiveAt(TypedDict):
    collective: str | None  # the collective the task is in now, in words
    collective_since: float | None


class PaneLatest(TypedDict, total=False):
    """A task's newest sample as the panes show it ({} before the first)."""

    collective: str | None
    collective_since: float | None
    time: float | None
    cpu_percent: float | None
    rss_mb: float | None
    gpu_util_percent: float | None
    gpu_mem_mb: float | None
    gpus: int
    step: int | None
    total_steps: int | None


class PaneSample(PaneLatest, total=False):
    """A sample in an ``update`` message: its task, its new step rows; ``ledger_only``: only
    the collective moved."""

    task: str
    steps: list[Point]
    ledger_only: bool


class LatenessPoint(TypedDict):
    """How long the others waited for ``task`` in ``step`` (the lateness chart)."""

    task: str
    step: int
    lateness_ms: float


class News(TypedDict):
    """What was appended since the last poll (``ClusterWatch.poll``)."""

    events: list[PaneLine]
    skipped: int  # lines left out of a flood
    telemetry: list[PaneSample]
    lateness: list[LatenessPoint]


class SeriesJson(TypedDict):
    """A task's series in a cluster's detail (``TaskSeries.to_json``)."""

    samples: list[Point]
    steps: list[Point]
    lateness: list[Point]
    latest: PaneLatest
    last_output: float | None


class TaskLine(TypedDict):
    """A task in the listing: its ``state.json`` fields, and whether a console can open."""

    task: str | None
    role: str | None
    state: str | None
    step: int | None
    pid: int | None
    host: str | None
    step_time_ms: float | None
    lateness_ms: float | None
    straggler: bool | None
    gpus: str | None
    console: bool


class ControllerLine(TypedDict):
    pid: int | None
    host: str | None


class _Summary(TypedDict):
    id: str
    spec: str
    state: str  # live | finished | orphaned | unknown (cluster_status)
    controller_state: str | None  # as state.json says
    run_dir: str
    started: float | None
    updated: float | None
    stopped: float | None
    controller: ControllerLine
    tasks: list[TaskLine]
    alerts: int


class Summary(_Summary, total=False):
    """A cluster in the listing (``ClusterWatch.summary``); ``alert_list`` when asked."""

    alert_list: list[str]


class Detail(Summary):
    """One cluster for its pane (``ClusterWatch.detail``)."""

    logs: list[PaneLine]
    series: dict[str, SeriesJson]
    lateness_floor_ms: float
    charts: list[dict[str, object]]  # chart_axes.Chart.to_json
    window_s: float
    no_gpu: str


def compact_event(rec: Record) -> PaneLine | None:
    """An events.jsonl record as the panes show it: one text line with its task and stream."""
    kind = rec.get("kind")
    if kind == "output":
        stream, text = str(rec.get("stream", "stdout")), rec.get("text", "")
    elif kind == "note":
        stream, text = "note", rec.get("text", "")
    elif kind == Restart.kind:  # one line for the whole restart (each task's: logs())
        stream, text = "note", str(Restart(**cast(RestartRecord, rec)))  # as to_json wrote it
        kind, rec = "note", {**rec, "task": "cluster"}
    elif kind == "rich":
        data = rec.get("data") or {}
        stream, text = "rich", data.get("text/plain", "") if isinstance(data, dict) else ""
    else:
        return None
    out: PaneLine = {"time": as_float(rec.get("time")), "task": str(rec.get("task", "")),
           "stream": stream, "text": str(text)[:TEXT_MAX], "cell": rec.get("cell")}
    if kind == "note":
        out["level"] = str(rec.get("level", "INFO"))
    return out


class TaskSeries:
    def __init__(self) -> None:
        self.samples: deque[Point] = deque(maxlen=SAMPLES_KEPT)  # time, cpu, rss, gpu, gpu mem
        self.steps: deque[Point] = deque(maxlen=STEPS_KEPT)  # step, begin, ms, input wait ms
        self.lateness: deque[Point] = deque(maxlen=STEPS_KEPT)  # step, lateness ms
        self.latest: PaneLatest = {}
        self.last_output: float | None = None
        self.ledger = LedgerView()  # its collectives: the pane shows the one it is in

    def collective(self) -> CollectiveAt:
        row = self.ledger.current()
        return {"collective": describe_row(row) if row else None,
                "collective_since": row["entered"] if row else None}

    def to_json(self) -> SeriesJson:
        return {"samples": list(self.samples), "steps": list(self.steps),
                "lateness": list(self.lateness), "latest": self.latest,
                "last_output": self.last_output}


class ClusterWatch:
    def __init__(self, cluster_id: str, path: Path) -> None:
        self.id = cluster_id
        self.path = path
        self.events = JsonlTail(path / "events.jsonl")
        self.telemetry = JsonlTail(path / "telemetry.jsonl")
        self.state: StateDoc | None = None
        self.status = "unknown"
        self._state_key: tuple[int, int, int] | None = None
        self.lines: deque[PaneLine] = deque(maxlen=LINES_KEPT)
        self.series: defaultdict[str, TaskSeries] = defaultdict(TaskSeries)
        self._pending: dict[int, dict[str, list[object]]] = {}  # step -> task -> its row

    # ------------------------------------------------------------------ the state file
    def refresh_state(self) -> bool:
        """Re-read state.json if it changed and re-judge the status; True if either changed."""
        st = regular_stat(self.path / STATE_FILE)
        key = None if st is None else (st.st_mtime_ns, st.st_size, st.st_ino)
        changed = False
        if key != self._state_key:
            state = read_state(self.path) if key is not None else None
            if state is not None or key is None:  # a half-written file is read next time
                self._state_key, self.state, changed = key, state, True
        status = cluster_status(self.state)
        if status != self.status:
            self.status, changed = status, True
        return changed

    # ------------------------------------------------------------------ the JSON Lines tails
    def poll(self) -> News:
        """Read what was appended since the last poll; fold it in; return it for the streams."""
        events = []
        for rec in self.events.read_new():
            ev = compact_event(rec)
            if ev is None:
                continue
            self.lines.append(ev)
            events.append(ev)
            if ev["stream"] != "note":
                self.series[ev["task"]].last_output = ev["time"]
        samples: list[PaneSample] = []
        lateness: list[LatenessPoint] = []
        for rec in self.telemetry.read_new():
            sample = self._fold_sample(rec, lateness)
            if sample is not None:
                samples.append(sample)
        skipped = max(0, len(events) - LINES_PER_MESSAGE)
        return {"events": events[skipped:], "skipped": skipped, "telemetry": samples,
                "lateness": lateness}

    def _fold_sample(self, rec: Record, lateness: list[LatenessPoint]) -> PaneSample | None:
        data, task = rec.get("data"), str(rec.get("task", ""))
        if not isinstance(data, dict) or not task:
            return None
        series = self.series[task]
        if isinstance(data.get("ledger"), dict):
            series.ledger.update(data["ledger"])
        if data.get("kind") == "ledger":  # rows sent between samples: only the collective moved
            series.latest = {**series.latest, **series.collective()}
            return {**series.latest, "task": task, "steps": [], "ledger_only": True}
        t = as_float(rec.get("time"))
        util, mem = gpu_summary(data.get("gpus"))
        latest: PaneLatest = {"time": t, "cpu_percent": as_float(data.get("cpu_percent")),
                  "rss_mb": as_float(data.get("rss_mb")), "gpu_util_percent": util,
                  "gpu_mem_mb": mem, "gpus": len(data.get("gpus") or ()),
                  "step": data.get("step"),
                  "total_steps": data.get("total_steps"), **series.collective()}
        series.latest = latest
        series.samples.append([t, latest["cpu_percent"], latest["rss_mb"], util, mem])
        steps: list[Point] = []
        for row in data.get("steps") or ():
            if not isinstance(row, list) or len(row) < 3:
                continue
            steps.append([row[0], as_float(row[1]), as_float(row[2]),
                          as_float(row[3]) if len(row) > 3 else None])
            series.steps.append(steps[-1])
            self._lateness(task, row, lateness)
        return {**latest, "task": task, "steps": steps}

    def _expected(self) -> set[str]:
        """The tasks whose steps are lined up for lateness: workers and the chief."""
        tasks = (self.state or {}).get("tasks") or []
        named = {t.get("task") for t in tasks if isinstance(t, dict)
                 and t.get("role") in ("worker", "chief")}
        return {n for n in named if n} or set(self.series)

    def _lateness(self, task: str, row: list[object], out: list[LatenessPoint]) -> None:
        """Line step ``row[0]`` up across tasks; when every task has it, how long the others
        waited for each (docs/design.md, stragglers by lateness)."""
        if len(row) < 5 or not isinstance(row[0], int):
            return
        expected = self._expected()
        if task not in expected or len(expected) < 2:
            return
        rows = self._pending.setdefault(row[0], {})
        rows[task] = row
        if expected <= set(rows):
            del self._pending[row[0]]
            try:
                lags = step_lags({t: rows[t] for t in expected})
            except (TypeError, ValueError, IndexError):
                return
            for name, lag in lags.items():
                lag_ms = round(lag, 3)
                self.series[name].lateness.append([row[0], lag_ms])
                out.append({"task": name, "step": row[0], "lateness_ms": lag_ms})
        while len(self._pending) > PENDING_STEPS:
            del self._pending[min(self._pending)]

    # ------------------------------------------------------------------ what the API returns
    def summary(self, alert_list: bool = False) -> Summary:
        """What the listing shows; ``alert_list``: with the alerts' texts too."""
        state: StateDoc = self.state or {}
        tasks = [t.copy() for t in state.get("tasks") or [] if isinstance(t, dict)]
        if not tasks:
            tasks = [{"task": name, "state": "unknown", "step": None} for name in self._task_dirs()]
        alerts = state.get("alerts") or []
        controller = state.get("controller") or {}
        out: Summary = {
            "id": self.id, "spec": state.get("spec") or _spec_of(tasks),
            "state": self.status, "controller_state": state.get("state"),
            "run_dir": str(self.path), "started": state.get("started"),
            "updated": state.get("updated"), "stopped": state.get("stopped"),
            "controller": {"pid": controller.get("pid"), "host": controller.get("host")},
            "tasks": [_task_line(t) for t in tasks], "alerts": len(alerts)}
        if alert_list:
            out["alert_list"] = list(alerts)
        return out

    def detail(self) -> Detail:
        """The summary, the log tail, every task's series, the lateness chart's floor (the
        smallest lag the straggler detector speaks for, diagnostics/straggler.py) and the
        charts' axes as the notebook widget draws them (chart_axes.py)."""
        return {**self.summary(alert_list=True), "logs": list(self.lines),
                "series": {name: s.to_json() for name, s in self.series.items()},
                "lateness_floor_ms": MIN_LAG_MS,
                "charts": [c.to_json() for c in chart_axes.CHARTS],
                "window_s": chart_axes.WINDOW_S, "no_gpu": chart_axes.NO_GPU}

    def _task_dirs(self) -> list[str]:
        """The tasks of the run's task directories, in task order (``worker:2`` before
        ``worker:10``, the chief first), as the cluster lists them."""
        try:
            names = os.listdir(self.path / "tasks")
        except OSError:
            return []
        return sorted((f"{m.group(1)}:{m.group(2)}" for n in names if (m := TASK_DIR.match(n))),
                      key=task_order)


def _task_line(t: StateTask) -> TaskLine:
    return {"task": t.get("task"), "role": t.get("role"), "state": t.get("state"),
            "step": t.get("step"), "pid": t.get("pid"), "host": t.get("host"),
            "step_time_ms": t.get("step_time_ms"), "lateness_ms": t.get("lateness_ms"),
            "straggler": t.get("straggler"), "gpus": t.get("gpus"),
            # a console can be opened now (lab/consoles.py)
            "console": bool(t.get("connection_file")) and t.get("state") not in NO_KERNEL}


def _spec_of(tasks: list[StateTask]) -> str:
    counts: dict[str, int] = {}
    for t in tasks:
        role = str(t.get("task", "")).partition(":")[0]
        counts[role] = counts.get(role, 0) + 1
    return spec_words(counts)
