"""The dashboard in a real JupyterLab, driven by headless Chromium through Playwright.

JupyterLab (the version pinned in pyproject's test extra) serves on loopback with a token; the
test opens the quickstart notebook, runs all cells, and checks what a user would see: both task
panels with their tf.print lines, and the charts. A screenshot is saved in the test's tmp dir.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gpu_here import visible_nvml_gpus
from tests.support.jupyter_server import CHROMIUM_ARGS, ensure_chromium, jupyter_server
from tests.support.processes import wait_for

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[1]
@pytest.fixture
def lab(tmp_path: Path) -> Iterator[str]:
    shutil.copy(REPO / "examples" / "01_quickstart.ipynb", tmp_path)
    with jupyter_server(tmp_path, tmp_path / "runs", app="lab") as server:
        yield f"{server['base']}/lab/tree/01_quickstart.ipynb?token={server['token']}"


def run_all(page: Any, url: str) -> None:
    """Open the notebook at ``url`` in JupyterLab, take the kernel it offers, and Run All."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    page.goto(url)
    page.locator(".jp-Notebook").first.wait_for(timeout=60_000)
    select = page.locator(".jp-Dialog button", has_text="Select")
    with contextlib.suppress(PlaywrightTimeout):  # JupyterLab may ask for the kernel
        select.wait_for(timeout=10_000)
        select.click()
    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
           ).to_have_count(1, timeout=60_000)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


@pytest.mark.timeout(420)
def test_dashboard_shows_both_tasks_and_charts_in_jupyterlab(lab: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    chromium = ensure_chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            run_all(page, lab)
            first = page.locator(".tfdist-dashboard").first
            first.wait_for(timeout=60_000)
            panels = first.locator(".tfdist-task-panel")
            expect(panels).to_have_count(2, timeout=60_000)
            for i, task in enumerate(("worker:0", "worker:1")):
                expect(panels.nth(i)).to_contain_text(task)
                expect(panels.nth(i).locator(".tfdist-log")).to_contain_text(
                    "loss ", timeout=120_000)  # tf.print from inside the tf.function
            # each chart is drawn once it has data; those without say why in words
            expect(first.locator(".tfdist-chart-cpu svg").first).to_be_visible(
                timeout=120_000)
            if not visible_nvml_gpus():
                expect(first.locator(".tfdist-chart-empty")).to_contain_text(
                    "no GPU on this host")
            expect(page.get_by_text("stopped 2 task(s) of 2 workers")).to_be_visible(
                timeout=240_000)
            first.scroll_into_view_if_needed()
            for i, task in enumerate(("worker:0", "worker:1")):  # the final state, re-rendered
                expect(panels.nth(i).locator(".tfdist-log")).to_contain_text(
                    f"{task} final loss", timeout=30_000)
            time.sleep(1)  # let bqplot finish its transition before the picture
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=False)
            first.screenshot(path=str(tmp_path / "dashboard-widget.png"))
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert (tmp_path / "dashboard-widget.png").stat().st_size > 10_000


@pytest.mark.timeout(420)
def test_the_compact_dashboard_at_32_tasks_in_jupyterlab(lab: str, tmp_path: Path) -> None:
    """32 tasks (no TensorFlow: 32 TF imports do not fit a small machine): one grid row each,
    a full panel for the task the alerts name, aggregated charts."""
    import nbformat
    from playwright.sync_api import expect, sync_playwright

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "from tfdist_nb import Cluster\n"
        "c = Cluster(workers=32, preload=(), start_timeout=180).start()\n"
        "r = c.run('import time, tfdist_nb.worker as tw\\nfor _ in range(5):\\n"
        "    with tw.step():\\n        time.sleep(0.2 if tw.task[1] == 5 else 0.02)')\n"
        "c._note('worker:9', 'a finding about worker:9', 'WARNING')\n"
        "c.dashboard()",
    )]
    nbformat.write(nb, tmp_path / "compact.ipynb")
    url = lab.replace("01_quickstart.ipynb", "compact.ipynb")
    chromium = ensure_chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            run_all(page, url)
            dash = page.locator(".tfdist-dashboard").first
            dash.wait_for(timeout=240_000)
            rows = dash.locator(".tfdist-task-grid tr.tfdist-grid-row")
            expect(rows).to_have_count(32, timeout=60_000)
            expect(rows.nth(31)).to_contain_text("worker:31")
            panels = dash.locator(".tfdist-task-panel")
            expect(panels).to_have_count(1, timeout=30_000)  # the task the alert names
            expect(panels.first).to_contain_text("worker:9")
            # the charts with data (step time, CPU, RSS, and GPU on a GPU host); the others
            # say why in words
            gpus = bool(visible_nvml_gpus())
            expect(dash.locator(".tfdist-chart")).to_have_count(3 + gpus, timeout=30_000)
            expect(dash.locator(".tfdist-chart-empty")).to_contain_text(
                "no input wait measured")
            expect(dash.locator(".tfdist-outliers").first).to_contain_text("worker:5",
                                                                           timeout=30_000)
            dash.screenshot(path=str(tmp_path / "compact.png"))
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert (tmp_path / "compact.png").stat().st_size > 10_000


RUN_20S = ("%%tfcluster 2 workers\n"
           "import time, tfdist_nb.worker as tw\n"
           "for i in range(40):\n"
           "    with tw.step():\n"
           "        time.sleep(0.5)\n"
           "    print('line', i, flush=True)\n")
READ_AXES = (
    "import json, tfdist_nb\n"
    "from tfdist_nb.chart_axes import CHARTS\n"
    "c = tfdist_nb.current()\n"
    "dash = c._dashboard\n"
    "dash.refresh()\n"
    "views = [c.live.view(rt.name) for rt in c.tasks.values()]\n"
    "first = min(v.samples[0][0] for v in views)\n"
    "last = max(v.samples[-1][0] for v in views)\n"
    "axes = {ch.key: {'shown': fig in dash.charts.row.children, 'x': [xs.min, xs.max],\n"
    "                 'y': [ys.min, ys.max]}\n"
    "        for ch, fig, (xs, ys) in zip(CHARTS, dash.charts.figures, dash.charts.scales)}\n"
    "gpus = any(v.latest.get('gpus') for v in views)\n"
    "with open('axes.json', 'w') as f:  # read by the test (a cell out of view is not drawn)\n"
    "    json.dump({'axes': axes, 'span': last - first, 'gpus': gpus}, f)\n")


@pytest.mark.timeout(420)
def test_the_widgets_charts_and_logs_read_as_the_numbers_are(lab: str, tmp_path: Path) -> None:
    """A 20 s cell on 2 workers, in JupyterLab: the CPU and RSS charts start at 0 (100 % = one
    core) and span the run's samples, the charts without data say why in words, and each task's
    log reads oldest first, held at the newest line. Screenshots for a person to look at:
    dashboard-charts.png, dashboard-logs.png in the test's tmp dir."""
    import json

    import nbformat
    from playwright.sync_api import sync_playwright

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src)
                for src in ("%load_ext tfdist_nb", RUN_20S, READ_AXES, "%tfdist_stop")]
    nbformat.write(nb, tmp_path / "charts.ipynb")
    url = lab.replace("01_quickstart.ipynb", "charts.ipynb")
    chromium = ensure_chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            run_all(page, url)
            # while lines still arrive: a panel scrolled up stays on the lines in view (the
            # browser's scroll anchoring, column-reverse), the other keeps following the newest
            dash = page.locator(".tfdist-dashboard").first
            # the scroll container outlives each update of the log's text (it is replaced)
            boxes = dash.locator(".tfdist-task-panel .widget-html:has(.tfdist-log)")
            read = "b => [b.scrollTop, b.scrollHeight, b.clientHeight]"
            wait_for(lambda: boxes.count() == 2 and all(
                boxes.nth(i).evaluate(read)[1] > boxes.nth(i).evaluate(read)[2] + 80
                for i in range(2)), 120, "both logs taller than their panels")
            boxes.nth(0).evaluate("b => { b.scrollTop = -60; }")
            held = boxes.nth(0).evaluate(read)
            wait_for(lambda: boxes.nth(0).evaluate(read)[1] > held[1], 30, "more lines")
            grown = boxes.nth(0).evaluate(read)
            following = boxes.nth(1).evaluate(read)
            boxes.nth(0).evaluate("b => { b.scrollTop = 0; }")  # back to following the newest
            wait_for(lambda: (tmp_path / "axes.json").is_file(), 240, "the axes read")
            said = json.loads((tmp_path / "axes.json").read_text())
            dash = page.locator(".tfdist-dashboard").first
            dash.scroll_into_view_if_needed()
            time.sleep(1)  # let bqplot finish its transition before the picture
            dash.locator(".tfdist-chart-cpu").screenshot(path=str(tmp_path / "cpu.png"))
            dash.screenshot(path=str(tmp_path / "dashboard-charts.png"))
            logs = dash.locator(".tfdist-task-panel .tfdist-log")
            texts = [logs.nth(i).inner_text() for i in range(2)]
            # the scroll container is the log widget itself (column-reverse: 0 is the bottom)
            scrolled = [logs.nth(i).evaluate("e => e.closest('.widget-html').scrollTop")
                        for i in range(2)]
            dash.locator(".tfdist-task-panel").first.screenshot(
                path=str(tmp_path / "dashboard-logs.png"))
            empty = dash.locator(".tfdist-chart-empty").inner_text()
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    axes, span = said["axes"], said["span"]
    assert span >= 15, said  # the cell ran 20 s and the tasks sampled through it
    for key in ("cpu", "rss"):
        assert axes[key]["shown"], said
        assert axes[key]["y"][0] == 0 and axes[key]["x"][0] == 0, said
        assert axes[key]["x"][1] >= span - 0.5, said  # all of the run's samples
    assert axes["cpu"]["y"][1] >= 100
    assert axes["step_time"]["shown"] and axes["step_time"]["y"][0] == 0
    assert not axes["input_wait"]["shown"] and "no input wait measured" in empty
    if not said["gpus"]:
        assert not axes["gpu"]["shown"] and "no GPU on this host" in empty
    for text, top in zip(texts, scrolled, strict=True):
        lines = [ln for ln in text.splitlines() if ln.startswith("line ")]
        assert lines[-1] == "line 39" and lines == sorted(lines, key=lambda s: int(s[5:])), text
        assert abs(top) <= 1, top  # held at the newest line
    # scrolled up 60 px, then the log grew: the same lines in view (60 px plus the growth from
    # the bottom); the panel left at the bottom stayed there
    assert held[0] == -60 and grown[0] == -60 - (grown[1] - held[1]), (held, grown)
    assert abs(following[0]) <= 1, following
    assert (tmp_path / "dashboard-charts.png").stat().st_size > 10_000
