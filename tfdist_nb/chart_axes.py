"""What each dashboard chart shows and the axes it is drawn on: one home for the notebook
widget (display/dashboard.py) and the JupyterLab pane (lab/model.py serves it to the pane).
Every y axis starts at 0, so two tasks 0.4 points apart look 0.4 points apart, not a chart
apart (docs/reference.md, "Dashboard charts"). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

#: time charts: the whole run while it is shorter than this, else its last WINDOW_S seconds
WINDOW_S = 300.0


@dataclass(frozen=True)
class Chart:
    key: str
    title: str  # with its unit, and what 100 means for a percentage
    x: str  # "steps" (the step number) or "time" (seconds since the first sample)
    column: int  # of a step row ``[step, begin, ms, input wait ms, ...]`` or a sample row
    top_at_least: float  # the y axis reaches at least this (100 for a percentage)
    empty: str  # what the chart says while it has no data

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


CHARTS = (
    Chart("step_time", "step time (ms)", "steps", 2, 1.0,
          "no step timed yet (model.fit times its steps; a custom loop: with tw.step(): ...)"),
    Chart("input_wait", "input wait (ms)", "steps", 3, 1.0,
          "no input wait measured: no step read its batch through tw.timed (for batch in "
          "tw.timed(dataset): with tw.step(): ...)"),
    Chart("cpu", "CPU % (100 = one core)", "time", 1, 100.0, "no CPU sample yet"),
    Chart("rss", "RSS (MB)", "time", 2, 1.0, "no memory sample yet"),
    Chart("gpu", "GPU utilisation %", "time", 3, 100.0, "no GPU readings yet"),
)
BY_KEY = {c.key: c for c in CHARTS}
NO_GPU = "no GPU on this host"


def y_range(chart: Chart, values: Iterable[float]) -> tuple[float, float]:
    """``(0, top)``: from 0 to a round number above the highest value (a tenth of headroom),
    at least ``chart.top_at_least``."""
    high = max((v for v in values if v is not None and math.isfinite(v)), default=0.0)
    return 0.0, max(chart.top_at_least, _round_up(high * 1.1))


def x_range(chart: Chart, first: float | None, last: float | None) -> tuple[float, float]:
    """Steps: the steps there are. Time (seconds since the first sample): the whole run while
    it is shorter than ``WINDOW_S``, else its last ``WINDOW_S`` seconds; at least one second."""
    if first is None or last is None:
        return 0.0, 1.0
    if chart.x == "time":
        span = last - first
        return max(0.0, span - WINDOW_S), max(span, 1.0)
    return first, max(last, first + 1)


def _round_up(value: float) -> float:
    """The next of 1, 2, 5 times a power of ten at or above ``value`` (0 stays 0)."""
    if value <= 0:
        return 0.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)
