"""%tfdist_isolate on real clusters: a flaky failure is called flaky, a bug in one worker's data
is found in that worker's share alone and exported as a one-task reproducer that fails the same
way, no variant outlives the budget, an interrupt returns what is known, and every variant's
kernels are gone afterwards (the autouse leak check, and the user's cluster is left as it was).

The three bugs of the teaching notebook (examples/11_isolate.ipynb: a data bug, a
traced-function bug, a collective bug) get their verdicts in tests/test_examples.py."""

from __future__ import annotations

import _thread
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.conftest import worker_kernels
from tfdist_nb import Cluster, current
from tfdist_nb.cluster import registry
from tfdist_nb.errors import SpecError

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

STRATEGY = """
import tensorflow as tf, tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy()
"""
# Element 14 is NaN. MultiWorkerMirroredStrategy splits each global batch of 4 into the two
# workers' halves: worker:1 gets [2, 3], [6, 7], [10, 11], [14, 15] ...: its 4th step fails.
DATA_BUG = """
data = tf.data.Dataset.range(32).map(
    lambda x: tf.where(x == 14, float("nan"), tf.cast(x, tf.float32)))
batches = iter(strategy.experimental_distribute_dataset(data.batch(4)))

@tf.function
def step(x):
    return strategy.run(lambda v: tf.debugging.check_numerics(tf.reduce_sum(v), "loss"),
                        args=(x,))

for i in range(8):
    with tw.step():
        strategy.reduce("SUM", step(next(batches)), axis=None)
"""


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


def test_a_failure_that_does_not_repeat_is_called_flaky(tmp_path: Path) -> None:
    with Cluster(workers=2, warm=False) as c:
        assert not c.run(fails_once_then(tmp_path / "ran", "print('ok')")).ok
        said: list[str] = []
        report = c.isolate(budget_s=120, on_progress=said.append)
        assert report.verdict.startswith("flaky: it failed in your run and passed when re-run "
                                         "unchanged in fresh kernels"), report.verdict
        assert list(report.table["outcome"]) == ["passes"]
        assert report.smallest is None
        with pytest.raises(SpecError, match="no variant failed"):
            report.export(tmp_path / "repro")
        assert said[0].startswith("isolate: variant 1 of at most 5: 2 workers as run")
        assert said[1].startswith("isolate: 2 workers as run: passes in ")
        # the user's cluster is as it was: current, running, its own kernels only
        assert current() is c and worker_kernels() >= kernels_of(c)
        assert registry.live_clusters() == [c]
        assert c.run("print('still here')").ok


def test_a_bug_in_one_workers_data_is_found_in_its_share_and_exported(tmp_path: Path,
                                                                      capsys: Any) -> None:
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("tfdist_nb")
    try:
        ip.run_cell_magic("tfcluster", "2 workers --no-dashboard --no-warm", STRATEGY)
        cluster = current()
        with pytest.raises(Exception, match="InvalidArgumentError"):
            ip.run_cell_magic("tfcluster", "", DATA_BUG)
        capsys.readouterr()
        report = ip.run_line_magic("tfdist_isolate", f"--budget-s 200 --export {tmp_path}/r")
        out = capsys.readouterr().out
    finally:
        ip.run_line_magic("tfdist_stop", "")
        ip.extension_manager.unload_extension("tfdist_nb")
    assert report.verdict.startswith("fails on worker:1's share alone: that task's data"), \
        report.verdict
    assert "worker:0's passes" in report.verdict
    rows = dict(zip(report.table["variant"], report.table["outcome"], strict=True))
    assert rows["2 workers as run"] == "fails"
    assert rows["1 worker"] == "fails"  # all the data on one worker holds element 14 too
    assert rows["worker:0's share alone"] == "passes"
    assert rows["worker:1's share alone"] == "fails"
    # worker:1 entered 4 steps when the 4th failed: the smallest variant has 4
    assert report.smallest.title == "worker:1's share alone, 4 step(s)"
    assert rows["worker:1's share alone, 4 step(s)"] == "fails"
    assert all(s <= 200 for s in report.table["seconds"]) and report.seconds <= 200
    assert "tfdist_nb: isolate: variant 1 of at most" in out
    assert f"tfdist_nb: {report.verdict}" in out
    assert f"is in {tmp_path}/r: bash {tmp_path}/r/launch.sh" in out
    # the exported smallest variant is one task that takes worker:1's identity and fails the same
    train = (tmp_path / "r" / "train.py").read_text()
    assert "'as_task': ['worker', 1," in train and "for i in range(4):" in train
    ran = subprocess.run(["bash", str(tmp_path / "r" / "launch.sh")], capture_output=True,
                         text=True, timeout=180)
    assert ran.returncode != 0
    assert "[worker:0]" in ran.stdout and "InvalidArgumentError" in ran.stdout
    assert "loss : Tensor had NaN values" in ran.stdout
    assert "launch.sh: worker:0 failed" in ran.stderr
    assert cluster is not None and not cluster.running


def test_no_variant_outlives_the_budget(one_worker: Cluster, tmp_path: Path) -> None:
    """The cell fails in the user's run and hangs in every variant: the variant runs out of
    time within the budget, and the call returns within it, its kernels gone."""
    assert not one_worker.run(fails_once_then(tmp_path / "ran", "time.sleep(1000)")).ok
    began = time.monotonic()
    report = one_worker.isolate(budget_s=25, warm=False)
    took = time.monotonic() - began
    assert took <= 25, took
    assert list(report.table["outcome"]) == ["out of time"]
    assert report.verdict.startswith("not reproduced: re-run unchanged in fresh kernels it "
                                     "runs out of time"), report.verdict
    assert worker_kernels() >= kernels_of(one_worker)
    assert registry.live_clusters() == [one_worker] and current() is one_worker


def test_an_interrupt_ends_the_variant_and_returns_what_is_known(one_worker: Cluster,
                                                                 tmp_path: Path) -> None:
    assert not one_worker.run(fails_once_then(tmp_path / "ran", "time.sleep(1000)")).ok

    def interrupt_once_a_variant_runs() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            side = [c for c in registry.live_clusters() if c is not one_worker]
            if side and side[0]._active_runs and side[0]._cell >= 2:  # the failing cell
                _thread.interrupt_main()
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
    last = one_worker._cell
    with pytest.raises(SpecError, match=f"cell {last} did not fail on this cluster"):
        one_worker.isolate(cell=last)
    with pytest.raises(SpecError, match="positive number of seconds"):
        one_worker.isolate(budget_s=0)
    assert registry.live_clusters() == [one_worker]
