"""``%tfdist_check gpu``: each task's GPU readings in, a verdict per finding out (pure; the
readings are :func:`tfdist_nb.worker.gpu_probe.gpu_readings`'s, the all-reduce timings
:func:`tfdist_nb.worker.probes.allreduce_bandwidth`'s). docs/gpus.md says what is checked.

A task without a GPU is no failure: the report says why it has none. Anything wrong names the
task and the cause, worded from what was read (versions, link widths, counts), never fixed text.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from tfdist_nb.diagnostics.report import CheckReport, grouped
from tfdist_nb.strenum import StrEnum
from tfdist_nb.topology import name_tasks, task_order
from tfdist_nb.worker.gpu_probe import NvmlState
from tfdist_nb.worker.replies import Bandwidth, Failure, GivenGpu, GpuReadings, TfBuild

#: the oldest Linux driver of each CUDA major version (NVIDIA's CUDA compatibility table)
DRIVER_FOR_CUDA = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
#: NCCL's bus bandwidth at the largest size this many times RING's: worth asking for
NCCL_WORTH = 1.2
IMPLEMENTATIONS = ("RING", "NCCL")


class Issue(StrEnum):
    """What a finding is about (``GpuFinding.issue``): tests and callers pick by this word."""

    NOT_FOUND = "given_gpu_not_found"
    TF_ERROR = "tf_cannot_list_gpus"
    TF_SEES_FEWER = "tf_sees_fewer_gpus"
    DRIVER_TOO_OLD = "driver_too_old"
    DRIVER_MINOR = "driver_older_minor"
    CAPABILITY = "compute_capability_unsupported"
    PCIE_WIDTH = "pcie_width_below_max"
    PCIE_GEN = "pcie_gen_below_max"
    ECC_ERRORS = "uncorrected_ecc_errors"
    ECC_PENDING = "ecc_mode_change_pending"
    RETIRED_PENDING = "retired_pages_pending"
    REMAP_PENDING = "row_remap_pending"
    REMAP_FAILED = "row_remap_failed"
    SHARED = "gpu_shared"
    SHARED_GROWTH = "gpu_shared_with_growth"
    ALLREDUCE_FAILED = "allreduce_failed"
    NCCL_FASTER = "nccl_faster"


@dataclass(frozen=True)
class GpuFinding:
    """One thing the check found: ``problem`` fails the check, otherwise it is a note."""

    tasks: tuple[str, ...]
    issue: Issue
    problem: bool
    text: str

    def __str__(self) -> str:
        return f"{name_tasks(self.tasks)}: {self.text}"


def no_gpu_cause(task: str, reading: GpuReadings) -> str | None:
    """Why ``task`` has no GPU, or None when it has one (given and found, or seen by TF)."""
    cvd, host = reading.get("cuda_visible_devices"), reading.get("host", "its host")
    nvml = reading.get("nvml") or {}
    if cvd is not None and cvd.strip() in ("", "-1"):
        if task.startswith("ps:"):
            return "ps tasks are given no GPU"
        count = nvml.get("count")
        return (f"hidden: CUDA_VISIBLE_DEVICES={cvd!r} (what --gpus none gives)"
                + (f", and {host} has {count} GPU(s)" if count else ""))
    if reading.get("devices") or ((reading.get("tf") or {}).get("gpus") or 0) > 0:
        return None
    state = nvml.get("state")
    if state == NvmlState.NO_MODULE:
        return "no NVML library: nvidia-ml-py is not installed in the task's Python"
    if state == NvmlState.NO_LIBRARY:
        return f"no NVML library (libnvidia-ml.so) on {host}: no NVIDIA driver is installed"
    if state == NvmlState.NO_DRIVER:
        return f"no driver: the NVIDIA kernel driver is not loaded on {host}"
    if state == NvmlState.ERROR:
        return f"NVML failed on {host}: {nvml.get('error')}"
    return f"no device: NVML finds no GPU on {host}"


def allreduce_plan(readings: Mapping[str, GpuReadings | Failure]
                   ) -> tuple[list[str], str | None]:
    """Which collectives to time (``RING``, ``NCCL``) and, for those left out, why. Only where
    every task's TensorFlow sees a GPU; NCCL not where tasks share one (it refuses two ranks
    of one collective on one GPU, and a failed collective leaves the cluster's unusable)."""
    answered = {t: r for t, r in readings.items() if "error" not in r}
    if len(answered) < len(readings):
        return [], "a task did not answer"
    tfs = [r["tf"] for r in answered.values()]
    if not readings or not all(tfs):
        return [], "TensorFlow is not imported in every task"
    if not all(tf and tf.get("gpus") for tf in tfs):
        return [], "not every task's TensorFlow sees a GPU"
    if _shared(answered):
        return ["RING"], "NCCL not tried: tasks share a GPU (NCCL refuses that)"
    return list(IMPLEMENTATIONS), None


def analyse(readings: Mapping[str, GpuReadings | Failure],
            allreduce: Mapping[str, Mapping[str, Bandwidth | Failure]] | None = None,
            not_timed: str | None = None) -> CheckReport:
    """``readings[task]``: a task's ``gpu_readings`` (or ``{"error": why}`` when it did not
    answer); ``allreduce[implementation][task]``: its ``allreduce_bandwidth`` answer;
    ``not_timed``: why the collective was not (all) timed."""
    tasks = sorted(readings, key=task_order)
    answered = {t: r for t in tasks if "error" not in (r := readings[t])}
    no_gpu = {t: cause for t, r in answered.items() if (cause := no_gpu_cause(t, r))}
    timings, said = _allreduce(allreduce or {})
    per_task = [f for t, r in answered.items() if t not in no_gpu for f in _task_findings(t, r)]
    findings = _merged([*per_task, *_sharing(answered), *said])
    problems = [f for f in findings if f.problem]
    silent = {t: r["error"] for t in tasks if "error" in (r := readings[t])}
    details = [f"{t}: did not answer ({why})" for t, why in silent.items()]
    details += [str(f) for f in sorted(findings, key=lambda f: not f.problem)]
    details += [f"{t}: no GPU: {cause}" for t, cause in no_gpu.items()]
    if not_timed and not no_gpu:
        details.append(f"all-reduce not timed: {not_timed}")
    ok = not problems and not silent
    return CheckReport("gpu", ok, _summary(answered, no_gpu, findings, list(silent)),
                       _table(answered, no_gpu, findings), details=details,
                       fields={"findings": findings, "problems": problems, "no_gpu": no_gpu,
                               "allreduce": timings})


def _summary(answered: Mapping[str, GpuReadings], no_gpu: Mapping[str, str],
             findings: list[GpuFinding], silent: list[str]) -> str:
    if silent:
        return f"{name_tasks(silent)} did not answer the GPU check"
    problems = [f for f in findings if f.problem]
    if problems:
        more = len(problems) - 1
        return str(problems[0]) + (f" (and {more} more problem(s) below)" if more else "")
    if no_gpu and len(no_gpu) == len(answered):
        return "no GPU: " + "; ".join(f"{name_tasks(ts)}: {c}"
                                      for c, ts in grouped(no_gpu).items())
    given = "; ".join(f"{t}: GPU {','.join(d['entry'] for d in r.get('devices') or []) or '?'}"
                      for t, r in answered.items() if t not in no_gpu)
    names = sorted({str(d.get("name")) for r in answered.values()
                    for d in r.get("devices") or [] if d.get("name")})
    without = "".join(f"; {t}: no GPU ({cause})" for t, cause in no_gpu.items())
    return (f"the GPUs look right ({given}{without})" + (f"; {', '.join(names)}" if names else "")
            + (f"; {notes} note(s) below" if (notes := len(findings)) else ""))


def _task_findings(task: str, r: GpuReadings) -> list[GpuFinding]:
    devices = r.get("devices") or []
    nvml, tf = r.get("nvml") or {}, r.get("tf")
    build = (tf or {}).get("build") or {}
    out: list[GpuFinding] = []

    def say(issue: Issue, problem: bool, text: str) -> None:
        out.append(GpuFinding((task,), issue, problem, text))

    missing = [d for d in devices if not d.get("found")]
    if missing:
        count, after = nvml.get("count") or 0, missing[0].get("hidden_after")
        say(Issue.NOT_FOUND, True, f"given GPU {missing[0]['entry']} but NVML on "
            f"{r.get('host')} has no such device ({count} GPU(s)"
            f"{f': 0-{count - 1}' if count else ''}); CUDA stops at that entry"
            + (f", so {','.join(after)} after it are not used either" if after else ""))
    driver = _cuda_pair(nvml.get("cuda_driver"))
    built = _version(build.get("cuda"))
    if driver and built and driver < built[:2]:
        have = f"driver {nvml.get('driver')} supports CUDA up to {driver[0]}.{driver[1]}"
        if driver[0] < built[0]:
            say(Issue.DRIVER_TOO_OLD, True, f"{have}; TensorFlow was built for CUDA "
                f"{build['cuda']}: update the NVIDIA driver (CUDA {built[0]} needs "
                f"{DRIVER_FOR_CUDA.get(built[0], 'a newer one')} or later)")
        else:
            say(Issue.DRIVER_MINOR, False, f"{have}, TensorFlow's CUDA is {build['cuda']}: it "
                "runs through CUDA minor-version compatibility, but code compiled at run time "
                "(PTX) needs a newer driver (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)")
    found = [d for d in devices if d.get("found")]
    for d in found:
        _device_findings(d, build, say)
    if tf is not None and tf.get("error"):
        say(Issue.TF_ERROR, True, f"TensorFlow could not list its GPUs: {tf['error']}")
    elif tf is not None and (seen := tf.get("gpus")) is not None and seen < len(devices):
        say(Issue.TF_SEES_FEWER, True, f"TensorFlow sees {seen} of the {len(devices)} "
            f"GPU(s) it was given: {_why_fewer(found, build, out)}")
    return out


def _device_findings(d: GivenGpu, build: TfBuild,
                     say: Callable[[Issue, bool, str], None]) -> None:
    gpu = f"GPU {d['entry']} ({d.get('name')})"
    lowest = _lowest_capability(build.get("capabilities") or [])
    cc = _version(d.get("compute_capability"))
    if cc and lowest and cc < lowest:
        say(Issue.CAPABILITY, True, f"{gpu} has compute capability {d['compute_capability']}; "
            f"this TensorFlow runs on {lowest[0]}.{lowest[1]} and up, so it ignores the GPU")
    width, width_max = d.get("pcie_width"), d.get("pcie_width_max")
    if width and width_max and width < width_max:
        say(Issue.PCIE_WIDTH, True, f"{gpu}'s PCIe link runs x{width} of x{width_max}: "
            f"{width / width_max:.0%} of its host bandwidth (reseat the card, or check the slot "
            "and BIOS lane settings)")
    gen, gen_max = d.get("pcie_gen"), d.get("pcie_gen_max")
    if gen and gen_max and gen < gen_max and (d.get("util_percent") or 0) > 0:
        # an idle GPU lowers its link speed to save power: only a busy one is wrong
        say(Issue.PCIE_GEN, True, f"{gpu}'s PCIe link runs gen{gen} of gen{gen_max} while busy "
            f"({d['util_percent']}%): a slot or riser below the card's speed")
    if d.get("ecc_uncorrected"):
        say(Issue.ECC_ERRORS, True, f"{gpu} has {d['ecc_uncorrected']} uncorrected ECC error(s) "
            "since the driver loaded: its memory is failing; take it out of use")
    if d.get("ecc_on") is not None and d.get("ecc_pending_on") not in (None, d["ecc_on"]):
        say(Issue.ECC_PENDING, False, f"{gpu}'s ECC mode changes to "
            f"{'on' if d['ecc_pending_on'] else 'off'} at the next reboot")
    reset = f"reset the GPU (nvidia-smi -r -i {d.get('index')}) or reboot before using it"
    if d.get("retired_pending"):
        say(Issue.RETIRED_PENDING, True, f"{gpu} has memory pages waiting to be retired: {reset}")
    if d.get("remap_failure"):
        say(Issue.REMAP_FAILED, True, f"{gpu}'s row remapping failed: it has no spare rows left "
            "and needs service")
    elif d.get("remap_pending"):
        say(Issue.REMAP_PENDING, True, f"{gpu} has memory rows waiting to be remapped: {reset}")


#: what else found explains a TensorFlow that sees fewer GPUs than given
_FEWER_BECAUSE = {Issue.DRIVER_TOO_OLD: "the driver is older than its CUDA needs",
                  Issue.CAPABILITY: "it does not run on this GPU's compute capability",
                  Issue.NOT_FOUND: "CUDA stops at the entry that names no GPU"}


def _why_fewer(found: list[GivenGpu], build: TfBuild,
               said: list[GpuFinding]) -> str:
    """The cause of a TF that sees fewer GPUs than given, from what else was found."""
    if build and not build.get("cuda_build"):
        return "this TensorFlow is built without CUDA (pip install 'tensorflow[and-cuda]')"
    for issue, because in _FEWER_BECAUSE.items():
        if any(f.issue is issue for f in said):
            return because
    if sum(1 for d in found if d.get("mig")) > 1:
        return "CUDA uses one MIG device per process: give each task one"
    return ("TensorFlow could not load its CUDA libraries: the task's log names the missing "
            "one (%tfdist_logs --grep dlopen)")


def _growth(r: GpuReadings) -> str | None:
    """The task's memory policy when it is not "all of every GPU at the first op"."""
    tf = r.get("tf") or {}
    if str(r.get("allow_growth_env") or "").lower() == "true":
        return "growth (TF_FORCE_GPU_ALLOW_GROWTH)"
    if tf.get("growth") and all(tf["growth"]):
        return "growth (set_memory_growth)"
    if tf.get("limit_mb") and all(tf["limit_mb"]):
        return f"limit {'/'.join(f'{m:.0f}' for m in tf['limit_mb'])} MB"
    return None


def _shared(readings: Mapping[str, GpuReadings]) -> dict[str, list[str]]:
    """GPU (UUID, or host/entry without NVML) -> the tasks given it, where more than one."""
    holders: dict[str, list[str]] = defaultdict(list)
    for task, r in readings.items():
        for d in r.get("devices") or []:
            holders[d.get("uuid") or f"{r.get('host')}/{d['entry']}"].append(task)
    return {gpu: ts for gpu, ts in holders.items() if len(ts) > 1}


def _sharing(readings: Mapping[str, GpuReadings]) -> list[GpuFinding]:
    out = []
    for gpu, tasks in _shared(readings).items():
        bare = [t for t in tasks if _growth(readings[t]) is None]
        if bare:
            out.append(GpuFinding(tuple(tasks), Issue.SHARED, True, f"given the same GPU {gpu} "
                                  f"and {name_tasks(bare)} without memory growth: the first "
                                  "GPU op takes nearly all its memory and the others fail "
                                  "(TF_FORCE_GPU_ALLOW_GROWTH=true, or one GPU per task)"))
        else:
            out.append(GpuFinding(tuple(tasks), Issue.SHARED_GROWTH, False, f"share GPU {gpu} "
                                  "with memory growth on: NCCL refuses two ranks of one "
                                  "collective on one GPU, so collectives must use RING"))
    return out


def _allreduce(answers: Mapping[str, Mapping[str, Bandwidth | Failure]]
               ) -> tuple[pd.DataFrame | None, list[GpuFinding]]:
    """The timings table (one task's rows per implementation: every task times the same
    collective) and what they say: a failed collective, or NCCL worth asking for."""
    rows, said, best = [], [], {}
    for impl, per_task in answers.items():
        said += [GpuFinding((task,), Issue.ALLREDUCE_FAILED, True,
                            f"the {impl} all-reduce failed: {a['error']}; the cluster's "
                            "collectives fail until its tasks restart (%tfdist_restart)")
                 for task, a in per_task.items() if "error" in a and not a.get("released")]
        first = next((a for a in per_task.values() if "error" not in a and a.get("rows")),
                     None)
        if first is None:
            continue
        rows += [{"implementation": impl, **row} for row in first["rows"]]
        best[impl] = (first["rows"][-1], first.get("implementation"))
    if "NCCL" in best and "RING" in best:
        (nccl, own), (ring, _) = best["NCCL"], best["RING"]
        if own != "NCCL" and nccl["busbw_gb_s"] > NCCL_WORTH * ring["busbw_gb_s"]:
            said.append(GpuFinding(tuple(sorted(answers["NCCL"], key=task_order)),
                                   Issue.NCCL_FASTER, False,
                                   f"NCCL all-reduces {nccl['size_mb']:g} MB at "
                                   f"{nccl['busbw_gb_s']:.1f} GB/s bus bandwidth, RING at "
                                   f"{ring['busbw_gb_s']:.1f} GB/s, and the strategy uses "
                                   f"{own} (RING on GPUs): pass communication_options=tf."
                                   "distribute.experimental.CommunicationOptions(implementation"
                                   "=tf.distribute.experimental.CommunicationImplementation."
                                   "NCCL) to MultiWorkerMirroredStrategy"))
    return (pd.DataFrame(rows) if rows else None), said


def _merged(findings: list[GpuFinding]) -> list[GpuFinding]:
    """One finding per issue and text, naming every task it was found on (tasks of one host
    share its driver)."""
    merged: dict[tuple[Issue, str], GpuFinding] = {}
    for f in findings:
        seen = merged.get((f.issue, f.text))
        merged[(f.issue, f.text)] = f if seen is None else GpuFinding(
            (*seen.tasks, *f.tasks), f.issue, f.problem, f.text)
    return list(merged.values())


def _table(readings: Mapping[str, GpuReadings], no_gpu: Mapping[str, str],
           findings: list[GpuFinding]) -> pd.DataFrame:
    """One row per task and GPU given: what it is, what TF sees, versions, link, verdict."""
    rows = []
    for task, r in readings.items():
        nvml, tf = r.get("nvml") or {}, r.get("tf") or {}
        build = tf.get("build") or {}
        issues = ", ".join(str(f.issue) for f in findings if task in f.tasks) or "ok"
        common = {"task": task, "host": r.get("host"),
                  "cuda_visible_devices": r.get("cuda_visible_devices"), "tf_sees": tf.get("gpus"),
                  "driver": nvml.get("driver"), "driver_cuda": _dotted(nvml.get("cuda_driver")),
                  "tf_cuda": build.get("cuda"), "cudnn": build.get("cudnn"),
                  "nccl": r.get("nccl")}
        if task in no_gpu:
            rows.append({**common, "verdict": f"no GPU: {no_gpu[task]}"})
            continue
        common["memory"] = _growth(r) or "all of it at the first op"
        for d in r.get("devices") or [{"entry": "(TF only)"}]:
            rows.append({**common, "gpu": d["entry"], "uuid": d.get("uuid"),
                         "name": d.get("name"), "compute_capability": d.get("compute_capability"),
                         "pcie": _link(d), "verdict": issues})
    return pd.DataFrame(rows)


def _link(d: GivenGpu) -> str | None:
    if not d.get("pcie_gen"):
        return None
    return (f"gen{d['pcie_gen']} x{d.get('pcie_width')} "
            f"(max gen{d.get('pcie_gen_max')} x{d.get('pcie_width_max')})")


def _version(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in str(text).split("."))
    except ValueError:
        return None


def _cuda_pair(value: int | None) -> tuple[int, int] | None:
    """NVML's CUDA driver version (12060) as (12, 6)."""
    return (int(value) // 1000, int(value) % 1000 // 10) if value else None


def _dotted(value: int | None) -> str | None:
    pair = _cuda_pair(value)
    return f"{pair[0]}.{pair[1]}" if pair else None


def _lowest_capability(built: list[str]) -> tuple[int, ...] | None:
    """The lowest compute capability in TF's build (``sm_60``, ``compute_90``, ``sm_100a``)."""
    found = [(int(m[1]), int(m[2])) for c in built
             if (m := re.fullmatch(r"(?:sm|compute)_(\d+)(\d)[a-z]?", c))]
    return min(found, default=None)
