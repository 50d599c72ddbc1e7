"""Bounded recent tails of every task for the dashboard and ``status()`` (the run directory
keeps everything). Written on the loop thread, read from the notebook's; a revision per task
tells a view cheaply whether anything changed.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tfdist_nb.events import Event, OutputLine, TelemetrySample, gpu_summary
from tfdist_nb.store.collectives import LedgerView

TAIL_LINES = 500
TAIL_SAMPLES = 900  # 15 minutes at one sample a second
TAIL_STEPS = 5000
RECENT_STEPS = 20


@dataclass
class TaskView:
    task: str
    lines: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    lines_total: int = 0
    samples: deque = field(default_factory=lambda: deque(maxlen=TAIL_SAMPLES))
    steps: deque = field(default_factory=lambda: deque(maxlen=TAIL_STEPS))
    #: the last ``samples.Sample``, with the GPU readings summed up (``events.gpu_summary``) as
    #: ``gpu_util_percent`` and ``gpu_mem_mb``; {} before the first
    latest: dict[str, Any] = field(default_factory=dict)
    step_count: int = 0
    total_steps: int | None = None
    last_output: float | None = None
    last_sample: float | None = None
    revision: int = 0
    ledger: LedgerView = field(default_factory=LedgerView)
    sample_seq: int = 0
    process: int = 0  # counts the processes seen under this name (a restart starts anew)
    findings: set[str] = field(default_factory=set)  # this process's (events.Finding)

    def new_process(self) -> None:
        """A restart: the ledger and the step count begin again with the new process."""
        self.ledger.reset()
        self.step_count, self.sample_seq, self.process = 0, 0, self.process + 1
        self.findings = set()

    def step_mark(self) -> tuple[int, int]:
        """Where the count stands now, for :meth:`steps_since` (the count is over a life)."""
        return self.process, self.step_count

    def steps_since(self, mark: tuple[int, int]) -> int:
        """Steps made since ``mark``; all of this process's when it was restarted since."""
        process, before = mark
        return self.step_count - before if process == self.process else self.step_count

    def step_time_ms(self, window: int = RECENT_STEPS) -> float | None:
        recent = [s[2] for s in list(self.steps)[-window:]]
        return statistics.median(recent) if recent else None

    def input_wait_ms(self, window: int = RECENT_STEPS) -> float | None:
        recent = [s[3] for s in list(self.steps)[-window:] if s[3] is not None]
        return statistics.median(recent) if recent else None

    def local_fetch_ms(self, window: int = RECENT_STEPS, since: float = 0.0) -> float | None:
        """Median time this task's own pipeline took per batch (distributed iterators only),
        over its last ``window`` steps begun after ``since``."""
        recent = [s[5] for s in list(self.steps)[-window:]
                  if len(s) > 5 and s[5] is not None and s[1] >= since]
        return statistics.median(recent) if recent else None


class LiveStore:
    def __init__(self) -> None:
        self._tasks: dict[str, TaskView] = {}
        self._lock = threading.Lock()
        self.revision = 0

    def view(self, task: str) -> TaskView:
        with self._lock:
            if task not in self._tasks:
                self._tasks[task] = TaskView(task)
            return self._tasks[task]

    def tasks(self) -> list[str]:
        with self._lock:
            return list(self._tasks)

    def add_many(self, events: list[Event]) -> None:
        """A batch from one message: the lines of one task go in together (one revision)."""
        first = events[0] if events else None
        if isinstance(first, OutputLine) and all(isinstance(e, OutputLine) and e.task == first.task
                                                 for e in events):
            self._add_lines(self.view(first.task), events)  # type: ignore[arg-type]
            return
        for event in events:
            self.add(event)

    def add(self, event: Event) -> None:
        if isinstance(event, OutputLine):
            self._add_lines(self.view(event.task), [event])
        elif isinstance(event, TelemetrySample):
            self._add_sample(self.view(event.task), event)

    def _add_lines(self, v: TaskView, lines: list[OutputLine]) -> None:
        v.lines.extend(lines)
        v.lines_total += len(lines)
        v.last_output = lines[-1].time
        v.revision += 1
        self.revision += 1

    def _add_sample(self, v: TaskView, event: TelemetrySample) -> None:
        d = event.data
        if d.get("kind") == "ledger":  # rows sent early, between samples (worker.telemetry)
            v.ledger.update(d["ledger"])
            v.step_count = max(v.step_count, int(d.get("step") or 0))
            v.revision += 1
            self.revision += 1
            return
        seq = int(d.get("seq") or 0)
        if seq and seq < v.sample_seq:  # a new process under this name, not restarted by us
            v.new_process()
        v.sample_seq = seq
        if d.get("ledger"):
            v.ledger.update(d["ledger"])
        util, mem = gpu_summary(d.get("gpus"))
        v.latest = {**d, "gpu_util_percent": util, "gpu_mem_mb": mem}
        v.samples.append((event.time, d.get("cpu_percent"), d.get("rss_mb"), util, mem,
                          d.get("net_rx_mb_s"), d.get("net_tx_mb_s")))
        v.steps.extend(d.get("steps") or [])
        v.step_count = max(v.step_count, int(d.get("step") or 0))
        v.total_steps = d.get("total_steps")
        v.last_sample = event.time
        v.revision += 1
        self.revision += 1
