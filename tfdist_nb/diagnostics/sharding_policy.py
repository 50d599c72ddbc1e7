"""What the tasks' pipelines say about sharding, before anything is read: the AutoShardPolicy in
effect and why (TensorFlow's rules, docs/reference.md, Checks), and why tasks that read the same
elements overlap. :mod:`~tfdist_nb.diagnostics.sharding_check` compares what they read."""

from __future__ import annotations

from collections.abc import Mapping

from tfdist_nb.strenum import StrEnum
from tfdist_nb.topology import name_tasks, task_order
from tfdist_nb.worker.replies import Described, ShardCall


class OverlapCause(StrEnum):
    """Why several tasks read the same elements (``report.overlap_cause``; None without
    overlap); the summary says the cause from it."""

    SHARDED_DIFFERENTLY = "sharded_differently"  # the tasks' pipelines shard in other ways
    SHUFFLE_BEFORE_SHARD = "shuffle_before_shard"  # an unseeded shuffle before shard()
    SAME_SHARD_INDEX = "same_shard_index"  # every task calls shard() with one index
    FUNCTION_SHARDS_OVERLAP = "function_shards_overlap"  # a dataset function's shard() calls
    FUNCTION_IGNORES_CONTEXT = "function_ignores_context"  # it never shards by InputContext
    SHARD_CALLS_DO_NOT_SPLIT = "shard_calls_do_not_split"
    PLAIN_UNSHARDED = "plain_unsharded"  # a plain dataset without shard()
    POLICY_OFF = "policy_off"  # AutoShardPolicy OFF and no shard()
    DATA_UNSEEDED_SHUFFLE = "data_unseeded_shuffle"  # DATA over an unseeded shuffle
    DATA_ORDER_DIFFERS = "data_order_differs"  # DATA over an order that differs per task
    INPUTS_NOT_DISJOINT = "inputs_not_disjoint"  # FILE: the tasks' files overlap


def own_shards(desc: Described) -> str:
    """The pipeline's own ``shard(n, i)`` calls, as written."""
    return ", ".join(f"shard({s.get('num_shards')}, {s.get('index')})" for s in _shards(desc))


def _shards(desc: Described) -> list[ShardCall]:
    return desc["pipeline"].get("shards", []) if "pipeline" in desc else []


def policy_explained(desc: Described) -> tuple[str | None, str, str]:
    """``(policy set, sharding in effect, why)`` from one task's description of EXPR."""
    policy = desc.get("policy")
    pipe = desc.get("pipeline")
    workers = desc.get("workers")
    w = f"{workers} workers" if workers else "the workers"
    own = own_shards(desc)
    files, file_based = (pipe.get("files"), pipe.get("file_based")) if pipe else (None, None)
    if desc.get("kind") == "dataset":
        if own:
            return policy, "shard()", (f"a plain tf.data.Dataset: no auto-sharding applies (only "
                                       f"a strategy's experimental_distribute_dataset shards); "
                                       f"its pipeline calls {own}")
        return policy, "none", ("a plain tf.data.Dataset without dataset.shard(): no "
                                "auto-sharding applies (only a strategy's "
                                "experimental_distribute_dataset shards), so each task reads "
                                "all of it")
    if desc.get("made_by") == "distribute_datasets_from_function":
        return None, "function", ("distribute_datasets_from_function: no auto-sharding; your "
                                  "function gets an InputContext and must shard itself "
                                  "(dataset.shard(ctx.num_input_pipelines, "
                                  "ctx.input_pipeline_id))")
    file_text = ("reads no files (range, from_tensor_slices, a generator ...)"
                 if file_based is False else
                 f"reads {files} file(s)" if files is not None else
                 "reads files (how many could not be told from its graph)"
                 if file_based else "could not be inspected")
    if policy == "OFF":
        return policy, "shard()" if own else "none", (
            "auto_shard_policy OFF: no auto-sharding, " + (
                f"the pipeline's own {own} splits the data" if own else
                "and no dataset.shard() in the pipeline: every task reads the whole dataset"))
    if policy == "DATA":
        return policy, "DATA", (f"auto_shard_policy DATA: every task reads the whole input and "
                                f"keeps every n-th element for itself (n = {w}); it needs a "
                                f"deterministic order, and costs each task a full read")
    if policy == "FILE":
        enough = (f"; {files} file(s) for {w}: too few, TensorFlow raises an error when "
                  f"iterating" if files is not None and workers and files < workers else "")
        return policy, "FILE", (f"auto_shard_policy FILE: each task reads its own subset of the "
                                f"input files; FILE needs at least as many files as workers "
                                f"(AUTO would fall back to DATA); the source {file_text}"
                                f"{enough}")
    if policy == "AUTO":
        if file_based and files is not None and workers and files >= workers:
            return policy, "FILE", (f"auto_shard_policy AUTO -> FILE: the source {file_text}, "
                                    f"at least one per worker ({w}), so each task reads its "
                                    f"own files")
        if file_based and files is not None and workers:
            return policy, "DATA", (f"auto_shard_policy AUTO -> DATA: the source {file_text}, "
                                    f"fewer than the {w}; FILE sharding needs at least as many "
                                    f"files as workers, so AUTO falls back to DATA (each task "
                                    f"reads everything and keeps its share)")
        if file_based:
            return policy, "FILE or DATA", (f"auto_shard_policy AUTO: the source {file_text}; "
                                            f"FILE when there are at least as many files as "
                                            f"workers, else AUTO falls back to DATA")
        return policy, "DATA", (f"auto_shard_policy AUTO -> DATA: the source {file_text}, so "
                                f"FILE sharding is impossible and AUTO falls back to DATA "
                                f"(each task reads every element and keeps its share)")
    if policy == "HINT":
        return policy, "HINT", ("auto_shard_policy HINT: shard(SHARD_HINT, ...) placeholders "
                                "in the pipeline become shard(num_workers, worker_index)")
    return policy, "unknown", f"auto_shard_policy {policy} (the source {file_text})"


def overlap_cause(described: Mapping[str, Described], effective: str
                  ) -> tuple[OverlapCause, str]:
    """The likely reason several tasks read the same elements, from the pipelines' structure
    (their shard() calls and the shuffles before them)."""
    order = sorted(described, key=task_order)
    ways = {t: policy_explained(described[t])[1] for t in order}
    if len(set(ways.values())) > 1:
        said = ", ".join(f"{t} {way}" for t, way in ways.items())
        return OverlapCause.SHARDED_DIFFERENTLY, (
            f"the tasks shard in different ways ({said}): each task must build the same "
            "pipeline with the same options (a cell or a branch that ran on some tasks "
            "only?)")
    shards = {t: own_shards(described[t]) for t in order}
    shuffled = [t for t in order
                if any(s.get("after_unseeded_shuffle") for s in _shards(described[t]))]
    if shuffled and effective in ("shard()", "function"):
        return OverlapCause.SHUFFLE_BEFORE_SHARD, (
            f"the pipeline shuffles without a seed before its {shards[shuffled[0]]} call (on "
            f"{name_tasks(shuffled)}): each task shuffles into its own order, so the shards it "
            "cuts overlap with the others' and miss elements; shard before shuffling, or "
            "give that shuffle the same seed on every task")
    if effective == "shard()" and len(shards) > 1 and len(set(shards.values())) == 1:
        return OverlapCause.SAME_SHARD_INDEX, (
            f"every task calls {shards[order[0]]}: the index must be the task's own, e.g. "
            f"dataset.shard(num_workers, tw.task[1])")
    if effective == "function" and any(shards.values()):
        calls = "; ".join(f"{t} {shards[t]}" for t in order)
        return OverlapCause.FUNCTION_SHARDS_OVERLAP, (
            f"the dataset function shards ({calls}) but the shards overlap: check that "
            "num_shards is ctx.num_input_pipelines and index ctx.input_pipeline_id")
    if effective == "function":  # no shard() call at all
        return OverlapCause.FUNCTION_IGNORES_CONTEXT, (
            "the dataset function does not shard by its InputContext: "
            "dataset.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)")
    if effective == "shard()":
        return (OverlapCause.SHARD_CALLS_DO_NOT_SPLIT,
                "the pipeline's own shard() calls do not split it: check num_shards and index")
    if effective == "none" and described[order[0]].get("kind") == "dataset":
        return OverlapCause.PLAIN_UNSHARDED, (
            "a plain tf.data.Dataset without dataset.shard(): shard it with "
            "dataset.shard(num_workers, task index), or distribute it with the strategy")
    if effective == "none":
        return OverlapCause.POLICY_OFF, (
            "auto_shard_policy OFF and no dataset.shard(): set AutoShardPolicy.DATA (or "
            "FILE), or shard it yourself")
    unseeded = [t for t in order if (p := described[t].get("pipeline"))
                and p.get("unseeded_shuffle")]
    if effective == "DATA" and unseeded:
        return OverlapCause.DATA_UNSEEDED_SHUFFLE, (
            f"DATA sharding keeps every n-th element by position, and the pipeline "
            f"shuffles without a seed (on {name_tasks(unseeded)}), so each task keeps its "
            "share of a different order; give the shuffle the same seed on every task, or "
            "shuffle after the split")
    if effective == "DATA":
        return OverlapCause.DATA_ORDER_DIFFERS, (
            "DATA sharding keeps every n-th element by position, so an order that differs "
            "between tasks (a non-deterministic map or interleave before the split) "
            "overlaps")
    return (OverlapCause.INPUTS_NOT_DISJOINT,
            f"sharding {effective}: the tasks' inputs are not disjoint (duplicate files?)")


def policy_cell(desc: Described) -> str:
    """The table's auto_shard_policy column: the policy only where distributing applies it."""
    if desc.get("kind") != "distributed":
        return "n/a (not distributed)"
    if desc.get("made_by") == "distribute_datasets_from_function":
        return "n/a (from a function)"
    return str(desc.get("policy") or "")
