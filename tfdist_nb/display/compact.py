"""The dashboard at 32-64 tasks: one grid row per task, full panels only for the tasks the user
picks or the alerts name, and charts that aggregate (min / median / max across tasks) and name
the outliers, so the page stays readable and each refresh stays one small update.
"""

from __future__ import annotations

import html
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import TypedDict

import bqplot as bq
import ipywidgets as w

from tfdist_nb import chart_axes as axes
from tfdist_nb.chart_axes import CHARTS, NO_GPU
from tfdist_nb.events import Alert
from tfdist_nb.store.tails import TaskView

COMPACT_AT = 8  # more tasks than this: the compact view
ALERT_PANELS = 4  # tasks named by the newest alerts that get a full panel of their own
CHART_POINTS = 300
OUTLIER_SPREAD = 3.0  # median absolute deviations from the median that make an outlier
OUTLIER_MIN_GAP = 0.2  # ... and at least this far from the median, relative
_STATE_BG = {"starting": "#eeeeee", "idle": "#e8f5e9", "busy": "#e3f2fd", "prompt": "#e0f7fa",
             "stalled": "#fff3e0", "dead": "#ffebee", "restarting": "#f3e5f5",
             "stopped": "#f5f5f5"}


def set_value(widget: w.ValueWidget, value: object) -> bool:
    """Set ``widget.value`` only when it differs (each set is an update sent); True if set."""
    if value == widget.value:
        return False
    widget.value = value
    return True


def named_tasks(alerts: Iterable[Alert], known: Iterable[str], limit: int = ALERT_PANELS
                ) -> list[str]:
    """The tasks the newest alerts concern (newest first), at most ``limit``."""
    known = set(known)
    found: list[str] = []
    for alert in reversed(list(alerts)):
        for task in alert.tasks:
            if task in known and task not in found:
                found.append(task)
            if len(found) == limit:
                return found
    return found


def outliers(values: dict[str, float], unit: str, min_gap: float = 0.0) -> str:
    """``"worker:7 412 ms (median 120)"`` for the tasks far from the others (and at least
    ``min_gap`` away: a few % of CPU on idle tasks is noise), or ``""``."""
    if len(values) < 4:
        return ""
    med = statistics.median(values.values())
    mad = statistics.median(abs(v - med) for v in values.values()) or abs(med) * 0.05 or 1.0
    far = sorted(((abs(v - med), t, v) for t, v in values.items()
                  if abs(v - med) > OUTLIER_SPREAD * mad
                  and abs(v - med) > max(OUTLIER_MIN_GAP * abs(med), min_gap)),
                 reverse=True)[:4]
    if not far:
        return ""
    return (", ".join(f"{t} {v:.0f}{unit}" for _, t, v in far) + f" (median {med:.0f}{unit})")


class GridRow(TypedDict):
    """A task's row of the grid (``grid_rows``)."""

    task: str
    state: str
    step: int
    step_ms: float | None
    late_ms: float | None  # None: not a straggler
    cpu: float | None
    rss: float | None
    gpus: str  # the GPUs it was given
    gpu: float | None
    alerts: int


class TaskGrid:
    """Every task in one HTML table (one widget update per refresh, whatever the task count)."""

    COLUMNS = ("task", "state", "step", "step ms", "late ms", "CPU %", "RSS MB", "GPUs",
               "GPU %", "alerts")

    def __init__(self) -> None:
        self.widget = w.HTML()
        self.widget.add_class("tfdist-task-grid")

    ROWS_PER_TABLE = 16  # tables side by side: 64 tasks stay on one screen

    def update(self, rows: list[GridRow]) -> bool:
        head = "".join(f"<th style='padding:0 5px;text-align:right'>{c}</th>"
                       for c in self.COLUMNS)
        tables = "".join(
            f"<table style='border-collapse:collapse;font-size:11px;line-height:15px;"
            f"margin:0'><tr>{head}</tr>"
            + "".join(self._row(r) for r in rows[i:i + self.ROWS_PER_TABLE]) + "</table>"
            for i in range(0, len(rows), self.ROWS_PER_TABLE))
        text = f"<div style='display:flex;flex-wrap:wrap;gap:14px'>{tables}</div>"
        return set_value(self.widget, text)

    @staticmethod
    def _row(r: GridRow) -> str:
        def cell(v: object, digits: int = 0) -> str:
            text = "" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))
            return f"<td style='padding:0 5px;text-align:right'>{html.escape(text)}</td>"

        bg = _STATE_BG.get(r["state"], "#ffffff")
        flag = " style='color:#c62828;font-weight:bold'" if r["alerts"] else ""
        return (f"<tr class='tfdist-grid-row' data-task='{html.escape(r['task'])}' "
                f"style='background:{bg}'><td style='padding:0 5px'><b>"
                f"{html.escape(r['task'])}</b></td>{cell(r['state'])}{cell(r['step'])}"
                f"{cell(r['step_ms'], 1)}{cell(r['late_ms'])}{cell(r['cpu'])}{cell(r['rss'])}"
                f"{cell(r['gpus'])}{cell(r['gpu'])}<td{flag}>{r['alerts'] or ''}</td></tr>")


def grid_rows(names: list[str], views: dict[str, TaskView],
              state_pid: Callable[[str], tuple[str, int | None]],
              stragglers: dict[str, float], alerts: list[Alert],
              gpus: Mapping[str, str] | None = None) -> list[GridRow]:
    """One grid row per task; ``stragglers``: task -> lateness (ms); ``gpus``: task -> the GPUs
    it was given."""
    counts = Counter(task for alert in alerts for task in set(alert.tasks))
    rows: list[GridRow] = []
    for name in names:
        v, (state, _) = views[name], state_pid(name)
        latest = v.latest
        rows.append({"task": name, "state": state, "step": v.step_count,
                     "step_ms": v.step_time_ms(), "late_ms": stragglers.get(name),
                     "cpu": latest.get("cpu_percent"), "rss": latest.get("rss_mb"),
                     "gpus": (gpus or {}).get(name, ""),
                     "gpu": latest.get("gpu_util_percent"), "alerts": counts.get(name, 0)})
    return rows


class RevisionCharts:
    """Charts that redraw only when the live store changed since they last drew. A chart
    joins ``row`` when it first has data (bqplot lays out a figure when it is shown: one drawn
    hidden stays without size); until then ``empty`` says why it has none."""

    _seen = -1

    def _boxes(self) -> None:
        self.empty = w.HTML()
        self.empty.add_class("tfdist-chart-empty")
        self.row = w.Box([], layout=w.Layout(flex_flow="row wrap"))
        self.box = w.VBox([self.row, self.empty])

    @staticmethod
    def _figure(chart: axes.Chart, marks: list[bq.Lines], title: str,
                layout: w.Layout) -> bq.Figure:
        xs, ys = marks[0].scales["x"], marks[0].scales["y"]
        fig = bq.Figure(marks=marks, title=title,
                        axes=[bq.Axis(scale=xs, label="step" if chart.x == "steps" else
                                      "seconds since the first sample"),
                              bq.Axis(scale=ys, orientation="vertical")],
                        layout=layout, fig_margin={"top": 30, "bottom": 35, "left": 50,
                                                   "right": 10})
        fig.add_class("tfdist-chart")
        fig.add_class(f"tfdist-chart-{chart.key}")
        return fig

    def update(self, views: list[TaskView], revision: int) -> bool:
        """Draw every chart when the store changed since the last draw; True when it did."""
        if revision == self._seen:
            return False
        self._seen = revision
        t0 = min((v.samples[0][0] for v in views if v.samples), default=time.time())
        now = max((v.samples[-1][0] for v in views if v.samples), default=t0)
        said: list[str] = []
        shown: list[w.DOMWidget] = []
        for i, chart in enumerate(CHARTS):
            drawn = self._draw(i, chart, views, t0, now)
            if drawn is None:
                gpus = any(v.latest.get("gpus") for v in views)
                why = NO_GPU if chart.key == "gpu" and not gpus else chart.empty
                said.append(f"<b>{html.escape(chart.title)}</b>: {html.escape(why)}")
            else:
                shown.append(drawn)
        if tuple(shown) != tuple(self.row.children):
            self.row.children = shown
        text = "<small>" + "<br>".join(said) + "</small>" if said else ""
        set_value(self.empty, text)
        return True

    def _draw(self, i: int, chart: axes.Chart, views: list[TaskView], t0: float,
              now: float) -> w.DOMWidget | None:
        """Draw chart ``i`` (seconds since ``t0``, up to ``now``); the widget that shows it, or
        None when it has no data."""
        raise NotImplementedError

    @staticmethod
    def _values(chart: axes.Chart, view: TaskView, now: float) -> list[tuple[float, float]]:
        """``(x, value)`` of a task's rows with a value for ``chart``: its last CHART_POINTS
        steps (x: the step), or its samples of the time window up to ``now`` (x: the time)."""
        col = chart.column
        if chart.x == "steps":
            return [(r[0], r[col]) for r in list(view.steps)[-CHART_POINTS:]
                    if r[col] is not None]
        return [(r[0], r[col]) for r in view.samples
                if r[col] is not None and r[0] >= now - axes.WINDOW_S]

    @staticmethod
    def _rescale(chart: axes.Chart, scales: tuple[bq.LinearScale, bq.LinearScale],
                 x_first: float, x_last: float, values: list[float]) -> None:
        xs, ys = scales
        x_range, y_range = axes.x_range(chart, x_first, x_last), axes.y_range(chart, values)
        if (xs.min, xs.max) != x_range:
            xs.min, xs.max = x_range
        if (ys.min, ys.max) != y_range:
            ys.min, ys.max = y_range


class BandCharts(RevisionCharts):
    """Per chart of :data:`tfdist_nb.chart_axes.CHARTS`, three lines across all tasks (min,
    median, max) on the axes the per-task charts use (from 0; the whole run while short), the
    outliers named under it."""

    #: per chart key: the unit said with an outlier, and the least gap from the median that is
    #: one (a few % of CPU on idle tasks is noise)
    OUTLIERS = {"step_time": (" ms", 5.0), "input_wait": (" ms", 5.0), "cpu": ("%", 15.0),
                "rss": (" MB", 100.0), "gpu": ("%", 15.0)}

    def __init__(self) -> None:
        self.figures: list[bq.Figure] = []
        self.marks: list[bq.Lines] = []
        self.notes: list[w.HTML] = []
        self.scales: list[tuple[bq.LinearScale, bq.LinearScale]] = []
        self.panels: list[w.VBox] = []
        for chart in CHARTS:
            xs, ys = bq.LinearScale(min=0.0, max=1.0), bq.LinearScale(min=0.0, max=1.0)
            mark = bq.Lines(x=[0.0], y=[[0.0], [0.0], [0.0]],
                            colors=["#90caf9", "#1565c0", "#ef6c00"],
                            labels=["min", "median", "max"], display_legend=True,
                            scales={"x": xs, "y": ys})
            fig = self._figure(chart, [mark], f"{chart.title}: min / median / max of all tasks",
                               w.Layout(width="100%", height="200px"))
            note = w.HTML()
            note.add_class("tfdist-outliers")
            self.figures.append(fig)
            self.marks.append(mark)
            self.notes.append(note)
            self.scales.append((xs, ys))
            self.panels.append(w.VBox([fig, note], layout=w.Layout(width="49%")))
        self._boxes()

    def _draw(self, i: int, chart: axes.Chart, views: list[TaskView], t0: float,
              now: float) -> w.VBox | None:
        per_x, latest = self._bands(chart, views, t0, now)
        if not per_x:
            return None
        x = sorted(per_x)[-CHART_POINTS:]
        bands = [[min(per_x[k]) for k in x], [statistics.median(per_x[k]) for k in x],
                 [max(per_x[k]) for k in x]]
        with self.marks[i].hold_sync():
            self.marks[i].x, self.marks[i].y = x, bands
        x_first, x_last = (0.0, now - t0) if chart.x == "time" else (x[0], x[-1])
        self._rescale(chart, self.scales[i], x_first, x_last, bands[2])
        unit, gap = self.OUTLIERS[chart.key]
        named = outliers(latest, unit, gap)
        text = f"<small>outliers: {html.escape(named)}</small>" if named else ""
        set_value(self.notes[i], text)
        return self.panels[i]

    @staticmethod
    def _bands(chart: axes.Chart, views: list[TaskView], t0: float,
               now: float) -> tuple[dict[float, list[float]], dict[str, float]]:
        """Every task's values of ``chart`` by x (a step, or a whole second since ``t0`` in
        the time window), and each task's recent median (for the outliers)."""
        per_x: dict[float, list[float]] = defaultdict(list)
        latest: dict[str, float] = {}
        for v in views:
            values = RevisionCharts._values(chart, v, now)
            for x, y in values:
                per_x[x if chart.x == "steps" else round(x - t0)].append(y)
            if recent := [y for _, y in values[-20:]]:
                latest[v.task] = statistics.median(recent)
        return per_x, latest
