"""%tfdist_isolate on real clusters: a flaky failure is called flaky, no variant outlives the
budget, an interrupt returns what is known, and every variant's kernels are gone afterwards (the
autouse leak check, and the user's cluster is left as it was). A bug in one task's own data, on
3 workers, is found on that task's share alone, not called distributed.

The three bugs of the teaching notebook (examples/11_isolate.ipynb: a data bug in one worker's
share, a traced-function bug, a collective bug) get their verdicts, and the exported smallest
variant of the first fails the same way when its launch.sh runs, in tests/test_examples.py."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import worker_kernels
from tfdist_nb import Cluster, current
from tfdist_nb.cluster import registry
from tfdist_nb.diagnostics.isolate_variants import Finding
from tfdist_nb.errors import SpecError

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

def fails_once_then(marker: Path, then: str) -> str:
    """A cell that fails on worker:0 the first time it runs on this machine, then does ``then``."""
    return (f"import os, time, tfdist_nb.worker as tw\n"
            f"if tw.task[1] == 0 and not os.path.exists({str(marker)!r}):\n"
            f"    open({str(marker)!r}, 'w').close()\n"
            f"    raise RuntimeError('the first run fails')\n"
            f"{then}\n")


@pytest.fixture(scope="module")
def one_worker() -> Iterator[Cluster]:
    with Cluster(workers=1, warm=False, stall_timeout=60) as c:
        yield c


def kernels_of(cluster: Cluster) -> set[int]:
    return {rt.pid for rt in cluster.tasks.values() if rt.pid}


def test_a_failure_that_does_not_repeat_is_called_flaky(one_worker: Cluster,
                                                        tmp_path: Path) -> None:
    assert not one_worker.run(fails_once_then(tmp_path / "ran", "print('ok')")).ok
    said: list[str] = []
    report = one_worker.isolate(budget_s=120, on_progress=said.append)
    assert report.finding is Finding.FLAKY, report.verdict
    assert report.verdict.startswith("flaky: it failed in your run and passed when re-run "
                                     "unchanged in fresh kernels"), report.verdict
    assert list(report.table["outcome"]) == ["passes"]
    assert report.smallest is None
    with pytest.raises(SpecError, match="no variant failed"):
        report.export(tmp_path / "repro")
    assert said[0].startswith("isolate: variant 1 of at most 2: 1 worker as run (elapsed 0s)")
    assert said[1].startswith("isolate: 1 worker as run: passes in ")
    # the user's cluster is as it was: current, running, its own kernels only
    assert current() is one_worker and worker_kernels() >= kernels_of(one_worker)
    assert registry.live_clusters() == [one_worker]
    assert one_worker.run("print('still here')").ok


def test_no_variant_outlives_the_budget(one_worker: Cluster, tmp_path: Path) -> None:
    """The cell fails in the user's run and hangs in every variant: the variant runs out of
    time within the budget, and the call returns within it, its kernels gone."""
    assert not one_worker.run(fails_once_then(tmp_path / "ran", "time.sleep(1000)")).ok
    began = time.monotonic()
    report = one_worker.isolate(budget_s=15, warm=False)
    took = time.monotonic() - began
    assert took <= 15, took
    assert list(report.table["outcome"]) == ["out of time"]
    assert report.finding is Finding.NOT_REPRODUCED, report.verdict
    assert "it runs out of time" in report.verdict, report.verdict
    assert worker_kernels() >= kernels_of(one_worker)
    assert registry.live_clusters() == [one_worker] and current() is one_worker


def test_an_interrupt_ends_the_variant_and_returns_what_is_known(one_worker: Cluster,
                                                                 tmp_path: Path) -> None:
    assert not one_worker.run(fails_once_then(tmp_path / "ran", "time.sleep(1000)")).ok

    def interrupt_once_a_variant_runs() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            side = [c for c in registry.live_clusters() if c is not one_worker]
            if side and side[0]._cells.active and side[0]._cells.last >= 2:  # the failing cell
                # a real SIGINT to the main thread, as Ctrl-C / Jupyter's interrupt is: it wakes a
                # blocked wait at once (_thread.interrupt_main only sets a flag looked at later)
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=interrupt_once_a_variant_runs, daemon=True)
    watcher.start()
    began = time.monotonic()
    report = one_worker.isolate(budget_s=200, warm=False)
    took = time.monotonic() - began
    watcher.join(5)
    assert took < 60, took
    assert list(report.table["outcome"]) == ["interrupted"]
    assert "(interrupted after 1 variant(s))" in report.verdict
    assert registry.live_clusters() == [one_worker]
    assert one_worker.run("print('still here')").ok


def test_bad_requests_are_refused_before_anything_starts(one_worker: Cluster) -> None:
    assert one_worker.run("x = 1").ok
    last = one_worker._cells.last
    with pytest.raises(SpecError, match=f"cell {last} did not fail on this cluster"):
        one_worker.isolate(cell=last)
    with pytest.raises(SpecError, match="positive number of seconds"):
        one_worker.isolate(budget_s=0)
    assert registry.live_clusters() == [one_worker]


#: worker:2's own rows hold a NaN (chosen by its index, as a per-task data file would be); the
#: check raises there, and the other workers wait in the all-reduce until they are released.
ONE_TASKS_DATA = """\
import numpy as np
import tensorflow as tf
import tfdist_nb.worker as tw

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rows = np.arange(12, dtype=np.float32).reshape(6, 2) + 10 * tw.task[1]
if tw.task[1] == 2:
    rows[2, 1] = np.nan

@tf.function
def step(x):
    return strategy.run(lambda v: tf.debugging.check_numerics(tf.reduce_sum(v), "loss"),
                        args=(x,))

for i in range(6):
    with tw.step():
        strategy.reduce("SUM", step(tf.constant(rows[i])), axis=None)
"""


@pytest.mark.timeout(400)
def test_one_tasks_own_data_is_found_on_its_share_not_called_distributed(
        tmp_path: Path) -> None:
    """1 worker runs as worker:0 and never meets worker:2's rows: the walk runs the task that
    failed on its own (worker:2, the others released) alone, as worker:2, before bisecting."""
    with Cluster(workers=3, warm=False, stall_timeout=60) as three:
        result = three.run(ONE_TASKS_DATA)
        # the others are released: aborted, or interrupted when the hang rules named worker:2
        # before a waiter's collective reached its ledger; neither failed on its own
        on_its_own = [t for t, r in result.tasks.items() if r.status in ("error", "crashed")]
        assert on_its_own == ["worker:2"], result.summary()
        live = {c.id for c in registry.live_clusters()}
        report = three.isolate(budget_s=300)
        assert report.finding is Finding.TASK_DATA, str(report)
        assert report.verdict.startswith("fails on worker:2's share alone: that task's data"), \
            report
        assert "distributed" not in report.verdict, report
        assert report.smallest is not None and "worker:2's share alone" in report.smallest.title
        repro = report.export(tmp_path / "repro")
        train = (repro / "train.py").read_text()
        assert "'as_task': ['worker', 2," in train and "for i in range(3):" in train
        assert {c.id for c in registry.live_clusters()} == live and current() is three
    # one task taking worker:2's identity, outside Jupyter: its rows, the same failure
    ran = subprocess.run(["bash", str(repro / "launch.sh")], capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode != 0
    assert "InvalidArgumentError" in ran.stdout and "loss : Tensor had NaN values" in ran.stdout
