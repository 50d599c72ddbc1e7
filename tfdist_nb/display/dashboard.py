"""The live dashboard: a panel per task and bqplot charts, drawn from the cluster's live store.

It never talks to kernels: a timer thread reads :class:`~tfdist_nb.store.tails.LiveStore` a few
times a second and pushes only what changed, so the number of widget updates is bounded by time,
not by how much the tasks print. Log panels show a bounded tail and say how many lines are on disk.
"""

from __future__ import annotations

import html
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import bqplot as bq
import ipywidgets as w

from tfdist_nb import chart_axes as axes
from tfdist_nb.chart_axes import CHARTS
from tfdist_nb.diagnostics.hangs import describe_row
from tfdist_nb.display.compact import (
    COMPACT_AT,
    BandCharts,
    RevisionCharts,
    TaskGrid,
    grid_rows,
    named_tasks,
    set_value,
)
from tfdist_nb.display.printer import task_colour
from tfdist_nb.events import Alert
from tfdist_nb.ledger_runs import LedgerRow
from tfdist_nb.results import ANSI
from tfdist_nb.store.snapshot import ClusterSnapshot
from tfdist_nb.store.tails import LiveStore, TaskView

logger = logging.getLogger(__name__)
REFRESH_S = 0.5
PANEL_LINES = 30
STATE_COLOURS = {"starting": "#9e9e9e", "idle": "#2e7d32", "busy": "#1565c0",
                 "prompt": "#00838f", "stalled": "#ef6c00", "dead": "#c62828",
                 "restarting": "#6a1b9a", "stopped": "#616161"}
_ANSI_HEX = {"34": "#1f77b4", "35": "#9467bd", "36": "#17becf", "32": "#2ca02c",
             "33": "#bcbd22", "94": "#ff7f0e", "95": "#e377c2", "96": "#8c564b"}


def colour_of(task: str) -> str:
    return _ANSI_HEX.get(task_colour(task), "#333333")


class TaskPanel:
    """One task: state badge, step progress, resource line, filtered log tail."""

    def __init__(self, task: str, run_dir: str) -> None:
        self.task = task
        self.run_dir = run_dir
        self.title = w.HTML()
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="98%"))
        self.stats = w.HTML()
        self.stream = w.Dropdown(options=["all", "stdout", "stderr"], value="all",
                                 layout=w.Layout(width="90px"))
        self.grep = w.Text(placeholder="regex filter", layout=w.Layout(width="160px"))
        # oldest first, held at the newest line: the scroll container is the widget itself (it
        # outlives each update of its text), laid out bottom up so it starts at the bottom
        self.log = w.HTML(layout=w.Layout(max_height="260px", overflow="auto", display="flex",
                                          flex_flow="column-reverse"))
        self.footer = w.HTML()
        self.box = w.VBox([self.title, self.progress, self.stats,
                           w.HBox([self.stream, self.grep]), self.log, self.footer],
                          layout=w.Layout(border=f"2px solid {colour_of(task)}",
                                          padding="4px", margin="2px", width="49%"))
        self.box.add_class("tfdist-task-panel")
        self._seen: tuple[Any, ...] = ()
        self.stream.observe(lambda _: self.invalidate(), "value")
        self.grep.observe(lambda _: self.invalidate(), "value")

    def invalidate(self) -> None:
        self._seen = ()

    def update(self, view: TaskView, state: str, pid: int | None, straggler: bool = False,
               disk_trouble: str | None = None, waits_for_prompt: tuple[str, ...] = (),
               gpus: str = "") -> bool:
        """``waits_for_prompt``: the tasks at an input prompt its collective waits for (said
        beside the badge: a wait for a person, not a hang); ``gpus``: the GPUs it was given."""
        inside = view.ledger.current()
        # while the task waits in a collective the panel counts the seconds
        ticking = int(time.time()) if inside is not None else 0
        key = (view.revision, state, straggler, self.stream.value, self.grep.value, ticking,
               disk_trouble, waits_for_prompt, gpus)
        if key == self._seen:
            return False
        self._seen = key
        badge = STATE_COLOURS.get(state, "#333")
        self.title.value = (
            f"<b style='color:{colour_of(self.task)}'>{html.escape(self.task)}</b> "
            f"<span style='background:{badge};color:white;padding:1px 6px;border-radius:8px'>"
            f"{state}</span> <small>pid {pid or '-'}"
            + (f" · GPU {html.escape(gpus)}" if gpus else "") + "</small>"
            + (" <span style='background:#ef6c00;color:white;padding:1px 6px;"
               "border-radius:8px'>straggler</span>" if straggler else "")
            + (f" <small>waits for {html.escape(', '.join(waits_for_prompt))} at a prompt"
               "</small>" if waits_for_prompt else ""))
        total = view.total_steps or 0
        self.progress.max = max(total, view.step_count, 1)
        self.progress.value = view.step_count
        self.progress.description = f"{view.step_count}" + (f"/{total}" if total else "")
        self.stats.value = _stats_html(view) + _collective_html(inside)
        lines = self._filtered(view)
        self.log.value = ("<pre class='tfdist-log' style='font-size:11px;margin:0;"
                          "white-space:pre-wrap'>"
                          + "\n".join(html.escape(ANSI.sub("", x)) for x in lines) + "</pre>")
        kept = (f"all are on disk in {html.escape(self.run_dir)}/events.jsonl" if not disk_trouble
                else f"the run directory cannot be written now ({html.escape(disk_trouble)}): "
                "the lines not on disk yet are held in memory")
        self.footer.value = (f"<small>newest last: {len(lines)} of {view.lines_total} lines; "
                             f"{kept} (<code>%tfdist_logs --on {self.task}</code>)</small>")
        return True

    def _filtered(self, view: TaskView) -> list[str]:
        try:
            pattern = re.compile(self.grep.value) if self.grep.value else None
        except re.error:
            pattern = None
        wanted = self.stream.value
        out = []
        for line in reversed(view.lines):
            if wanted != "all" and line.stream != wanted:
                continue
            if pattern is not None and not pattern.search(line.text):
                continue
            out.append(line.text)
            if len(out) == PANEL_LINES:
                break
        return out[::-1]


COLLECTIVE_SHOWN_AFTER_S = 0.5
COLLECTIVE_LONG_S = 5.0


def _collective_html(row: LedgerRow | None) -> str:
    """The collective the task is in and how long it has waited (from its ledger); nothing for
    one that completes at once, orange once the wait is long."""
    if row is None:
        return ""
    waited = time.time() - row["entered"]
    if waited < COLLECTIVE_SHOWN_AFTER_S:
        return ""
    colour = "#ef6c00" if waited >= COLLECTIVE_LONG_S else "#555"
    return (f"<br><small class='tfdist-collective' style='color:{colour}'>in "
            f"{html.escape(describe_row(row))} for {waited:.0f} s</small>")


def _stats_html(view: TaskView) -> str:
    latest = view.latest

    def fmt(value: float | None, unit: str, digits: int = 0) -> str:
        return "-" if value is None else f"{value:.{digits}f}{unit}"

    # the host's interfaces unless the task has a network namespace of its own
    net = {"task-netns": "net", "cluster-netns": "cluster net"}.get(
        latest.get("net_scope") or "", "host net")
    gpu = ("no GPU" if not latest.get("gpus") else
           f"GPU {fmt(latest.get('gpu_util_percent'), '%')} "
           f"{fmt(latest.get('gpu_mem_mb'), ' MB')}")
    return ("<small>"
            f"step {fmt(view.step_time_ms(), ' ms', 1)} · input wait "
            f"{fmt(view.input_wait_ms(), ' ms', 1)} · CPU {fmt(latest.get('cpu_percent'), '%')}"
            f" · RSS {fmt(latest.get('rss_mb'), ' MB')} · {gpu} · {net} "
            f"{fmt(latest.get('net_rx_mb_s'), '', 2)}/{fmt(latest.get('net_tx_mb_s'), ' MB/s', 2)}"
            "</small>")


class Charts(RevisionCharts):
    """bqplot charts, one line per task: step time and input wait over steps (a straggler's
    slow input stands out there even when synchronous training evens out the step times), and
    CPU / RSS / GPU over time, on the axes :mod:`tfdist_nb.chart_axes` chooses (from 0; the
    whole run while short). One Lines mark per task (tasks have different numbers of points;
    bqplot wants a rectangle per mark), sharing the figure's scales."""

    def __init__(self, tasks: list[str]) -> None:
        self.tasks = tasks
        self.figures: list[bq.Figure] = []
        self.marks: list[list[bq.Lines]] = []
        self.scales: list[tuple[bq.LinearScale, bq.LinearScale]] = []
        for chart in CHARTS:
            xs, ys = bq.LinearScale(min=0.0, max=1.0), bq.LinearScale(min=0.0, max=1.0)
            marks = [bq.Lines(x=[0.0], y=[0.0], colors=[colour_of(t)], labels=[t],
                              display_legend=True, scales={"x": xs, "y": ys}) for t in tasks]
            self.figures.append(self._figure(chart, marks, chart.title,
                                             w.Layout(width="49%", height="240px")))
            self.marks.append(marks)
            self.scales.append((xs, ys))
        self._boxes()

    def _draw(self, i: int, chart: axes.Chart, views: list[TaskView], t0: float,
              now: float) -> bq.Figure | None:
        shown = [self._points(chart, v, t0, now) for v in views]
        values = [y for _, line in shown for y in line]
        if not values:
            return None
        for (x, y), mark in zip(shown, self.marks[i], strict=True):
            if x and (len(x) != len(mark.x) or x[-1] != mark.x[-1]):
                with mark.hold_sync():
                    mark.x, mark.y = x, y
        xs_all = [x for line, _ in shown for x in line]
        x_first, x_last = (0.0, now - t0) if chart.x == "time" else (min(xs_all), max(xs_all))
        self._rescale(chart, self.scales[i], x_first, x_last, values)
        return self.figures[i]

    @staticmethod
    def _points(chart: axes.Chart, view: TaskView, t0: float,
                now: float) -> tuple[list[float], list[float]]:
        """A task's points of ``chart``: its last CHART_POINTS steps, or its samples of the
        time window (seconds since ``t0``)."""
        values = Charts._values(chart, view, now)
        xs = [x for x, _ in values] if chart.x == "steps" else [x - t0 for x, _ in values]
        return xs, [y for _, y in values]


def spares_text(snap: ClusterSnapshot) -> str:
    """`` · spares: 2 ready, 1 warming`` for the header (docs/design.md, Spare kernels)."""
    info = snap.spares
    if not info or not info.get("count"):
        return ""
    text = f" · spares: {info['ready']} ready"
    if info.get("warming"):
        text += f", {info['warming']} warming"
    if info.get("note"):
        text += f" ({info['note']})"
    return text


class Dashboard(w.VBox):
    """The whole view of one cluster: an ipywidgets ``VBox`` that refreshes itself
    (docs/reference.md, ``dashboard()``)."""

    def __init__(self, source: Callable[[], ClusterSnapshot], live: LiveStore,
                 refresh_s: float = REFRESH_S) -> None:
        first = source()
        names = [t.name for t in first.tasks]
        run_dir = first.run_dir
        header, alerts = w.HTML(), w.HTML()
        # many tasks: a grid row each, full panels on demand, aggregated charts (compact.py)
        self.compact = len(names) > COMPACT_AT
        self.names, self.run_dir = names, run_dir
        self.grid = TaskGrid() if self.compact else None
        self.pick = w.Text(placeholder="worker:3, worker:17", description="panels for",
                           layout=w.Layout(width="420px")) if self.compact else None
        panels = {} if self.compact else {t: TaskPanel(t, run_dir) for t in names}
        self.panel_box = w.Box([p.box for p in panels.values()],
                               layout=w.Layout(flex_flow="row wrap"))
        charts = BandCharts() if self.compact else Charts(names)
        top = [self.grid.widget, self.pick] if self.grid and self.pick else []
        super().__init__([header, alerts, *top, self.panel_box, charts.box])
        self.add_class("tfdist-dashboard")
        self.source, self.live = source, live
        self.refresh_s = refresh_s
        self.header, self.alerts, self.panels, self.charts = header, alerts, panels, charts
        self.updates = 0
        self._refresh_lock = threading.Lock()
        self._timer_stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.refresh()

    def start(self) -> Dashboard:
        if self._timer is None:
            self._timer = threading.Thread(target=self._main, name="tfdist-dashboard",
                                           daemon=True)
            self._timer.start()
        return self

    def stop(self) -> None:
        """Stop the timer after one last refresh; the widgets stay as they are."""
        self._timer_stop.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.join(2)
        self.refresh()

    def _choose_panels(self, alerts: list[Alert]) -> bool:
        """Compact view: full panels for the tasks typed in ``panels for`` and those the newest
        alerts name; True when the set changed."""
        typed = [t.strip() for t in (self.pick.value if self.pick else "").split(",")]
        wanted = [t for t in typed if t in self.names]
        wanted += [t for t in named_tasks(alerts, self.names) if t not in wanted]
        if list(self.panels) == wanted:
            return False
        self.panels = {t: self.panels.get(t) or TaskPanel(t, self.run_dir) for t in wanted}
        self.panel_box.children = [p.box for p in self.panels.values()]
        return True

    def _main(self) -> None:
        while not self._timer_stop.wait(self.refresh_s):
            self.refresh()

    def refresh(self) -> bool:
        """Push what changed since the last refresh; True if anything was sent. A drawing error
        is logged, never raised: it must not fail the user's cell."""
        try:
            return self._refresh()
        except Exception:
            logger.exception("tfdist_nb: the dashboard could not be refreshed")
            return False

    def _refresh(self) -> bool:
        with self._refresh_lock:
            c = self.source()
            changed = False

            def state_pid(name: str) -> tuple[str, int | None]:
                t = c.task(name)
                return (t.state, t.pid) if t else ("stopped", None)

            views = {name: self.live.view(name) for name in self.names}
            alerts = list(c.alerts)
            if self.grid is not None:
                changed |= self.grid.update(grid_rows(self.names, views, state_pid,
                                                      c.stragglers, alerts,
                                                      {t.name: t.gpus for t in c.tasks}))
                changed |= self._choose_panels(alerts)
            for name, panel in self.panels.items():
                state, pid = state_pid(name)
                snap = c.task(name)
                changed |= panel.update(views[name], state, pid, name in c.stragglers,
                                        c.disk_trouble,
                                        snap.waits_for_prompt if snap is not None else (),
                                        snap.gpus if snap is not None else "")
            changed |= self.charts.update(list(views.values()), self.live.revision)
            header = (f"<b>tfdist_nb</b> {html.escape(c.spec)} · cluster "
                      f"<code>{c.id}</code> · {'running' if c.running else 'stopped'}"
                      f"{html.escape(spares_text(c))}"
                      + (" · <b>persistent mode</b>: every cell runs here" if c.persistent_mode
                         else ""))
            changed |= set_value(self.header, header)
            changed |= set_value(self.alerts, "".join(
                f"<div style='color:#c62828'>⚠ {html.escape(a)}</div>"
                for a in map(str, alerts[-5:])))
            self.updates += changed
            return changed
