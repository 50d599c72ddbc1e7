"""Stragglers (pure): the task the others keep waiting for.

Under synchronous training every task's step takes as long as the slowest one's, and a
distributed iterator even synchronises the input fetch, so neither step time nor input wait tells
the straggler apart (docs/design.md, Facts). What does is *arrival*: the wall time at which each
task enters the step's collectives (stamped by the worker for eager collectives, else when its
own input fetch returned or it began the step). The straggler arrives last, step after step; its
lateness is the time everyone else spends waiting for it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfdist_nb.samples import GpuReading, sample_gpus

WINDOW = 20
MIN_STEPS = 8
LAST_FRACTION = 0.7
LAG_RATIO = 0.3  # of the median step time: "consistently over 1.3x the others"
# And at least this much a step: on a busy host the OS scheduler alone makes a healthy task
# arrive 1-3 ms late step after step, which passes the ratio (docs/performance.md, "The
# straggler detector's absolute floor").
MIN_LAG_MS = 10.0


@dataclass(frozen=True)
class Straggler:
    task: str
    lag_ms: float
    last_fraction: float
    steps: int
    step_ms: float

    def __str__(self) -> str:
        return (f"{self.task} is a straggler: the others wait {self.lag_ms:.0f} ms a step for "
                f"it; it was the last to arrive in {self.last_fraction:.0%} of the last "
                f"{self.steps} steps (step time {self.step_ms:.0f} ms)")


def step_lags(rows: dict[str, list[Any]]) -> dict[str, float]:
    """How long the others waited for each task in one step, in ms.

    With collective entry stamps (eager collectives), the lateness at each collective, in the
    order the step ran them, summed: a task late at its gradient all-reduce is found even when
    everyone fetched the batch together. Without stamps, the lateness of the arrival."""
    stamps = {t: (r[6] if len(r) > 6 and r[6] else []) for t, r in rows.items()}
    n = min(len(v) for v in stamps.values())
    if n:
        lags = dict.fromkeys(rows, 0.0)
        for j in range(n):
            first = min(v[j] for v in stamps.values())
            for t, v in stamps.items():
                lags[t] += (v[j] - first) * 1000.0
        return lags
    arrivals = {t: float(r[4]) for t, r in rows.items()}
    first = min(arrivals.values())
    return {t: (a - first) * 1000.0 for t, a in arrivals.items()}


def find_stragglers(steps: dict[str, list[list[Any]]], window: int = WINDOW) -> list[Straggler]:
    """``steps``: per task, rows ``[step, begin, duration_ms, input_wait_ms, arrival,
    local_fetch_ms, collective_entries]`` (the last two optional)."""
    if len(steps) < 2:
        return []
    by_step: dict[int, dict[str, list[Any]]] = {}
    for task, rows in steps.items():
        for row in rows:
            if len(row) >= 5 and row[4] is not None:
                by_step.setdefault(int(row[0]), {})[task] = row
    common = sorted(s for s, found in by_step.items() if len(found) == len(steps))
    recent = common[-window:]
    if len(recent) < MIN_STEPS:
        return []
    durations = [float(r[2]) for rows in steps.values() for r in rows[-window:]
                 if r[2] is not None]
    step_ms = statistics.median(durations) if durations else 0.0
    per_step = [step_lags(by_step[s]) for s in recent]
    out = []
    for task in steps:
        lags = [lag[task] for lag in per_step]
        last = sum(lag[task] == max(lag.values()) and lag[task] > 0 for lag in per_step)
        lag, fraction = statistics.median(lags), last / len(recent)
        if (fraction >= LAST_FRACTION and lag >= MIN_LAG_MS
                and lag > LAG_RATIO * max(step_ms - lag, 1.0)):
            out.append(Straggler(task, lag, fraction, len(recent), step_ms))
    return out


INPUT_BOUND_RATIO = 2.0


def input_bound(own_fetch_ms: float | None, others_fetch_ms: list[float]) -> bool:
    """Its own tf.data fetch is what makes it late: over twice the others' and over 5 ms."""
    if own_fetch_ms is None or not others_fetch_ms:
        return False
    return own_fetch_ms > 5.0 and own_fetch_ms > INPUT_BOUND_RATIO * max(others_fetch_ms)


def evidence(latest: Mapping[str, object], input_wait_ms: float | None,
             local_fetch_ms: float | None = None,
             others_fetch_ms: list[float] | None = None) -> str:
    """What may make a task slow, from its last heartbeat: its own input pipeline (local
    fetch against the others'), input wait, its CPU against its host's load (contention), and
    a GPU that is held back (:func:`gpu_slowdown`; a healthy GPU is not mentioned)."""
    parts = []
    if input_bound(local_fetch_ms, others_fetch_ms or []):
        parts.append(f"cause: its input pipeline - its own tf.data fetch takes "
                     f"{local_fetch_ms:.0f} ms per batch against "
                     f"{max(others_fetch_ms or [0]):.0f} ms on the other tasks")
    parts += [f"its input wait {input_wait_ms or 0:.0f} ms",
             f"its CPU {latest.get('cpu_percent') or 0:.0f}%",
             f"host load {latest.get('load1') or 0:.1f} on {latest.get('cpus')} cores"]
    parts += [said for gpu in sample_gpus(latest) if (said := gpu_slowdown(gpu))]
    return "; ".join(parts)


SLOW_CLOCK = 0.85  # of the SM clock's maximum, on a GPU that is not idle


def gpu_slowdown(gpu: GpuReading) -> str | None:
    """What holds one GPU back, from its reading: its clock event reasons (idle aside), an SM
    clock well under its maximum, a PCIe link narrower than it can be or replaying; None for a
    healthy GPU (no reason, clock near its maximum)."""
    reasons = [r for r in gpu.get("throttle") or () if r != "gpu_idle"]
    clock, top = gpu.get("sm_clock_mhz"), gpu.get("sm_clock_max_mhz")
    idle = "gpu_idle" in (gpu.get("throttle") or ())
    slow = bool(clock and top and not idle and clock < SLOW_CLOCK * top)
    width, widest = gpu.get("pcie_width"), gpu.get("pcie_width_max")
    narrow = bool(width and widest and width < widest)
    if not (reasons or slow or narrow or gpu.get("pcie_replays")):
        return None
    said = (f"its GPU {gpu.get('index')} at {clock / 1000:.2f} GHz of {top / 1000:.2f} GHz"
            if clock and top else f"its GPU {gpu.get('index')} at {clock or 0:.0f} MHz")
    said += "".join(f", {r.replace('_', ' ')}" for r in reasons)
    if gpu.get("temperature_c") is not None:
        said += f", {gpu['temperature_c']:.0f} C"
    if "sw_power_cap" in reasons and gpu.get("power_w") and gpu.get("power_limit_w"):
        said += f", {gpu['power_w']:.0f} of {gpu['power_limit_w']:.0f} W"
    if narrow:
        said += (f", PCIe gen {gpu.get('pcie_gen')} x{width} of gen {gpu.get('pcie_gen_max')} "
                 f"x{widest}")
    if gpu.get("pcie_replays"):
        said += f", {gpu['pcie_replays']} PCIe replays"
    return said
