"""Persistent mode (%tfdist_mode, ipyparallel's %autopx) in a real notebook run with nbclient:
every cell goes to the cluster while it is on, tfdist_nb's own magics still run in the notebook,
a failing cell stops "Run All" like any cell, and line numbers are the notebook's."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.notebooks import cell_text, run_notebook

pytestmark = [pytest.mark.cluster, pytest.mark.compat, pytest.mark.timeout(300)]

SETUP = ["%load_ext tfdist_nb",
         "%%tfcluster 2 workers --no-dashboard --no-warm\nprint('up')"]


def test_cells_go_to_the_cluster_while_the_mode_is_on(tmp_path: Path) -> None:
    nb = run_notebook([
        *SETUP,
        "%tfdist_mode on --no-dashboard",
        "import os, tfdist_nb.worker as tw\nprint('on', tw.task[1], os.environ['TFDIST_TASK'])",
        "%tfdist_mode",
        "x = 41\n"
        "y = x + 1\n"
        "raise ValueError(f'checked {y}')",
        "%tfdist_mode off",
        "import os\nprint('here', 'TFDIST_TASK' in os.environ)",
    ], tmp_path)
    on, said, failed, off, here = (cell_text(nb.cells[i], errors=True) for i in range(3, 8))
    assert "persistent mode: this cell runs on the cluster" in on
    assert "[worker:0] on 0 worker:0" in on and "[worker:1] on 1 worker:1" in on
    assert "persistent mode is on (%%tfcluster --no-dashboard)" in said
    # the traceback names the notebook's own line 3 (no magic line was added to the cell)
    assert "ValueError: checked 42" in failed and "line 3" in failed, failed
    assert "persistent mode off" in off
    assert here.strip() == "here False"  # back in the notebook's own kernel


def test_run_all_stops_at_a_failing_cell_in_persistent_mode(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in [
        *SETUP, "%tfdist_mode on --no-dashboard", "raise RuntimeError('stop here')",
        "print('never runs')", "%tfdist_stop"]]
    client = NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError, match="stop here"):
        client.execute()
    assert nb.cells[4].get("outputs") in (None, [])  # Run All stopped before it


def test_a_bad_line_is_a_usage_error_and_the_mode_stays_off(tmp_path: Path) -> None:
    nb = run_notebook(["%load_ext tfdist_nb", "%tfdist_mode on",
                       "%tfdist_mode on --timeout -3", "%tfdist_mode sideways", "%tfdist_mode",
                       "print('still here')"], tmp_path)
    no_cluster, bad, sideways, state, here = (cell_text(nb.cells[i], errors=True)
                                              for i in range(1, 6))
    assert "UsageError" in no_cluster and "no cluster is running" in no_cluster
    assert "UsageError" in bad and "--timeout must be a positive number" in bad
    assert "UsageError" in sideways and "invalid choice: 'sideways'" in sideways
    assert "persistent mode is off" in state
    assert here.strip() == "still here"


def test_unloading_in_persistent_mode_ends_everything_and_the_mode(tmp_path: Path) -> None:
    """%unload_ext tfdist_nb typed while the mode is on runs in the notebook (it used to be
    sent to the tasks), stops every cluster (not only the current one) and ends the kept
    spares, the fork servers and the private network; the next cell is the notebook's own."""
    nb = run_notebook([
        *SETUP,
        "from tfdist_nb import Cluster\n"
        "other = Cluster(workers=1, preload=(), warm=False).start()\n"
        "from tfdist_nb.cluster import registry\nfirst = registry.live_clusters()\n"
        "print('live', len(first))",
        "%tfdist_mode on --no-dashboard",
        "%unload_ext tfdist_nb",
        "import os\n"
        "from tfdist_nb.cluster import registry\n"
        "from tfdist_nb.launchers import forkserver, private_net\n"
        "print('here', 'TFDIST_TASK' in os.environ, len(registry.live_clusters()),\n"
        "      other.running, len(forkserver.live_servers()), private_net._shared is None)",
    ], tmp_path)
    live, _, unload, here = (cell_text(nb.cells[i], errors=True) for i in range(2, 6))
    assert "live 2" in live
    assert "persistent mode" not in unload and "[worker:" not in unload, unload
    assert here.strip() == "here False 0 False 0 True", here
