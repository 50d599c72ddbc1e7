"""The dashboard at 32 tasks: a grid row each, panels on demand and for the tasks alerts name,
aggregated charts with the outliers named."""

from __future__ import annotations

import re

import pytest

from tfdist_nb import Cluster
from tfdist_nb.chart_axes import CHARTS
from tfdist_nb.display.compact import named_tasks, outliers
from tfdist_nb.events import Alert


def test_outliers_and_alert_named_tasks() -> None:
    values = {f"worker:{i}": 100.0 + i % 3 for i in range(32)}
    values["worker:7"] = 412.0
    assert outliers(values, " ms") == "worker:7 412 ms (median 101 ms)"
    assert outliers({f"worker:{i}": 100.0 + i % 3 for i in range(32)}, " ms") == ""
    idle = {f"worker:{i}": float(i % 2) for i in range(32)} | {"worker:3": 4.0}
    assert outliers(idle, "%", min_gap=15.0) == ""  # a few % of CPU on idle tasks is noise
    alerts = [Alert("worker:3", "a note"), Alert("worker:9", "straggler"),
              Alert("cluster", "waits for worker:5 to join", about=("worker:12",)),
              Alert("worker:3", "again, naming worker:30 in words only")]
    # by the alert's fields, never its words: worker:30 is only in a sentence
    assert named_tasks(alerts, [f"worker:{i}" for i in range(32)]) == [
        "worker:3", "worker:12", "worker:9"]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_32_tasks_get_the_compact_view() -> None:
    with Cluster(workers=32, preload=(), start_timeout=120) as c:
        # worker:5 works ten times longer per step than the others
        result = c.run("import time, tfdist_nb.worker as tw\nfor _ in range(6):\n"
                       "    with tw.step():\n"
                       "        time.sleep(0.2 if tw.task[1] == 5 else 0.02)\n", timeout=120)
        assert result.ok, result.summary()
        dash = c.dashboard(start=False)
        dash.refresh()
        assert dash.compact and dash.panels == {}
        rows = re.findall(r"data-task='(worker:\d+)'", dash.grid.widget.value)
        assert rows == [f"worker:{i}" for i in range(32)]
        assert dash.charts.notes[0].value.startswith("<small>outliers: worker:5 ")
        # the per-task charts' axes and words (tfdist_nb/chart_axes.py), aggregated
        keys = [c.key for c in CHARTS]
        shown = [keys[dash.charts.panels.index(p)] for p in dash.charts.row.children]
        assert shown[0] == "step_time" and "input_wait" not in shown and "gpu" not in shown
        for key in shown:
            _, ys = dash.charts.scales[keys.index(key)]
            assert ys.min == 0.0 and ys.max >= max(max(b) for b in dash.charts.marks[
                keys.index(key)].y), key
        cpu_y = dash.charts.scales[keys.index("cpu")][1]
        assert cpu_y.max >= 100.0  # a percentage reaches 100 (one core)
        step_x = dash.charts.scales[0][0]
        assert (step_x.min, step_x.max) == (1, 6)  # the steps there are
        assert "<b>input wait (ms)</b>: no input wait measured" in dash.charts.empty.value
        assert "<b>GPU utilisation %</b>: no GPU on this host" in dash.charts.empty.value
        dash.pick.value = "worker:17, nonsense"
        dash.refresh()
        assert list(dash.panels) == ["worker:17"]
        c._note("worker:30", "a finding about this task", "WARNING")
        dash.refresh()
        assert list(dash.panels) == ["worker:17", "worker:30"]
        assert [b for b in dash.panel_box.children] == [p.box for p in dash.panels.values()]
        dash.stop()
