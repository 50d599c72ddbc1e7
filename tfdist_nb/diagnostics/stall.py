"""Stall detection (pure): a busy task that shows no progress for ``stall_timeout`` seconds.

Progress is any of: a new step, a new output line, or a telemetry sample showing the task's own
CPU in use. So a long CPU-bound computation that prints nothing is not a stall, while a task
waiting in a collective (no CPU of its own) or asleep is. A task at an input prompt holds every
task's clock (``StallWatch.hold``): that wait is a person's, not a stall.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Progress:
    step: int
    lines: int
    cpu_percent: float | None
    sample_time: float | None


@dataclass
class StallWatch:
    stall_timeout: float
    cpu_busy_percent: float = 10.0
    _seen: dict[str, Progress] = field(default_factory=dict)
    _since: dict[str, float] = field(default_factory=dict)

    def observe(self, task: str, now: Progress, t: float) -> bool:
        """Record ``now`` for ``task`` at time ``t``; True when it has stalled."""
        before = self._seen.get(task)
        self._seen[task] = now
        if before is None or _moved(before, now, self.cpu_busy_percent):
            self._since[task] = t
        return t - self._since[task] >= self.stall_timeout

    def hold(self, tasks: list[str], t: float) -> None:
        """Count ``tasks`` as moving at ``t``: while a task of the run waits at an input prompt
        the run waits for a person, and the clock starts again once it is answered."""
        for task in tasks:
            self._since[task] = t

    def quiet_for(self, task: str, t: float) -> float:
        return t - self._since.get(task, t)


def _moved(before: Progress, now: Progress, busy: float) -> bool:
    if now.step != before.step or now.lines != before.lines:
        return True
    fresh = now.sample_time is not None and now.sample_time != before.sample_time
    return bool(fresh and now.cpu_percent is not None and now.cpu_percent >= busy)
