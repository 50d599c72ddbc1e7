"""MultiWorkerMirroredStrategy start-up waits as "who waits for whom" (pure; docs/design.md,
Facts), from TensorFlow's own ``Waiting for 1/2 tasks to connect.``, ``Example stragglers:`` and
one line per missing task (``/job:worker/replica:0/task:1``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_WAITING = re.compile(r"Waiting for (\d+)/(\d+) tasks to connect")
_MISSING = re.compile(r"^/job:(\w+)/replica:\d+/task:(\d+)\s*$")


@dataclass
class StartupWait:
    task: str
    missing: int
    total: int
    stragglers: list[str]


@dataclass
class StartupWaitDetector:
    _pending: dict[str, StartupWait] = field(default_factory=dict)

    def feed(self, task: str, text: str) -> StartupWait | None:
        """One output line of ``task``; returns a wait once its straggler list is complete."""
        m = _WAITING.search(text)
        if m:
            done = self._pending.pop(task, None)
            missing, total = int(m.group(1)), int(m.group(2))
            if missing:
                self._pending[task] = StartupWait(task, missing, total, [])
            return done if done and done.stragglers else None
        wait = self._pending.get(task)
        if wait is None:
            return None
        s = _MISSING.match(text.strip())
        if s:
            wait.stragglers.append(f"{s.group(1)}:{s.group(2)}")
            if len(wait.stragglers) >= min(wait.missing, 10):
                return self._pending.pop(task)
        return None
