"""``%tfdist_check sharding EXPR``: which examples each task reads, which of them more than one
task reads, which no task reads, and the auto-shard policy in effect and why (pure: the tasks
fingerprinted their elements, :mod:`tfdist_nb.worker.consistency`).

``missing`` is measured against the undistributed dataset: for a distributed dataset made by
``strategy.experimental_distribute_dataset(ds)`` that is ``ds`` itself, for
``distribute_datasets_from_function(fn)`` it is ``fn`` called with an input context of one
pipeline, and a ``reference`` expression replaces either (a plain ``tf.data.Dataset`` has no
source to find, so its missing elements are known only with a ``reference``). One task reads it,
bounded by the element bound times the number of workers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

from tfdist_nb.diagnostics.report import CheckReport
from tfdist_nb.strenum import StrEnum
from tfdist_nb.topology import name_tasks, task_order
from tfdist_nb.worker.replies import Described, Failure, Read, Released, ShardCall, Skipped

#: examples of the undistributed dataset, from the per-task reads, quoted in a summary
QUOTED = 5
IMBALANCE_NOTE = 1.5  # max/min above this is said in the details


class OverlapCause(StrEnum):
    """Why several tasks read the same elements, as the pipelines' structure shows it
    (``report.overlap_cause``; None without overlap). The summary's cause is said from it."""

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


def describe_problem(described: Mapping[str, Described | Failure]) -> CheckReport | None:
    """A report when EXPR cannot be read on some task (raised, or is not a dataset) or the tasks
    disagree about what it is: nothing is iterated then, so no task waits in a collective for
    another that will never join."""
    failed = {t: d["error"] for t, d in described.items() if "error" in d}
    if failed:
        errors = [f"{t}: {failed[t]}" for t in sorted(failed, key=task_order)]
        by_text: dict[str, list[str]] = {}
        for t, text in failed.items():
            by_text.setdefault(text, []).append(t)
        summary = "; ".join(f"{name_tasks(ts)}: {text}" for text, ts in by_text.items())
        return CheckReport("sharding", False, summary, details=errors,
                           fields={"errors": errors, "overlap": None, "missing": None,
                                   "per_task": {}})
    kinds = {t: d.get("kind") for t, d in described.items() if "error" not in d}
    if len(set(kinds.values())) > 1:
        text = "the tasks disagree about the expression: " + ", ".join(
            f"{t} has a {'distributed dataset' if k == 'distributed' else 'tf.data.Dataset'}"
            for t, k in sorted(kinds.items(), key=lambda x: task_order(x[0])))
        return CheckReport("sharding", False, text + " (a per-task code path)", details=[text],
                           fields={"errors": [text], "overlap": None, "missing": None,
                                   "per_task": {}})
    return None


def policy_explained(desc: Described) -> tuple[str | None, str, str]:
    """``(policy set, sharding in effect, why)`` from one task's description of EXPR."""
    policy = desc.get("policy")
    pipe = desc.get("pipeline")
    workers = desc.get("workers")
    w = f"{workers} workers" if workers else "the workers"
    own = ", ".join(f"shard({s.get('num_shards')}, {s.get('index')})" for s in _shards(desc))
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


def analyse(described: Mapping[str, Described | Failure], reads: Mapping[str, Read | Failure],
            reference: Read | Skipped | Failure | None = None) -> CheckReport:
    """``described[task]``: what EXPR is there (kind, policy, pipeline); ``reads[task]``: its
    fingerprint counts, previews and bound, or ``{"error": why}``, and ``"released": True``
    where the runner aborted its collectives because another task failed; ``reference``: the
    undistributed dataset's read (counts), or ``{"skipped"|"error": why}``."""
    problem = describe_problem(described)
    if problem is not None:
        return problem
    found = {t: d for t, d in described.items() if "error" not in d}  # all, said above
    failed = {t: _short(r["error"]) for t, r in reads.items() if "error" in r}
    read = {t: r for t, r in reads.items() if "error" not in r}
    good = sorted(read, key=task_order)
    first = found[sorted(found, key=task_order)[0]]
    policy, effective, why = policy_explained(first)
    if first.get("kind") == "dataset":
        policy = None  # set on it, but only distributing it would apply it
    details: list[str] = [f"sharding: {why}"]
    fields: dict[str, Any] = {"policy": policy, "effective": effective, "why": why,
                              "kind": first.get("kind"), "errors": []}
    failure = None
    if failed:
        failure, errors, released = _failures(failed, reads)
        fields["errors"] = errors
        details = errors + details + released
        if not good:
            return CheckReport("sharding", False, failure, details=details,
                               fields={**fields, "overlap": None, "missing": None,
                                       "per_task": {}, "overlap_cause": None})
    reading = _Reading(good, read)
    overlap = reading.overlap()
    cut = {t: by for t in good if (by := read[t].get("cut"))}
    missing, extra, ref_notes = _missing(reference, reading.seen_by, bool(cut))
    details += ref_notes
    table = reading.table(found)
    details += _reading_notes(reading, cut)
    fields.update(overlap=overlap, missing=missing, per_task=reading.per_task,
                  imbalance=reading.imbalance(), extra=extra, cut=cut)
    fields["overlap_cause"] = _cause(found, effective)[0] if len(overlap) else None
    problems = _problems(reading, overlap, missing, found, effective)
    if failure is not None:
        problems.insert(0, failure)
    if problems:
        return CheckReport("sharding", False, "; ".join(problems), table, details=details,
                           fields=fields)
    per_task = reading.per_task
    split = "/".join(str(per_task[t]) for t in good)
    text = (f"{sum(per_task.values())} element(s) split {split} across {name_tasks(good)} "
            "without overlap" + ("" if missing is None else ", none missing")
            + f" (sharding: {effective})")
    if cut:
        text += f"; cut short by a bound on {name_tasks(list(cut))}"
    return CheckReport("sharding", True, text, table, details=details, fields=fields)


def _failures(failed: dict[str, str],
              reads: Mapping[str, Released]) -> tuple[str, list[str], list[str]]:
    """The summary of the tasks that could not read, one error line per task, and what was
    done to the tasks still reading."""
    errors = [f"{t}: {e}" for t, e in sorted(failed.items(), key=lambda x: task_order(x[0]))]
    # a task released from the collective it waited in is a consequence, not the cause
    causes = {t: e for t, e in failed.items() if ABORTED not in e} or failed
    released_note = (["collectives were aborted on the tasks still reading, so that none "
                      "waits forever: %tfdist_restart gives working collectives again"]
                     if any(r.get("released") for r in reads.values()) else [])
    same: dict[str, list[str]] = {}
    for t, e in causes.items():
        same.setdefault(e, []).append(t)
    summary = "; ".join(f"{name_tasks(ts)} could not read the dataset: {e}"
                        for e, ts in same.items())
    released = sorted(set(failed) - set(causes), key=task_order)
    if all(ABORTED in e for e in causes.values()):
        summary += ("; the collectives were aborted (by an earlier failed read or an "
                    "interrupt): %tfdist_restart gives working collectives again")
    if released:
        summary += (f"; {name_tasks(released)} waited for it in a collective and was released "
                    f"(%tfdist_restart gives working collectives again)")
    return summary, errors, released_note


class _Reading:
    """What the tasks that answered read: counts per fingerprint, who saw each."""

    def __init__(self, good: list[str], reads: Mapping[str, Read]) -> None:
        self.good, self.reads = good, reads
        self.previews: dict[str, str] = {}
        for t in good:
            self.previews.update(reads[t].get("previews") or {})
        self.counts = {t: dict(reads[t].get("counts") or {}) for t in good}
        self.per_task = {t: int(reads[t].get("examples", sum(self.counts[t].values())))
                         for t in good}
        self.seen_by: dict[str, list[str]] = {}
        for t in good:
            for fp in self.counts[t]:
                self.seen_by.setdefault(fp, []).append(t)
        self.dupes = {t: self.per_task[t] - len(self.counts[t]) for t in good}

    def overlap(self) -> pd.DataFrame:
        rows = []
        for fp, who in self.seen_by.items():
            if len(who) > 1:
                row: dict[str, Any] = {"fingerprint": fp, "element": self.previews.get(fp, ""),
                                       "tasks": ", ".join(who)}
                row.update({t: self.counts[t].get(fp, 0) for t in self.good})
                row["seen"] = sum(self.counts[t].get(fp, 0) for t in self.good)
                rows.append(row)
        overlap = pd.DataFrame(rows, columns=["fingerprint", "element", "tasks", *self.good,
                                              "seen"])
        return overlap.sort_values("element", key=_natural).reset_index(drop=True)

    def imbalance(self) -> float:
        n = list(self.per_task.values())
        return (max(n) / min(n) if n and min(n) > 0 else
                float("inf") if n and max(n) > 0 else 1.0)

    def table(self, described: Mapping[str, Described]) -> pd.DataFrame:
        seen_by, reads = self.seen_by, self.reads
        return pd.DataFrame([{
            "task": t, "examples": self.per_task[t], "distinct": len(self.counts[t]),
            "shared": sum(1 for fp in self.counts[t] if len(seen_by[fp]) > 1),
            "only_here": sum(1 for fp in self.counts[t] if len(seen_by[fp]) == 1),
            "repeated": self.dupes[t], "steps": reads[t].get("steps"),
            "cut_short_by": reads[t].get("cut") or "",
            "seconds": reads[t].get("seconds"),
            "auto_shard_policy": _policy_cell(described.get(t, {})),
            "own_shard": ", ".join(
                f"shard({s.get('num_shards')}, {s.get('index')})"
                for s in _shards(described.get(t, {}))),
        } for t in self.good]).set_index("task")


def _missing(reference: Read | Skipped | Failure | None, seen_by: dict[str, list[str]],
             cut: bool) -> tuple[pd.DataFrame | None, int, list[str]]:
    """Elements of the undistributed dataset no task read (None: not measured), elements read
    that are not in it, and what to say about both."""
    notes: list[str] = []
    if not reference or "counts" not in reference:
        why = (None if not reference else reference["skipped"] if "skipped" in reference
               else reference["error"])
        return None, 0, [f"missing not measured: {why}" if why else
                         "missing not measured: no undistributed dataset (give reference=EXPR)"]
    ref = reference["counts"]
    ref_previews = reference.get("previews") or {}
    extra = sum(1 for fp in seen_by if fp not in ref)
    missing = None
    if cut:
        note = ("missing not measured: the tasks' reading was cut short by a bound (elements "
                "past it would count as missing)")
    else:
        missing = pd.DataFrame(
            [{"fingerprint": fp, "element": ref_previews.get(fp, ""), "in reference": n}
             for fp, n in ref.items() if fp not in seen_by],
            columns=["fingerprint", "element", "in reference"])
        missing = missing.sort_values("element", key=_natural).reset_index(drop=True)
        note = (f"reference: {reference.get('origin', 'the undistributed dataset')}, "
                f"{reference.get('examples', sum(ref.values()))} example(s)")
        if reference.get("cut"):
            note += f", cut short by its {reference['cut']}: missing counts only the part read"
    if extra:
        notes.append(f"{extra} element(s) the tasks read are not in the reference: the "
                     "pipeline is not deterministic (random maps or augmentation, unseeded "
                     "shuffles before a map) or the reference is another dataset; missing and "
                     "overlap compare fingerprints, so they are unreliable then")
    return missing, extra, [*notes, note]


def _reading_notes(reading: _Reading, cut: dict[str, str]) -> list[str]:
    notes = [f"{t}: reading cut short by the {by}; the counts cover what was read"
             for t, by in cut.items()]
    if any(reading.dupes.values()):
        notes.append("read more than once by the same task: " + ", ".join(
            f"{t} {n}" for t, n in reading.dupes.items() if n) + " (repeat(), or duplicates "
            "in the data)")
    if (imbalance := reading.imbalance()) > IMBALANCE_NOTE:
        notes.append(f"imbalance: {_ratio(imbalance)} (max/min examples per task) - the "
                     "tasks with more data set the pace of every synchronous step")
    return notes


def _problems(reading: _Reading, overlap: pd.DataFrame, missing: pd.DataFrame | None,
              described: Mapping[str, Described], effective: str) -> list[str]:
    good, seen_by = reading.good, reading.seen_by
    problems: list[str] = []
    if shared := len(overlap):
        everywhere = sum(1 for who in seen_by.values() if len(who) == len(good))
        if everywhere == len(seen_by) and len(good) > 1:
            whole = missing is None or not len(missing)
            what = (f"{name_tasks(good)} read the same {shared} element(s)" +
                    (": every task reads the whole dataset" if whole else ""))
        else:
            busiest = sorted({t for fp in overlap["fingerprint"] for t in seen_by[fp]},
                             key=task_order)
            what = (f"{shared} element(s) read by more than one task ({name_tasks(busiest)}), "
                    f"e.g. {', '.join(map(str, overlap['element'].head(QUOTED)))}")
        problems.append(f"{what}; cause: {_cause(described, effective)[1]}")
    if missing is not None and len(missing):
        problems.append(f"{len(missing)} element(s) of the undistributed dataset read by no "
                        f"task, e.g. {', '.join(map(str, missing['element'].head(QUOTED)))}")
    per_task = reading.per_task
    empty = [t for t in good if per_task[t] == 0 and max(per_task.values()) > 0]
    if empty:
        problems.append(f"{name_tasks(empty)} read no element while the others did")
    return problems


def _cause(described: Mapping[str, Described], effective: str
           ) -> tuple[OverlapCause, str]:
    """The likely reason several tasks read the same elements, read from the pipelines' own
    structure (their shard() calls and the shuffles before them)."""
    order = sorted(described, key=task_order)
    first = described[order[0]]
    ways = {t: policy_explained(described[t])[1] for t in order}
    if len(set(ways.values())) > 1:
        said = ", ".join(f"{t} {way}" for t, way in ways.items())
        return OverlapCause.SHARDED_DIFFERENTLY, (
            f"the tasks shard in different ways ({said}): each task must build the same "
            "pipeline with the same options (a cell or a branch that ran on some tasks "
            "only?)")
    shards = {t: tuple((s.get("num_shards"), s.get("index")) for s in _shards(d))
              for t, d in described.items()}
    shuffled = sorted((t for t, d in described.items()
                       if any(s.get("after_unseeded_shuffle") for s in _shards(d))),
                      key=task_order)
    if shuffled and effective in ("shard()", "function"):
        calls = ", ".join(f"shard({n}, {i})" for n, i in shards[shuffled[0]])
        return OverlapCause.SHUFFLE_BEFORE_SHARD, (
            f"the pipeline shuffles without a seed before its {calls} call (on "
            f"{name_tasks(shuffled)}): each task shuffles into its own order, so the shards it "
            "cuts overlap with the others' and miss elements; shard before shuffling, or "
            "give that shuffle the same seed on every task")
    if effective == "shard()" and len(shards) > 1 and len(set(shards.values())) == 1:
        call = ", ".join(f"shard({n}, {i})" for n, i in next(iter(shards.values())))
        return OverlapCause.SAME_SHARD_INDEX, (
            f"every task calls {call}: the index must be the task's own, e.g. "
            f"dataset.shard(num_workers, tw.task[1])")
    if effective == "function" and any(shards.values()):
        calls = "; ".join(f"{t} " + ", ".join(f"shard({n}, {i})" for n, i in shards[t])
                          for t in sorted(shards, key=task_order))
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
    if effective == "none" and first.get("kind") == "dataset":
        return OverlapCause.PLAIN_UNSHARDED, (
            "a plain tf.data.Dataset without dataset.shard(): shard it with "
            "dataset.shard(num_workers, task index), or distribute it with the strategy")
    if effective == "none":
        return OverlapCause.POLICY_OFF, (
            "auto_shard_policy OFF and no dataset.shard(): set AutoShardPolicy.DATA (or "
            "FILE), or shard it yourself")
    unseeded = sorted((t for t, d in described.items()
                       if (p := d.get("pipeline")) and p.get("unseeded_shuffle")), key=task_order)
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


#: TensorFlow's own error text for a collective aborted under it (by this check's runner, an
#: earlier failed read or an interrupt): the one way to tell from a task's error
ABORTED = "Collective ops is aborted by"


def _short(error: str) -> str:
    """An agent error without the call's own prefix and TensorFlow's function-node noise; its
    first line."""
    text = error.split(" failed: ", 1)[1] if " failed: " in error else error
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    first = text.strip().splitlines()[0].strip() if text.strip() else text
    return first if len(first) <= 240 else first[:237] + "..."


def _shards(desc: Described) -> list[ShardCall]:
    return desc["pipeline"].get("shards", []) if "pipeline" in desc else []


def _policy_cell(desc: Described) -> str:
    if desc.get("kind") != "distributed":
        return "n/a (not distributed)"
    if desc.get("made_by") == "distribute_datasets_from_function":
        return "n/a (from a function)"
    return str(desc.get("policy") or "")


def _ratio(x: float) -> str:
    return "inf (a task read nothing)" if x == float("inf") else f"{x:.2f}x"


def _natural(col: pd.Series) -> pd.Series:
    """Sort previews of numbers as numbers, the rest as text."""
    def key(v: Any) -> tuple[int, float, str]:
        try:
            return (0, float(v), "")
        except (TypeError, ValueError):
            return (1, 0.0, str(v))

    return col.map(key)
