"""A GPU host checked end to end without TensorFlow: placement, NVML view, telemetry,
``%tfdist_check gpu`` and a real GPU out-of-memory, in one run of a few minutes.

    python -m bench.gpu_device_check [--load-s 8] [--json PATH]

A 2-worker cluster with ``preload=()`` (no TensorFlow import) and ``gpus="auto"``:

1. each task's ``CUDA_VISIBLE_DEVICES`` is what ``--gpus auto`` promises (``G // 2`` contiguous
   GPUs each, or both on GPU 0 with ``TF_FORCE_GPU_ALLOW_GROWTH=true`` when there is one), the
   ``gpus`` column of ``status()`` says the same, CUDA in the task counts as many devices, and
   the task's telemetry reads those GPUs by UUID;
2. every task loads its GPUs with matmuls (PyTorch, else CuPy) while telemetry samples them:
   utilisation, the task's own GPU memory, SM clock against its maximum, clock event reasons;
3. ``cluster.check("gpu")`` on the real NVML: no task without a GPU, each row the GPU given;
4. worker:1 fills its GPU and allocates beyond it: the failure is classified as a GPU
   out-of-memory (an alert of kind ``gpu_out_of_memory`` naming worker:1).

It prints one JSON line (``ok``, the checks, what was read) and exits 1 when a check fails,
2 (with the cause on stderr) when this host has no GPU or neither PyTorch nor CuPy.

How to run it on a GPU host without TensorFlow (the lent device machines have PyTorch, CuPy and
nvidia-ml-py, no TensorFlow and no network): the wheels of tfdist_nb, jupyter-client, ipykernel,
pyzmq and what they need beyond those (ipython, pandas, psutil, setproctitle and their own
dependencies) travel with the working tree in ``wheelhouse/``, made here for the device's Python
(``PY``, e.g. 3.11)::

    pip wheel --no-deps -w wheelhouse .                         # tfdist_nb itself
    pip download -d wheelhouse --only-binary=:all: --python-version PY \
        --platform manylinux2014_x86_64 jupyter-client ipykernel pyzmq ipython pandas \
        psutil setproctitle
    # on the GPU host, in the repository with wheelhouse/ beside it:
    pip install --no-index --no-deps wheelhouse/tfdist_nb-*.whl
    pip install --no-index --find-links wheelhouse jupyter-client ipykernel pyzmq ipython \
        pandas psutil setproctitle
    python -m bench.gpu_device_check

tfdist_nb goes in with ``--no-deps``: it declares TensorFlow, which this check never imports.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TASKS = ("worker:0", "worker:1")
#: per backend: how many devices CUDA gives the task, a loop of matmuls on each, and an
#: allocation beyond the GPU after filling it (held for a telemetry sample first)
BACKENDS = {
    "torch": {
        "count": "import torch\nprint('DEVICES', torch.cuda.device_count())",
        "load": """
import time, torch
xs = [torch.randn(4096, 4096, device=f"cuda:{{i}}") for i in range(torch.cuda.device_count())]
end = time.time() + {seconds}
while time.time() < end:
    for x in xs:
        x @ x
    torch.cuda.synchronize()
""",
        "oom": """
import time, torch
held = []
while torch.cuda.mem_get_info()[0] > 2 * 2**30:
    held.append(torch.empty(2**30, dtype=torch.uint8, device="cuda"))
time.sleep(2.5)  # a telemetry sample sees what the task holds
held.append(torch.empty(4 * torch.cuda.mem_get_info()[1], dtype=torch.uint8, device="cuda"))
""",
    },
    "cupy": {
        "count": "import cupy\nprint('DEVICES', cupy.cuda.runtime.getDeviceCount())",
        "load": """
import time, cupy
xs = []
for i in range(cupy.cuda.runtime.getDeviceCount()):
    with cupy.cuda.Device(i):
        xs.append(cupy.random.rand(4096, 4096, dtype=cupy.float32))
end = time.time() + {seconds}
while time.time() < end:
    for i, x in enumerate(xs):
        with cupy.cuda.Device(i):
            x @ x
            cupy.cuda.Device(i).synchronize()
""",
        "oom": """
import time, cupy
held = []
while cupy.cuda.runtime.memGetInfo()[0] > 2 * 2**30:
    held.append(cupy.empty(2**30, dtype=cupy.uint8))
time.sleep(2.5)  # a telemetry sample sees what the task holds
held.append(cupy.empty(4 * cupy.cuda.runtime.memGetInfo()[1], dtype=cupy.uint8))
""",
    },
}


class Checks:
    """Named verdicts with what was seen, for the JSON line."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}

    def add(self, name: str, ok: bool, seen: Any) -> None:
        self.items[name] = {"ok": bool(ok), "seen": seen}

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.items.values())


def no_gpu_here() -> str | None:
    """Why this host has no GPU for the check (the check's own words), or None."""
    from tfdist_nb.diagnostics.gpu_check import no_gpu_cause
    from tfdist_nb.worker.gpu_probe import gpu_readings

    return no_gpu_cause("this host", gpu_readings())


def host_uuids() -> list[str]:
    """The UUID of every GPU NVML sees here, by index."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return [str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def expected_placement(count: int) -> dict[str, str]:
    """What ``--gpus auto`` gives 2 workers on ``count`` GPUs (docs/gpus.md, Placement)."""
    if count == 1:
        return dict.fromkeys(TASKS, "0")
    k = count // 2
    return {t: ",".join(str(i) for i in range(n * k, n * k + k)) for n, t in enumerate(TASKS)}


def gpu_samples(run_dir: Path, since: float) -> dict[str, list[list[dict[str, Any]]]]:
    """Every telemetry sample's GPU readings per task since ``since`` (the run directory keeps
    them all: docs/reference.md, Run directory)."""
    out: dict[str, list[list[dict[str, Any]]]] = {t: [] for t in TASKS}
    for line in (run_dir / "telemetry.jsonl").read_text().splitlines():
        rec = json.loads(line)
        gpus = rec.get("data", {}).get("gpus")
        if rec.get("time", 0) >= since and rec.get("task") in out and gpus:
            out[rec["task"]].append(gpus)
    return out


def said(stdout: str, marker: str) -> list[str]:
    """The words after ``marker`` on the line a cell printed it on."""
    return next((ln.split()[1:] for ln in stdout.splitlines() if ln.startswith(marker)), [])


def uuids_of(given: str, uuids: list[str]) -> list[str]:
    """The UUIDs a CUDA_VISIBLE_DEVICES value names (indices, or UUIDs as they are)."""
    return sorted(uuids[int(e)] if e.isdigit() else e for e in given.split(",") if e)


def check_placement(c: Any, checks: Checks, uuids: list[str], backend: str) -> dict[str, str]:
    given = {t: c.tasks[next(k for k in c.tasks if str(k) == t)].gpus for t in TASKS}
    ran = c.run("import os\nprint('CVD', os.environ.get('CUDA_VISIBLE_DEVICES'), "
                "os.environ.get('TF_FORCE_GPU_ALLOW_GROWTH'))\n" + BACKENDS[backend]["count"],
                timeout=120)
    env = {t: said(ran.tasks[t].stdout, "CVD") for t in TASKS}
    devices = {t: said(ran.tasks[t].stdout, "DEVICES") for t in TASKS}
    status = dict(zip(c.status()["task"], c.status()["gpus"], strict=True))
    shared = len(uuids) == 1
    checks.add("placement", "CUDA_VISIBLE_DEVICES" in os.environ
               or given == expected_placement(len(uuids)),
               {"given": given, "expected": expected_placement(len(uuids))})
    checks.add("task_env", ran.ok and all(
        env[t] == [given[t], "true" if shared else "None"] for t in TASKS), env)
    checks.add("status_gpus_column", status == given, status)
    checks.add("cuda_device_count", all(
        devices[t] == [str(len(given[t].split(",")))] for t in TASKS), devices)
    return given


def check_telemetry(c: Any, checks: Checks, given: dict[str, str], uuids: list[str],
                    since: float) -> dict[str, Any]:
    samples = gpu_samples(c.run_dir, since)
    read: dict[str, Any] = {}
    for task, per in samples.items():
        flat = [g for gpus in per for g in gpus]
        read[task] = {
            "samples": len(per), "uuids": sorted({str(g.get("uuid")) for g in flat}),
            "util_max": max((g.get("util_percent") or 0 for g in flat), default=None),
            "task_mem_mb_max": max((g.get("task_mem_mb") or 0 for g in flat), default=None),
            "sm_clock_mhz": [g.get("sm_clock_mhz") for g in flat[-1:]],
            "sm_clock_max_mhz": [g.get("sm_clock_max_mhz") for g in flat[-1:]],
            "reasons": sorted({r for g in flat for r in g.get("throttle") or ()}),
        }
    wanted = {t: uuids_of(given[t], uuids) for t in TASKS}
    checks.add("telemetry_nvml_view", all(read[t]["uuids"] == wanted[t] for t in TASKS),
               {"wanted": wanted, "read": {t: read[t]["uuids"] for t in TASKS}})
    checks.add("telemetry_util", all((read[t]["util_max"] or 0) > 0 for t in TASKS),
               {t: read[t]["util_max"] for t in TASKS})
    checks.add("telemetry_task_memory", all((read[t]["task_mem_mb_max"] or 0) > 0
                                            for t in TASKS),
               {t: read[t]["task_mem_mb_max"] for t in TASKS})
    checks.add("telemetry_clocks", all(read[t]["sm_clock_mhz"] and read[t]["sm_clock_max_mhz"]
                                       and read[t]["sm_clock_max_mhz"][0] for t in TASKS),
               {t: (read[t]["sm_clock_mhz"], read[t]["sm_clock_max_mhz"]) for t in TASKS})
    status = c.status().set_index("task")
    checks.add("status_gpu_columns", status[["gpu_util_percent", "gpu_mem_mb"]].notna().all()
               .all(), status[["gpus", "gpu_util_percent", "gpu_mem_mb"]].to_dict("index"))
    return read


def check_gpu_report(c: Any, checks: Checks, given: dict[str, str],
                     uuids: list[str]) -> dict[str, Any]:
    report = c.check("gpu")
    rows = report.table
    by_task = {t: sorted(rows[rows["task"] == t]["uuid"].dropna()) for t in TASKS}
    wanted = {t: uuids_of(given[t], uuids) for t in TASKS}
    checks.add("check_gpu", not report.no_gpu and by_task == wanted,
               {"ok": report.ok, "summary": report.summary, "uuids": by_task})
    return {"ok": report.ok, "summary": report.summary, "details": report.details}


def check_oom(c: Any, checks: Checks, backend: str) -> dict[str, Any]:
    failed = c.run(BACKENDS[backend]["oom"], on="worker:1", timeout=180)
    task = failed.tasks["worker:1"]
    kinds = [a.kind for a in c.hub.alerts if a.task == "worker:1"]
    checks.add("oom_classified", not failed.ok and "gpu_out_of_memory" in kinds,
               {"status": str(task.status), "kinds": kinds})
    return {"status": str(task.status), "error": task.error.evalue if task.error else None,
            "explanation": task.explanation, "alert_kinds": kinds}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load-s", type=float, default=8.0, help="seconds of matmuls per task")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    cause = no_gpu_here()
    backend = next((b for b in BACKENDS if importlib.util.find_spec(b)), None)
    if cause is not None or backend is None:
        why = cause or "neither PyTorch nor CuPy is installed to load the GPUs"
        print(f"gpu_device_check: cannot run here: {why}. Run it on a GPU host (see the top "
              "of bench/gpu_device_check.py)", file=sys.stderr)
        raise SystemExit(2)
    from tfdist_nb import Cluster

    started, checks, uuids = time.time(), Checks(), host_uuids()
    out: dict[str, Any] = {"gpus": len(uuids), "backend": backend}
    with tempfile.TemporaryDirectory() as runs, Cluster(
            workers=2, preload=(), gpus="auto", warm=False, run_dir=runs) as c:
        given = check_placement(c, checks, uuids, backend)
        since = time.time()
        loaded = c.run(BACKENDS[backend]["load"].format(seconds=args.load_s), timeout=180)
        checks.add("load", loaded.ok, loaded.summary())
        out["telemetry"] = check_telemetry(c, checks, given, uuids, since)
        out["check_gpu"] = check_gpu_report(c, checks, given, uuids)
        out["oom"] = check_oom(c, checks, backend)
    out.update(ok=checks.ok, seconds=round(time.time() - started, 1), checks=checks.items)
    line = json.dumps(out, default=str)
    print(line)
    if args.json:
        args.json.write_text(line + "\n")
    return out


if __name__ == "__main__":
    raise SystemExit(0 if main()["ok"] else 1)
