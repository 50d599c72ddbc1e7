"""The cluster's event hub: every event of every task passes here, on the loop thread, to
disk first, then the live store, then the listeners. Detectors that read the stream (stragglers,
strategy start-up waits, the tasks' own notes) live here too; a WARNING finding is an alert.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tfdist_nb.diagnostics.gpu_faults import ring_on_gpus
from tfdist_nb.diagnostics.startup import StartupWaitDetector
from tfdist_nb.diagnostics.straggler import Straggler, find_stragglers
from tfdist_nb.diagnostics.straggler import evidence as straggler_evidence
from tfdist_nb.events import Alert, Event, Finding, OutputLine, TaskNote, TelemetrySample
from tfdist_nb.store.rundir import RunDirectory
from tfdist_nb.store.tails import LiveStore

STRAGGLER_ROWS = 60
#: the straggler check reads every task's steps; it waits this many times its own last
#: duration before the next, so it takes at most 1/20 of the loop (docs/performance.md)
STRAGGLER_SPACING = 20.0
ALERTS_KEPT = 50
RUN_DIRECTORY = "run directory"  # the name the disk's troubles are said under
Listener = Callable[[list[Event]], None]


class EventHub:
    """Fans events out to disk, the live store, listeners and detectors. ``task_states``
    gives each task's role and state: stragglers are judged among workers and the chief only."""

    def __init__(self, rundir: RunDirectory, live: LiveStore,
                 task_states: Callable[[], dict[str, tuple[str, str]]]) -> None:
        self.rundir = rundir
        self.live = live
        self._task_states = task_states
        self.alerts: deque[Alert] = deque(maxlen=ALERTS_KEPT)
        self.stragglers: dict[str, Straggler] = {}
        self._startup_waits = StartupWaitDetector()
        self._waits_said: dict[str, int] = {}  # task -> start-up waits TF reported this cell
        self._running: set[str] = set()  # the tasks the current cell was sent to
        self._listeners: tuple[Listener, ...] = ()
        self._lock = threading.Lock()
        self._cell_started = 0.0
        self._findings_said: set[tuple[str, str]] = set()  # (kind, text) alerted already
        #: each task's last MultiWorkerMirroredStrategy, as it said (``Finding.STRATEGY`` facts)
        self.strategies: dict[str, dict[str, Any]] = {}
        self._straggler_next = 0.0  # time.monotonic() before which a check waits
        self._straggler_later: asyncio.TimerHandle | None = None

    def new_cell(self, targets: list[str] | None = None) -> None:
        """Stragglers are judged afresh in each cell, on its own steps."""
        self.stragglers, self._cell_started = {}, time.time()
        self._waits_said = {}
        self._running = set(targets or ())

    def add_listener(self, fn: Listener) -> None:
        with self._lock:
            self._listeners = (*self._listeners, fn)

    def remove_listener(self, fn: Listener) -> None:
        with self._lock:
            self._listeners = tuple(f for f in self._listeners if f is not fn)

    def sink(self, events: list[Event]) -> None:
        disk = self.rundir.write_events(events)
        self.live.add_many(events)
        for fn in self._listeners:
            fn(events)
        stepped = False
        for event in events:
            if isinstance(event, OutputLine) and event.stream == "stderr":
                self._check_startup_wait(event)
            elif isinstance(event, TelemetrySample):
                for note in event.data.get("notes") or ():
                    self._task_note(event.task, note)
                stepped = stepped or bool(event.data.get("steps"))
        if stepped:
            self._stragglers_due()
        if disk is not None:
            self.note(RUN_DIRECTORY, *disk)

    def _task_note(self, task: str, note: dict[str, Any]) -> None:
        """A task's note; one of a ``finding`` kind that another task said already in the same
        words (every task makes the same strategy) is kept with the events, not alerted again."""
        text, level, finding = note.get("text", ""), note.get("level", "INFO"), note.get("finding")
        if finding:
            if finding != Finding.STRATEGY:  # a record of what was made, not a finding
                self.live.view(task).findings.add(str(finding))
            if (finding, text) in self._findings_said:
                level = "INFO"
            self._findings_said.add((finding, text))
        self.note(task, text, level, kind=str(finding) if finding else None)
        if finding == Finding.STRATEGY:
            self.strategies[task] = note.get("facts") or {}
            advice = ring_on_gpus(self.strategies[task])
            if advice and (Finding.RING_ON_GPUS, "") not in self._findings_said:
                self._findings_said.add((Finding.RING_ON_GPUS, ""))  # once per cluster
                self.note(task, advice, "WARNING", kind=Finding.RING_ON_GPUS)

    def note(self, task: str, text: str, level: str = "INFO", topic: str | None = None,
             kind: str | None = None, about: tuple[str, ...] = ()) -> None:
        """A finding or a controller message about ``task``, kept with its events; ``topic``
        what a program finds it by (``events.HANG``); a warning is also an ``Alert`` of
        ``kind`` (default: the topic) concerning ``task`` and the tasks in ``about``."""
        if level in ("WARNING", "ERROR", "CRITICAL"):
            self.alerts.append(Alert(task, text, level, kind or topic, about))
        self.sink([TaskNote(time.time(), task, text, level, topic=topic)])

    def _stragglers_due(self) -> None:
        """Check now, or once the spacing after the last check has passed (on the loop: no
        step record goes unjudged, the last one of a cell included)."""
        wait = self._straggler_next - time.monotonic()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside the loop (a test feeding the hub): at once
            loop, wait = None, 0.0
        if wait <= 0.0:
            self._check_stragglers()
        elif loop is not None and self._straggler_later is None:
            self._straggler_later = loop.call_later(wait, self._check_stragglers)

    def _check_stragglers(self) -> None:
        began = time.monotonic()
        if self._straggler_later is not None:
            self._straggler_later.cancel()
            self._straggler_later = None
        roles = self._task_states()
        steps = {name: [r for r in list(self.live.view(name).steps)[-STRAGGLER_ROWS:]
                        if r[1] >= self._cell_started]
                 for name, (role, _) in roles.items() if role in ("worker", "chief")}
        found = {s.task: s for s in find_stragglers(steps)}
        since = self._cell_started
        for task, finding in found.items():
            if task in self.stragglers:
                continue
            view = self.live.view(task)
            others = [f for name in steps if name != task
                      if (f := self.live.view(name).local_fetch_ms(since=since)) is not None]
            why = straggler_evidence(view.latest, view.input_wait_ms(),
                                     view.local_fetch_ms(since=since), others)
            self.note(task, f"{finding}; {why}", "WARNING", kind="straggler")
        self.stragglers = found
        ended = time.monotonic()
        self._straggler_next = ended + STRAGGLER_SPACING * (ended - began)

    def _check_startup_wait(self, line: OutputLine) -> None:
        wait = self._startup_waits.feed(line.task, line.text)
        if wait is None or set(wait.stragglers) <= {wait.task}:
            # the coordination leader briefly lists its own agent, which joins a moment later
            return
        states = self._task_states()
        said = self._waits_said[wait.task] = self._waits_said.get(wait.task, 0) + 1
        if said == 1 and set(wait.stragglers) <= self._running:
            # a healthy start: every task it waits for was sent this cell and joins in a
            # moment; TensorFlow repeats the line while the wait lasts, and that is said
            return
        named = [f"{n} ({states[n][1] if n in states else 'not in this cluster'})"
                 for n in wait.stragglers]
        self.note(wait.task, f"creating the strategy waits for {wait.missing}/{wait.total} "
                  f"task(s) to join: {', '.join(named)}; run the cell on every task, and "
                  "%tfdist_check all checks TF_CONFIG, the network and the environment",
                  "WARNING", kind="startup_wait", about=tuple(wait.stragglers))

