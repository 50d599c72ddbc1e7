"""``%tfdist_check sharding EXPR``: compares what the tasks read (their element fingerprints,
:mod:`tfdist_nb.worker.consistency`): overlap, elements missing from the undistributed dataset,
imbalance (docs/reference.md, Checks). Why they overlap: :mod:`.sharding_policy`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

from tfdist_nb.diagnostics.report import CheckReport, grouped
from tfdist_nb.diagnostics.sharding_policy import OverlapCause as OverlapCause
from tfdist_nb.diagnostics.sharding_policy import (
    overlap_cause,
    own_shards,
    policy_cell,
    policy_explained,
)
from tfdist_nb.topology import name_tasks, task_order
from tfdist_nb.worker.replies import Described, Failure, Read, Released, Skipped

#: examples of the undistributed dataset, from the per-task reads, quoted in a summary
QUOTED = 5
IMBALANCE_NOTE = 1.5  # max/min above this is said in the details


def describe_problem(described: Mapping[str, Described | Failure]) -> CheckReport | None:
    """A report when EXPR cannot be read on some task (raised, or is not a dataset) or the tasks
    disagree about what it is: nothing is iterated then, so no task waits in a collective for
    another that will never join."""
    failed = {t: d["error"] for t, d in described.items() if "error" in d}
    kinds = {t: d.get("kind") for t, d in described.items() if "error" not in d}
    if failed:
        errors = [f"{t}: {failed[t]}" for t in sorted(failed, key=task_order)]
        summary = "; ".join(f"{name_tasks(ts)}: {text}" for text, ts in grouped(failed).items())
    elif len(set(kinds.values())) > 1:
        text = "the tasks disagree about the expression: " + ", ".join(
            f"{t} has a {'distributed dataset' if k == 'distributed' else 'tf.data.Dataset'}"
            for t, k in sorted(kinds.items(), key=lambda x: task_order(x[0])))
        errors, summary = [text], text + " (a per-task code path)"
    else:
        return None
    return CheckReport("sharding", False, summary, details=errors,
                       fields={"errors": errors, "overlap": None, "missing": None,
                               "per_task": {}})


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
    fields["overlap_cause"] = overlap_cause(found, effective)[0] if len(overlap) else None
    problems = [failure] if failure else []
    problems += _problems(reading, overlap, missing, found, effective)
    per_task = reading.per_task
    split = "/".join(str(per_task[t]) for t in good)
    text = (f"{sum(per_task.values())} element(s) split {split} across {name_tasks(good)} "
            "without overlap" + ("" if missing is None else ", none missing")
            + f" (sharding: {effective})")
    if cut:
        text += f"; cut short by a bound on {name_tasks(list(cut))}"
    return CheckReport("sharding", not problems, "; ".join(problems) or text, table,
                       details=details, fields=fields)


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
    summary = "; ".join(f"{name_tasks(ts)} could not read the dataset: {e}"
                        for e, ts in grouped(causes).items())
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
        self.previews = {fp: text for t in good
                         for fp, text in (reads[t].get("previews") or {}).items()}
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
            "auto_shard_policy": policy_cell(described.get(t, {})),
            "own_shard": own_shards(described.get(t, {})),
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
        ratio = "inf (a task read nothing)" if imbalance == float("inf") else f"{imbalance:.2f}x"
        notes.append(f"imbalance: {ratio} (max/min examples per task) - the "
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
        problems.append(f"{what}; cause: {overlap_cause(described, effective)[1]}")
    if missing is not None and len(missing):
        problems.append(f"{len(missing)} element(s) of the undistributed dataset read by no "
                        f"task, e.g. {', '.join(map(str, missing['element'].head(QUOTED)))}")
    per_task = reading.per_task
    empty = [t for t in good if per_task[t] == 0 and max(per_task.values()) > 0]
    if empty:
        problems.append(f"{name_tasks(empty)} read no element while the others did")
    return problems


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


def _natural(col: pd.Series) -> pd.Series:
    """Sort previews of numbers as numbers, the rest as text."""
    def key(v: Any) -> tuple[int, float, str]:
        try:
            return (0, float(v), "")
        except (TypeError, ValueError):
            return (1, 0.0, str(v))

    return col.map(key)
