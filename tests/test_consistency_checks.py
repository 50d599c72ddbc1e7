"""The consistency checks (docs/reference.md, Checks): ``sharding EXPR`` and ``variables EXPR``,
on a real 2-worker MultiWorkerMirroredStrategy cluster with deliberate bugs, and their pure
analysis on numbers made here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tfdist_nb import Cluster
from tfdist_nb.cluster.session import SESSION
from tfdist_nb.diagnostics import sharding_check, sharding_policy, variables_check
from tfdist_nb.diagnostics.sharding_check import OverlapCause
from tfdist_nb.worker.variables_probe import FULL_VALUES, summarise

BOTH = "worker:0 and worker:1"

SETUP = """
import tensorflow as tf
import tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy()

def distributed(policy):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    data = tf.data.Dataset.range(64).batch(8).with_options(options)
    return strategy.experimental_distribute_dataset(data)

by_data = distributed(tf.data.experimental.AutoShardPolicy.DATA)
unsharded = distributed(tf.data.experimental.AutoShardPolicy.OFF)
by_hand = tf.data.Dataset.range(64).shard(2, tw.task[1]).batch(8)
everything = tf.data.Dataset.range(64).batch(8)
# a dataset function that ignores its InputContext: every task reads all 40
ignores_context = strategy.distribute_datasets_from_function(
    lambda ctx: tf.data.Dataset.range(40).batch(ctx.get_per_replica_batch_size(8)))
# TensorFlow's multi-worker custom loop tutorial: an unseeded shuffle before the function's
# own, correct, shard(): each task shuffles into its own order, so the shards overlap
shuffled_then_sharded = strategy.distribute_datasets_from_function(
    lambda ctx: tf.data.Dataset.range(64).shuffle(64)
    .shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(8))

def fails_on_worker_1(x):
    if tw.task[1] == 1:
        tf.debugging.assert_less(x, tf.constant(20, tf.int64))
    return x

fails_midway = strategy.experimental_distribute_dataset(
    tf.data.Dataset.range(64).map(fails_on_worker_1).batch(8))

# unseeded random initial values: outside the scope each task draws its own
outside = tf.Variable(tf.random.uniform([3, 4]), name="outside")
big_outside = tf.Variable(tf.random.uniform([40, 40]), name="big_outside")
with strategy.scope():
    inside = tf.Variable(tf.random.uniform([3, 4]), name="inside")
    module = tf.Module()
    module.w = tf.Variable(tf.random.uniform([40, 40]), name="module_w")
"""


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(workers=2) as c:
        made = c.run(SETUP)
        assert made.ok, made.summary()
        yield c


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_sharding_and_variables_on_a_real_cluster(cluster: Cluster) -> None:
    c = cluster

    # AutoShardPolicy DATA: 64 elements, 32 per task, no overlap, nothing missing
    data = c.check("sharding", "by_data")
    assert data.ok, data
    assert data.per_task == {"worker:0": 32, "worker:1": 32}
    assert data.overlap.empty and data.missing is not None and data.missing.empty
    assert data.policy == "DATA" and data.effective == "DATA" and data.imbalance == 1.0
    assert data.overlap_cause is None
    assert "64 element(s) split 32/32 across worker:0 and worker:1" in data.summary
    assert list(data.table.index) == ["worker:0", "worker:1"]

    # OFF: every element is read by both tasks
    off = c.check("sharding", "unsharded")
    assert not off.ok
    assert off.per_task == {"worker:0": 64, "worker:1": 64}
    assert len(off.overlap) == 64 and off.missing is not None and off.missing.empty
    assert (off.overlap["worker:0"] == 1).all() and (off.overlap["seen"] == 2).all()
    assert sorted(int(e) for e in off.overlap["element"]) == list(range(64))
    assert off.overlap_cause is OverlapCause.POLICY_OFF
    assert off.summary.startswith(f"{BOTH} read the same 64 element(s)")
    assert "auto_shard_policy OFF and no dataset.shard()" in off.summary
    assert off.policy == "OFF" and "OFF" in str(off) and "PROBLEM" in off._repr_html_()

    # a bound cuts the reading short on both tasks at the same step (no task left in the
    # iterator's all-reduce), the report says so, and missing is not claimed
    cut = c.check("sharding", "unsharded", max_elements=20)
    assert cut.per_task == {"worker:0": 20, "worker:1": 20}
    assert cut.cut == {"worker:0": "element bound (20)", "worker:1": "element bound (20)"}
    assert cut.missing is None and any("cut short" in d for d in cut.details)

    # a plain tf.data.Dataset sharded by hand passes; unsharded it names both tasks
    hand = c.check("sharding", "by_hand", reference="tf.data.Dataset.range(64)")
    assert hand.ok, hand
    assert hand.per_task == {"worker:0": 32, "worker:1": 32} and hand.missing.empty
    assert list(hand.table["own_shard"]) == ["shard(2, 0)", "shard(2, 1)"]
    plain = c.check("sharding", "everything")
    assert not plain.ok and plain.summary.startswith(f"{BOTH} read the same 64 element(s)")
    assert plain.overlap_cause is OverlapCause.PLAIN_UNSHARDED and plain.missing is None

    # distribute_datasets_from_function: the function must shard by its InputContext
    fn = c.check("sharding", "ignores_context")
    assert not fn.ok and fn.per_task == {"worker:0": 40, "worker:1": 40}
    assert fn.missing.empty and fn.overlap_cause is OverlapCause.FUNCTION_IGNORES_CONTEXT
    tutorial = c.check("sharding", "shuffled_then_sharded")
    assert not tutorial.ok and sum(tutorial.per_task.values()) == 64
    # it does shard by its InputContext: the unseeded shuffle before that shard is the cause
    assert tutorial.overlap_cause is OverlapCause.SHUFFLE_BEFORE_SHARD
    assert "shuffles without a seed before its shard(2, 0) call" in tutorial.summary

    # EXPR that exists on one task only: named, and nothing is read (no collective waits)
    c.run("only_here = by_data", on="worker:0")
    one = c.check("sharding", "only_here")
    assert not one.ok and one.summary == "worker:1: NameError: name 'only_here' is not defined"

    # variables outside the scope differ (by their true max abs difference), inside are equal
    values = c.run("import json; print(json.dumps(outside.numpy().tolist()))")
    arrays = [np.array(json.loads(values.tasks[t].stdout)) for t in ("worker:0", "worker:1")]
    true_diff = float(np.abs(arrays[0] - arrays[1]).max())
    var = c.check("variables", "[outside, big_outside, inside, module]")
    assert not var.ok
    assert set(var.diverged) == {"outside:0", "big_outside:0"}
    assert var.diverged["outside:0"] == pytest.approx(true_diff, abs=1e-6)
    assert "outside:0" not in var.bounds  # 12 values travel whole: exact
    lo, hi = var.bounds["big_outside:0"]  # 1600 values: summaries, an honest bound
    assert 0 < lo <= hi and var.diverged["big_outside:0"] == lo
    assert var.summary.startswith(f"2 of 4 variable(s) differ between {BOTH}: outside:0")
    assert "created outside strategy.scope()" in var.summary
    assert var.table.loc["outside:0", "mirrored"] == "no"
    assert var.table.loc["inside:0", "verdict"] == "equal"
    assert var.table.loc["module_w:0", "mirrored"] == "yes"
    same = c.check("variables", "{'inside': inside, 'module': module}")
    assert same.ok and same.diverged == {}, same

    # the magic: EXPR is evaluated in the tasks; the strategy still works after the checks
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("tfdist_nb")
    SESSION.clusters.set_current(c)
    try:
        report = ip.run_line_magic("tfdist_check", "sharding by_data --max-elements 1000")
        assert report.ok and report.per_task == {"worker:0": 32, "worker:1": 32}
        report = ip.run_line_magic("tfdist_check", "variables '[outside]' --atol 10")
        assert report.ok and report.within_tolerance == ["outside:0"]
        with pytest.raises(UsageError, match="needs an expression"):
            ip.run_line_magic("tfdist_check", "variables")
        with pytest.raises(UsageError, match="takes no --reference"):
            ip.run_line_magic("tfdist_check", "network --reference x")
    finally:
        SESSION.clusters.set_current(None)
    again = c.run("print(float(strategy.reduce('SUM', strategy.run(lambda: tf.constant(1.)), "
                  "axis=None)))")
    assert again.ok and again.tasks["worker:1"].stdout.strip() == "2.0"

    # a task that fails mid-read: it is named, and the task left waiting in the iterator's
    # all-reduce is released at once instead of at the timeout (this breaks the collectives,
    # so it comes last)
    failing = c.check("sharding", "fails_midway")
    assert not failing.ok
    assert failing.summary.startswith("worker:1 could not read the dataset: "
                                      "InvalidArgumentError: assertion failed"), failing
    assert "worker:0 waited for it in a collective and was released" in failing.summary


@pytest.mark.cluster  # imports TensorFlow here (9 s)
def test_auto_shard_policy_follows_the_files_of_the_source(tmp_path: Path) -> None:
    import tensorflow as tf

    from tfdist_nb.worker.consistency import describe_pipeline

    for i in range(3):
        with tf.io.TFRecordWriter(str(tmp_path / f"part-{i}.tfrecord")) as w:
            w.write(b"x")
    listed = tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord")).interleave(
        tf.data.TFRecordDataset).batch(4)
    one = tf.data.TFRecordDataset([str(tmp_path / "part-0.tfrecord")])
    facts = describe_pipeline(listed)
    assert facts["file_based"] and facts["files"] == 3 and facts["batched"]
    assert describe_pipeline(one)["files"] == 1 and not describe_pipeline(one)["batched"]
    assert not describe_pipeline(tf.data.Dataset.range(8).shard(2, 1))["file_based"]
    assert describe_pipeline(tf.data.Dataset.range(8).shard(2, 1))["shards"] == [
        {"num_shards": 2, "index": 1, "after_unseeded_shuffle": False}]
    # a shuffle before the split: unseeded it is named, seeded (or after the split) it is not
    for shuffle_seed, shard_after, unseeded in ((None, True, True), (7, True, False),
                                                (None, False, False)):
        data = tf.data.Dataset.range(8)
        data = (data.shuffle(8, seed=shuffle_seed).shard(2, 1) if shard_after
                else data.shard(2, 1).shuffle(8, seed=shuffle_seed))
        said = describe_pipeline(data)
        assert said["shards"][0]["after_unseeded_shuffle"] is unseeded, (shuffle_seed, shard_after)
        assert said["unseeded_shuffle"] is (shuffle_seed is None)

    def explain(pipeline: dict[str, Any], policy: str, workers: int = 2) -> tuple[str, str]:
        _, effective, why = sharding_policy.policy_explained(
            {"kind": "distributed", "made_by": "experimental_distribute_dataset",
             "policy": policy, "workers": workers, "pipeline": pipeline})
        return effective, why

    assert explain(facts, "AUTO")[0] == "FILE"
    effective, why = explain(describe_pipeline(one), "AUTO")
    assert effective == "DATA" and "FILE sharding needs at least as many files" in why
    effective, why = explain(describe_pipeline(one), "FILE")
    assert "too few, TensorFlow raises an error" in why
    assert explain(describe_pipeline(tf.data.Dataset.range(8)), "AUTO")[0] == "DATA"


def _answer(arrays: dict[str, Any], mirrored: bool = True,
            full_values: int = FULL_VALUES) -> dict[str, Any]:
    out = {}
    for task, arr in arrays.items():
        row = summarise("w", np.asarray(arr, np.float32), [10**6], full_values)
        row["mirrored"] = mirrored
        out[task] = {"variables": [row], "strategy": "MultiWorkerMirroredStrategy"}
    return out


def test_variables_bounds_are_honest_when_only_summaries_travel() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(size=5000).astype(np.float32)
    b = a.copy()
    b[1234] += 0.25  # one element, not at a sampled position
    report = variables_check.analyse(_answer({"worker:0": a, "worker:1": b}))
    lo, hi = report.bounds["w"]
    assert lo <= 0.25 <= hi and not report.ok
    exact = variables_check.analyse(_answer({"worker:0": a, "worker:1": b}, full_values=8192))
    assert exact.diverged["w"] == pytest.approx(0.25, abs=1e-6) and "w" not in exact.bounds
    # bitwise different but within the tolerance
    near = variables_check.analyse(_answer({"worker:0": a[:10], "worker:1": a[:10] + 1e-7}))
    assert near.ok and near.within_tolerance == ["w"] and "bitwise" in " ".join(near.details)
    # three tasks: the odd one is named
    odd = variables_check.analyse(_answer({"worker:0": a[:10], "worker:1": a[:10],
                                           "worker:2": a[:10] * 2}))
    assert "differ on worker:2 (the others agree)" in odd.summary


def _rows(*names: str, mirrored: bool = True, shape: int = 3) -> dict[str, Any]:
    """One task's answer: a variable of zeros per name."""
    rows = [summarise(n, np.zeros(shape, np.float32), [10**6], FULL_VALUES) for n in names]
    return {"variables": [r | {"mirrored": mirrored} for r in rows],
            "strategy": "MultiWorkerMirroredStrategy"}


def test_variables_name_a_likely_cause_only_when_every_differing_variable_shares_it() -> None:
    """Each differing variable carries a typed cause; the summary names one only when all
    share it, in its own words when they are the same for all, in general words otherwise."""
    VC = variables_check.VariableCause
    # both missing, on different tasks: the same cause, other details
    missing = variables_check.analyse({"worker:0": _rows("a", "b"), "worker:1": _rows("b"),
                                       "worker:2": _rows("a")})
    assert missing.cause_kinds == {"a": VC.MISSING, "b": VC.MISSING}
    assert missing.causes == {"a": "missing on worker:1", "b": "missing on worker:2"}
    assert missing.summary.endswith(
        "likely cause: a per-task code path: the variables exist on some tasks only")
    # both missing on the same task: that task is the cause for both
    same = variables_check.analyse({"worker:0": _rows("a", "b"), "worker:1": _rows()})
    assert same.summary.endswith("likely cause: missing on worker:1")
    # a shape and a missing variable: no one cause
    mixed = variables_check.analyse({"worker:0": _rows("a", "b"),
                                     "worker:1": _rows("a", shape=4)})
    assert mixed.cause_kinds == {"a": VC.SHAPE_DTYPE, "b": VC.MISSING}
    assert "likely cause" not in mixed.summary
    # plain variables under a strategy that differ in value: created outside its scope
    a, b = _rows("w", mirrored=False), _rows("w", mirrored=False)
    b["variables"][0] = summarise("w", np.ones(3, np.float32), [10**6], FULL_VALUES) | {
        "mirrored": False}
    scope = variables_check.analyse({"worker:0": a, "worker:1": b})
    assert scope.cause_kinds == {"w": VC.OUTSIDE_SCOPE}
    assert "likely cause: created outside strategy.scope()" in scope.summary


def test_sharding_analysis_names_overlap_missing_and_empty_tasks() -> None:
    described = {t: {"kind": "distributed", "made_by": "experimental_distribute_dataset",
                     "policy": "DATA", "workers": 2, "pipeline": {"file_based": False}}
                 for t in ("worker:0", "worker:1")}
    reads = {"worker:0": {"examples": 3, "counts": {"a": 1, "b": 1, "c": 1},
                          "previews": {"a": "1", "b": "2", "c": "3"}, "steps": 3},
             "worker:1": {"examples": 0, "counts": {}, "previews": {}, "steps": 3}}
    ref = {"counts": {"a": 1, "b": 1, "c": 1, "d": 1}, "previews": {"d": "4"}, "examples": 4}
    report = sharding_check.analyse(described, reads, ref)
    assert not report.ok and report.overlap.empty
    assert list(report.missing["element"]) == ["4"]
    assert "worker:1 read no element while the others did" in report.summary
    assert report.imbalance == float("inf")


def _overlapping(described: dict) -> tuple[sharding_check.OverlapCause, str]:
    """The cause and summary of two tasks that both read elements a and b."""
    reads = {t: {"examples": 2, "counts": {"a": 1, "b": 1}, "previews": {"a": "1", "b": "2"},
                 "steps": 1} for t in described}
    report = sharding_check.analyse(described, reads)
    return report.overlap_cause, report.summary


def test_the_overlap_cause_comes_from_each_pipelines_structure() -> None:
    def desc(policy: str, pipeline: dict) -> dict:
        return {"kind": "distributed", "made_by": "experimental_distribute_dataset",
                "policy": policy, "workers": 2, "pipeline": {"file_based": False, **pipeline}}

    # tasks whose options differ: named as such, not blamed on a shuffle
    cause, differ = _overlapping({"worker:0": desc("DATA", {}), "worker:1": desc("OFF", {})})
    assert cause is OverlapCause.SHARDED_DIFFERENTLY
    assert "(worker:0 DATA, worker:1 none)" in differ
    # DATA over an unseeded shuffle: the shuffle is named, with the tasks that have it
    cause, shuffled = _overlapping({t: desc("DATA", {"unseeded_shuffle": True})
                                    for t in ("worker:0", "worker:1")})
    assert cause is OverlapCause.DATA_UNSEEDED_SHUFFLE
    assert "(on worker:0 and worker:1)" in shuffled
    cause, _ = _overlapping({t: desc("DATA", {"unseeded_shuffle": False})
                             for t in ("worker:0", "worker:1")})
    assert cause is OverlapCause.DATA_ORDER_DIFFERS
