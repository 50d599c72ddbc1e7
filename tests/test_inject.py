"""Teaching faults injected with %tfdist_inject are detected and named, through the user's own
training code (a tw.step()/tw.timed() loop, and Keras fit)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from tfdist_nb import Cluster

pytestmark = pytest.mark.cluster

LOOP = """
import tensorflow as tf, tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy() if "strategy" not in globals() else strategy
ds = strategy.experimental_distribute_dataset(tf.data.Dataset.range(10**6).batch(4))
for batch in tw.timed(ds):
    with tw.step():
        strategy.reduce("SUM", strategy.run(lambda b: tf.reduce_sum(b), args=(batch,)), axis=None)
    if tw.steps_done() >= {steps}:
        break
print("done", tw.steps_done())
"""

FIT_NAN = """
import numpy as np, tensorflow as tf
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
h = model.fit(np.ones((64, 4), "float32"), np.ones((64, 1), "float32"), batch_size=8,
              epochs=1, verbose=0)
print("loss", h.history["loss"][-1])
"""


@pytest.fixture(scope="module")
def ip_cluster() -> Iterator[tuple[Any, Cluster]]:
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("tfdist_nb")
    with Cluster(workers=2, preload=(), stall_timeout=6) as c:
        yield ip, c


def magic(ip: Any, line: str) -> str:
    with capture_output() as out:
        ip.run_line_magic("tfdist_inject", line)
    return out.stdout


def test_inject_needs_a_task_and_a_known_kind(ip_cluster: tuple[Any, Cluster]) -> None:
    ip, _ = ip_cluster
    with pytest.raises(UsageError, match="say which task gets the fault"):
        ip.run_line_magic("tfdist_inject", "crash")
    with pytest.raises(UsageError, match="unknown fault 'meltdown'"):
        ip.run_line_magic("tfdist_inject", "meltdown --on 1")


def test_injected_straggler_is_flagged_with_evidence(ip_cluster: tuple[Any, Cluster]) -> None:
    ip, c = ip_cluster
    assert "straggler armed" in magic(ip, "straggler --on 1 --seconds 0.2")
    result = c.run(LOOP.format(steps=15), timeout=120)
    assert result.ok, result.summary()
    flags = c.status().set_index("task")["flags"]
    assert (flags["worker:1"], flags["worker:0"]) == ("straggler", "")
    alert = next(a for a in c.alerts() if "is a straggler" in a)
    assert alert.startswith("worker:1: worker:1 is a straggler: the others wait ")
    assert "it was the last to arrive" in alert and "host load" in alert
    # both tasks' input waits look alike: the iterator synchronises them (why arrival is used)
    waits = c.status().set_index("task")["input_wait_ms"]
    assert waits["worker:0"] > 100
    assert "cleared" in magic(ip, "clear")


SLEEPS_BEFORE_ALL_REDUCE_ON_1 = """
import time, tensorflow as tf, tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy() if "strategy" not in globals() else strategy
ds = strategy.experimental_distribute_dataset(tf.data.Dataset.range(10**6).batch(4))
for i, batch in enumerate(tw.timed(ds)):
    with tw.step():
        partial = strategy.run(lambda b: tf.reduce_sum(b), args=(batch,))
        if tw.task == ("worker", 1):
            time.sleep(0.1)  # this task's compute is slower
        strategy.reduce("SUM", partial, axis=None)
    if i == 14:
        break
"""


def test_a_task_that_sleeps_before_its_all_reduce_is_the_straggler(
        ip_cluster: tuple[Any, Cluster]) -> None:
    """Both tasks fetch their batch together; worker:1 reaches the gradient all-reduce late."""
    _, c = ip_cluster
    before = len(c.alerts())
    assert c.run(SLEEPS_BEFORE_ALL_REDUCE_ON_1, timeout=120).ok
    assert c.status().set_index("task")["flags"].to_dict() == {"worker:0": "", "worker:1":
                                                              "straggler"}
    alert = next(a for a in c.alerts()[before:] if "is a straggler" in a)
    lag = int(re.search(r"the others wait (\d+) ms a step", alert).group(1))  # type: ignore[union-attr]
    assert 70 <= lag <= 300, alert
    assert "input pipeline" not in alert  # its fetch was as fast as the others'


SLOW_PIPELINE_ON_1 = """
import time, tensorflow as tf, tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy() if "strategy" not in globals() else strategy
slow = tw.task == ("worker", 1)
def load(batch):
    if slow:
        time.sleep(0.15)  # this host's disk is slow
    return batch
ds = tf.data.Dataset.range(10**6).batch(4).map(
    lambda b: tf.py_function(load, [b], tf.int64))
it = iter(strategy.experimental_distribute_dataset(ds))
for _ in range(15):
    with tw.step():  # no tw.timed: next() inside the step
        batch = next(it)
        strategy.reduce("SUM", strategy.run(lambda b: tf.reduce_sum(b), args=(batch,)), axis=None)
print("done", tw.steps_done())
"""


def test_a_slow_input_pipeline_written_by_hand_is_found(ip_cluster: tuple[Any, Cluster]) -> None:
    """Nothing injected: user code whose tf.data pipeline is slow on worker:1 only. Both tasks'
    next() calls last as long (the iterator synchronises them); the local fetch does not."""
    _, c = ip_cluster
    before = len(c.alerts())
    result = c.run(SLOW_PIPELINE_ON_1, timeout=120)
    assert result.ok, result.summary()
    flags = c.status().set_index("task")["flags"]
    assert (flags["worker:1"], flags["worker:0"]) == ("straggler", "")
    alert = next(a for a in c.alerts()[before:] if "is a straggler" in a)
    assert alert.startswith("worker:1: worker:1 is a straggler")
    assert "cause: its input pipeline - its own tf.data fetch takes" in alert
    fetch = {t: c.live.view(t).local_fetch_ms() for t in ("worker:0", "worker:1")}
    assert fetch["worker:1"] > 100 > 10 > fetch["worker:0"]


UNSHARDED = """
import tensorflow as tf, tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy() if "strategy" not in globals() else strategy
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
ds = tf.data.Dataset.range(64)
if {manual_shard}:
    ds = ds.shard(2, tw.task[1])  # sharded by hand: OFF is then right
dist = strategy.experimental_distribute_dataset(ds.batch(4).with_options(options))
print("distributed", next(iter(dist)))
"""


def test_bad_shard_injected_and_written_by_hand_are_named(
        ip_cluster: tuple[Any, Cluster]) -> None:
    ip, c = ip_cluster

    def shard_alerts(before: int) -> list[str]:
        return [a for a in c.alerts()[before:] if "input not sharded" in a]

    assert "bad-shard armed" in magic(ip, "bad-shard --on 1")
    before = len(c.alerts())
    result = c.run(LOOP.format(steps=3), timeout=120)
    assert result.ok, result.summary()
    said = shard_alerts(before)
    assert [a.split(":")[0] + ":" + a.split(":")[1] for a in said] == ["worker:1"]
    assert ("auto_shard_policy OFF and no dataset.shard(), so it reads the whole dataset - the "
            "same examples as the other 1 task(s)") in said[0]
    assert "AutoShardPolicy.DATA" in said[0]
    magic(ip, "clear")

    before = len(c.alerts())
    assert c.run(UNSHARDED.format(manual_shard=False), timeout=60).ok
    assert sorted(a.split(": ")[0] for a in shard_alerts(before)) == ["worker:0", "worker:1"]

    before = len(c.alerts())
    assert c.run(UNSHARDED.format(manual_shard=True), timeout=60).ok
    assert shard_alerts(before) == []  # OFF with its own dataset.shard() is fine


def test_injected_nan_poisons_keras_fit(ip_cluster: tuple[Any, Cluster]) -> None:
    ip, c = ip_cluster
    magic(ip, "nan --on 0 --at-step 2")
    result = c.run(FIT_NAN, on=0, timeout=120)
    assert result.ok and result.tasks["worker:0"].stdout.strip() == "loss nan"
    magic(ip, "clear")


def test_injected_hang_is_found_as_a_stall(ip_cluster: tuple[Any, Cluster]) -> None:
    ip, c = ip_cluster
    magic(ip, "hang --on 1 --at-step 3")
    result = c.run(LOOP.format(steps=10**6), timeout=120)
    assert result.tasks["worker:1"].status == "stalled"
    assert "inject.py" in result.tasks["worker:1"].stack  # where it hangs: the injected wait
    magic(ip, "clear")
    c.restart()  # the stall aborted the collectives


def test_injected_crash_and_oom_are_classified(ip_cluster: tuple[Any, Cluster]) -> None:
    ip, c = ip_cluster
    magic(ip, "crash --on 1 --at-step 4")
    result = c.run(LOOP.format(steps=10**6), timeout=120)
    crashed = result.tasks["worker:1"]
    assert crashed.status == "crashed" and "killed by SIGKILL" in crashed.error.evalue
    assert "likely out of memory" not in crashed.explanation
    c.restart()
    magic(ip, "oom --on 0 --limit-mb 300")
    result = c.run("import time\nfor _ in range(600): time.sleep(0.1)", on=0, timeout=120)
    oom = result.tasks["worker:0"]
    assert oom.status == "crashed"
    assert "likely out of memory" in oom.error.evalue
    assert "against its own limit" in oom.explanation
    c.restart()


def test_injected_oom_at_a_step_waits_for_the_training_cell(
        ip_cluster: tuple[Any, Cluster]) -> None:
    """``oom --at-step K``: the task idles with its limit set and dies in its K-th step, in the
    training cell, with the memory evidence (notebook 09; issue 41: it used to die while idle,
    so the next cell found it dead with no evidence shown)."""
    import time

    ip, c = ip_cluster
    assert "oom armed" in magic(ip, "oom --on 0 --limit-mb 300 --at-step 3")
    time.sleep(3)  # the fault without --at-step grows 300 MB in about a second
    states = c.status().set_index("task")["state"].to_dict()
    assert states == {"worker:0": "idle", "worker:1": "idle"}, states
    result = c.run(LOOP.format(steps=10**6), timeout=120)
    oom = result.tasks["worker:0"]
    assert oom.status == "crashed", result.summary()
    assert "likely out of memory" in oom.error.evalue
    assert "against its own limit" in oom.explanation
    c.restart()
