"""The JupyterLab panes in a real JupyterLab, driven by headless Debian Chromium (Playwright).

A notebook starts a 2-worker cluster whose tasks print a line and mark a step five times a
second from a background thread, then runs ``%tfdist_status --lab``: the cluster's pane opens,
shows both tasks' rows and their log lines moving; the sidebar lists the cluster and opening it
again reuses the pane; after a page reload the layout restorer brings the pane back and it keeps
updating; once the notebook's kernel is shut down the pane turns read-only with the final state.
Screenshots are kept in the test's tmp dir.
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.support.jupyter_server import CHROMIUM_ARGS, ensure_chromium, jupyter_server

pytestmark = pytest.mark.cluster

BEAT = '''
import threading, time
import tfdist_nb.worker as tw

def beat():
    i = 0
    while True:
        with tw.step():
            time.sleep(0.2)
        print("tick", i, flush=True)
        i += 1

threading.Thread(target=beat, daemon=True).start()
'''

CELLS = [
    "%load_ext tfdist_nb\n"
    "from tfdist_nb import Cluster\n"
    "cluster = Cluster(workers=2, preload=()).start()\n"
    f"cluster.run({BEAT!r})\n"
    "print('started', cluster.id)",
    "%tfdist_status --lab",
]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[dict[str, str]]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "panes.ipynb")
    # this server's own user settings (JUPYTER_CONFIG_DIR below): no news prompt; its
    # workspaces (the layout a reload restores) live there too
    news = (tmp_path / "jupyter-config" / "lab" / "user-settings" / "@jupyterlab" /
            "apputils-extension" / "notification.jupyterlab-settings")
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}))
    with jupyter_server(tmp_path, tmp_path / "runs", app="lab",
                        extra_args=["--KernelManager.shutdown_wait_time=20"]) as server:
        yield server


def api(lab: dict[str, str], path: str, method: str = "GET", body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{lab['base']}{path}", method=method, data=data)
    req.add_header("Authorization", f"token {lab['token']}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def max_tick(page: Any, task: str) -> int:
    text = page.locator(".tfdist-lab-panel .tfdist-lab-log").inner_text()
    ticks = [int(n) for n in re.findall(rf"\[{re.escape(task)}\] tick (\d+)", text)]
    return max(ticks, default=-1)


#: the highest tick number of a task in the pane's log (-1: none yet), in the page
MAX_TICK_JS = """([task, n]) => {
    const log = document.querySelector('.tfdist-lab-panel .tfdist-lab-log');
    const text = log ? log.innerText : '';
    const prefix = '[' + task + '] tick ';
    let best = -1;
    for (const line of text.split('\\n')) {
        if (line.startsWith(prefix)) { best = Math.max(best, parseInt(line.slice(prefix.length))); }
    }
    return best > n;
}"""


def see_ticks_move(page: Any, timeout_ms: int = 20_000) -> None:
    """Both tasks' lines are in the pane's log, and newer ones keep arriving."""
    for task in ("worker:0", "worker:1"):
        page.wait_for_function(MAX_TICK_JS, arg=[task, -1], timeout=timeout_ms)
        page.wait_for_function(MAX_TICK_JS, arg=[task, max_tick(page, task)],
                               timeout=timeout_ms)


@pytest.mark.timeout(240)
def test_lab_pane_opens_survives_a_reload_and_turns_read_only(lab: dict[str, str],
                                                              tmp_path: Path) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    chromium = ensure_chromium()
    url = f"{lab['base']}/lab/tree/panes.ipynb?token={lab['token']}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        try:
            page.goto(url)
            page.locator(".jp-Notebook").first.wait_for(timeout=60_000)
            select = page.locator(".jp-Dialog button", has_text="Select")
            with contextlib.suppress(PlaywrightTimeout):  # JupyterLab asks for the kernel
                select.wait_for(timeout=15_000)
                select.click()
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
                   ).to_have_count(1, timeout=60_000)
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()

            # %tfdist_status --lab opened the pane: both rows, lines moving
            pane = page.locator(".tfdist-lab-panel")
            expect(pane).to_have_count(1, timeout=60_000)
            expect(pane).to_have_attribute("data-state", "live", timeout=30_000)
            cluster_id = pane.get_attribute("data-cluster")
            rows = pane.locator("tr.tfdist-lab-task")
            expect(rows).to_have_count(2, timeout=20_000)
            expect(rows.nth(0)).to_have_attribute("data-task", "worker:0")
            expect(rows.nth(1)).to_have_attribute("data-task", "worker:1")
            see_ticks_move(page)
            expect(pane.locator(".tfdist-lab-chart svg path.tfdist-lab-line-path").first
                   ).to_be_attached(timeout=20_000)
            # the lateness chart's axis reaches the straggler threshold (dashed), so a healthy
            # run's ms of jitter stays flat at its foot instead of filling the chart
            expect(pane.locator(".tfdist-lab-chart svg line.tfdist-lab-floor")).to_have_count(
                1, timeout=20_000)
            page.screenshot(path=str(tmp_path / "pane-live.png"))

            # the sidebar lists it; opening it again reuses the one pane
            page.locator(".jp-SideBar .lm-TabBar-tab[data-id='tfdist-sidebar']").click()
            item = page.locator(f".tfdist-lab-cluster[data-cluster='{cluster_id}']")
            expect(item).to_have_attribute("data-state", "live", timeout=20_000)
            expect(item).to_contain_text("2 workers")
            item.click()
            expect(pane).to_have_count(1)
            expect(pane).to_be_visible()

            # a reload: the layout restorer brings the pane back, still fed
            page.reload()
            pane = page.locator(".tfdist-lab-panel")
            expect(pane).to_have_count(1, timeout=60_000)
            expect(pane).to_have_attribute("data-cluster", cluster_id or "")
            if not pane.is_visible():  # restored but behind the notebook: bring it forward
                page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab",
                             has_text=f"tfdist {cluster_id}").click()
            expect(pane).to_have_attribute("data-state", "live", timeout=30_000)
            expect(pane.locator("tr.tfdist-lab-task")).to_have_count(2, timeout=20_000)
            see_ticks_move(page)

            # the notebook's kernel shut down: its atexit stops the cluster (given the time to,
            # shutdown_wait_time above, even on a loaded machine), the pane goes read-only with
            # the final state
            kernels = api(lab, "/api/kernels")
            assert len(kernels) == 1
            api(lab, f"/api/kernels/{kernels[0]['id']}", method="DELETE")
            expect(pane).to_have_class(re.compile(r"\btfdist-lab-readonly\b"), timeout=30_000)
            expect(pane).to_have_attribute("data-state", "finished")
            rows = pane.locator("tr.tfdist-lab-task")
            for i in range(2):
                expect(rows.nth(i)).to_have_attribute("data-state", "stopped", timeout=10_000)
            expect(pane.locator(".tfdist-lab-note")).to_contain_text("read-only")
            last = max_tick(page, "worker:1")
            assert last > 0
            page.screenshot(path=str(tmp_path / "pane-finished.png"))
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    state = json.loads(next((tmp_path / "runs").glob("*/state.json")).read_text())
    assert state["state"] == "stopped"
