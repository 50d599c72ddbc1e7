"""``%tfdist_check gpu`` (docs/gpus.md): the judgement over fake readings for each thing that
can be wrong and for a healthy GPU host (the NVML part read by the real probe from the fake NVML
module: there is no GPU here), and the check on this CPU machine's real cluster."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.fake_nvml import (
    FakeGpu,
    FakeMig,
    FakeNvml,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
)
from tfdist_nb.diagnostics.gpu_check import Issue, allreduce_plan, analyse
from tfdist_nb.worker.gpu_probe import gpu_readings

TF_BUILD = {"cuda_build": True, "cuda": "12.5.1", "cudnn": "9",
            "capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]}


def tf_view(gpus: int = 1, growth: bool = False, **build: Any) -> dict[str, Any]:
    """What TensorFlow in a task on a GPU host says (there is none here to ask)."""
    return {"build": {**TF_BUILD, **build}, "gpus": gpus, "growth": [growth] * gpus,
            "limit_mb": [None] * gpus}


def read(monkeypatch: pytest.MonkeyPatch, nvml: Any, cvd: str | None,
         tf: dict[str, Any] | None = None, growth: str | None = None) -> dict[str, Any]:
    """One task's readings through the real probe: its CUDA_VISIBLE_DEVICES and NVML."""
    for key, value in (("CUDA_VISIBLE_DEVICES", cvd), ("TF_FORCE_GPU_ALLOW_GROWTH", growth)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    out = gpu_readings(nvml)
    out["tf"] = tf
    return out


def two_tasks(monkeypatch: pytest.MonkeyPatch, nvml: Any, cvds: tuple[str, str] = ("0", "1"),
              tf: dict[str, Any] | None = None,
              growth: str | None = None) -> dict[str, dict[str, Any]]:
    tf = tf_view() if tf is None else tf
    return {f"worker:{i}": read(monkeypatch, nvml, cvd, tf, growth)
            for i, cvd in enumerate(cvds)}


def issues(report: Any) -> dict[Issue, tuple[str, ...]]:
    return {f.issue: f.tasks for f in report.findings}


def timings(busbw: dict[str, float], own: str = "AUTO") -> dict[str, dict[str, Any]]:
    """Both tasks' all-reduce answers per implementation, at 256 MB."""
    return {impl: {t: {"replicas": 2, "implementation": own, "rows": [
        {"size_mb": 256.0, "time_ms": 1.0, "algbw_gb_s": bw, "busbw_gb_s": bw}]}
        for t in ("worker:0", "worker:1")} for impl, bw in busbw.items()}


# ------------------------------------------------------------------ a healthy host: silence


def test_a_healthy_gpu_host_draws_no_complaint(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = two_tasks(monkeypatch, FakeNvml(count=2))
    assert allreduce_plan(readings) == (["RING", "NCCL"], None)
    report = analyse(readings, timings({"RING": 40.0, "NCCL": 44.0}))
    assert report.ok and report.findings == [] and report.no_gpu == {}, report
    assert report.summary.startswith("the GPUs look right (worker:0: GPU 0; worker:1: GPU 1)")
    assert list(report.table["verdict"]) == ["ok", "ok"]
    row = report.table.iloc[1]
    assert row["uuid"] == "GPU-00000001-fake-4000-8000-000000000001"
    assert (row["driver"], row["driver_cuda"], row["tf_cuda"]) == ("560.35.03", "12.6", "12.5.1")
    assert row["pcie"] == "gen5 x16 (max gen5 x16)"
    assert list(report.allreduce["implementation"]) == ["RING", "NCCL"]


def test_an_idle_gpu_with_a_slower_link_is_not_called_wrong(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle GPUs lower their PCIe generation to save power: not a finding."""
    idle = FakeNvml(gpus=[FakeGpu(0, pcie_gen=1, util_percent=0), FakeGpu(1)])
    assert analyse(two_tasks(monkeypatch, idle)).findings == []


# ------------------------------------------------------------------ each thing that is wrong


def test_a_driver_older_than_tf_cuda_names_the_tasks_and_versions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    old = FakeNvml(count=2, driver="470.82.01", cuda_driver=11040)
    report = analyse(two_tasks(monkeypatch, old, tf=tf_view(gpus=0)))
    assert not report.ok
    assert issues(report)[Issue.DRIVER_TOO_OLD] == ("worker:0", "worker:1")
    assert report.summary.startswith(
        "worker:0 and worker:1: driver 470.82.01 supports CUDA up to 11.4; TensorFlow was "
        "built for CUDA 12.5.1: update the NVIDIA driver (CUDA 12 needs 525.60.13 or later)")
    fewer = next(f for f in report.findings if f.issue is Issue.TF_SEES_FEWER)
    assert fewer.text.endswith("the driver is older than its CUDA needs")
    # an older minor version runs through minor-version compatibility: a note, not a failure
    minor = analyse(two_tasks(monkeypatch, FakeNvml(count=2, cuda_driver=12020)))
    assert minor.ok and Issue.DRIVER_MINOR in issues(minor)


def test_a_pcie_link_below_its_maximum_names_the_task_and_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    narrow = FakeNvml(gpus=[FakeGpu(0), FakeGpu(1, pcie_width=8)])
    report = analyse(two_tasks(monkeypatch, narrow))
    assert not report.ok and issues(report) == {Issue.PCIE_WIDTH: ("worker:1",)}
    assert "GPU 1 (Fake H200)'s PCIe link runs x8 of x16: 50% of its host bandwidth" in (
        report.summary)
    busy = FakeNvml(gpus=[FakeGpu(0, pcie_gen=3, util_percent=90), FakeGpu(1)])
    report = analyse(two_tasks(monkeypatch, busy))
    assert issues(report) == {Issue.PCIE_GEN: ("worker:0",)}
    assert "runs gen3 of gen5 while busy (90%)" in report.summary


def test_two_tasks_given_the_same_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(count=1)
    report = analyse(two_tasks(monkeypatch, nvml, ("0", "0")))
    assert not report.ok and issues(report) == {Issue.SHARED: ("worker:0", "worker:1")}
    assert "given the same GPU GPU-00000000-fake-4000-8000-000000000000" in report.summary
    assert "without memory growth" in report.summary
    # with memory growth (what the placement sets when tasks must share): a note about NCCL
    readings = two_tasks(monkeypatch, nvml, ("0", "0"), growth="true")
    report = analyse(readings)
    assert report.ok and issues(report) == {Issue.SHARED_GROWTH: ("worker:0", "worker:1")}
    assert "NCCL refuses two ranks of one collective on one GPU" in str(report)
    assert allreduce_plan(readings)[0] == ["RING"]  # NCCL would fail, and break collectives


@pytest.mark.parametrize(("gpu", "issue", "needle"), [
    (FakeGpu(0, retired_pending=1), Issue.RETIRED_PENDING,
     "memory pages waiting to be retired: reset the GPU (nvidia-smi -r -i 0) or reboot"),
    (FakeGpu(0, remapped_rows=(0, 2, 1, 0)), Issue.REMAP_PENDING,
     "memory rows waiting to be remapped: reset the GPU"),
    (FakeGpu(0, remapped_rows=(0, 9, 0, 1)), Issue.REMAP_FAILED, "row remapping failed"),
    (FakeGpu(0, ecc_uncorrected=3), Issue.ECC_ERRORS, "3 uncorrected ECC error(s)"),
    (FakeGpu(0, compute_capability=(3, 7)), Issue.CAPABILITY,
     "compute capability 3.7; this TensorFlow runs on 6.0 and up"),
])
def test_gpu_health_problems_name_the_task_and_gpu(monkeypatch: pytest.MonkeyPatch,
                                                    gpu: FakeGpu, issue: Issue,
                                                    needle: str) -> None:
    report = analyse(two_tasks(monkeypatch, FakeNvml(gpus=[gpu, FakeGpu(1)])))
    assert not report.ok and issues(report)[issue] == ("worker:0",)
    assert report.summary.startswith("worker:0: GPU 0 (Fake H200)") and needle in str(report)


def test_unsupported_health_readings_are_no_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer board answers NotSupported for ECC and row remapping: absent, not wrong."""
    bare = FakeGpu(0, ecc_mode=None, retired_pending=None, remapped_rows=None)
    readings = two_tasks(monkeypatch, FakeNvml(gpus=[bare, FakeGpu(1)]))
    assert readings["worker:0"]["devices"][0]["ecc_on"] is None
    assert analyse(readings).findings == []


@pytest.mark.parametrize(("tf", "nvml", "cvds", "cause"), [
    (tf_view(gpus=0), FakeNvml(count=2), ("0", "1"),
     "TensorFlow could not load its CUDA libraries"),
    (tf_view(gpus=0, cuda_build=False), FakeNvml(count=2), ("0", "1"),
     "this TensorFlow is built without CUDA"),
    (tf_view(gpus=1), FakeNvml(gpus=[FakeGpu(0, migs=[FakeMig("MIG-a"), FakeMig("MIG-b")])]),
     ("MIG-a,MIG-b", "MIG-a,MIG-b"), "CUDA uses one MIG device per process"),
])
def test_tf_seeing_fewer_gpus_than_given_says_why(monkeypatch: pytest.MonkeyPatch,
                                                  tf: dict[str, Any], nvml: FakeNvml,
                                                  cvds: tuple[str, str], cause: str) -> None:
    report = analyse(two_tasks(monkeypatch, nvml, cvds, tf=tf))
    fewer = next(f for f in report.findings if f.issue is Issue.TF_SEES_FEWER)
    assert not report.ok and fewer.tasks == ("worker:0", "worker:1")
    assert cause in fewer.text, fewer


def test_a_given_gpu_the_host_does_not_have(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = two_tasks(monkeypatch, FakeNvml(count=2), ("0", "5,1"))
    report = analyse(readings)
    assert issues(report)[Issue.NOT_FOUND] == ("worker:1",)
    assert ("given GPU 5 but NVML on" in report.summary
            and "(2 GPU(s): 0-1); CUDA stops at that entry, so 1 after it are not used either"
            in report.summary)


def test_nccl_faster_than_the_strategys_ring_is_said_with_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    readings = two_tasks(monkeypatch, FakeNvml(count=2))
    report = analyse(readings, timings({"RING": 12.0, "NCCL": 150.0}))
    assert report.ok and issues(report) == {Issue.NCCL_FASTER: ("worker:0", "worker:1")}
    assert ("NCCL all-reduces 256 MB at 150.0 GB/s bus bandwidth, RING at 12.0 GB/s, and the "
            "strategy uses AUTO (RING on GPUs)") in str(report)
    assert "CommunicationImplementation.NCCL" in str(report)
    # a strategy that asked for NCCL already: nothing to say
    assert analyse(readings, timings({"RING": 12.0, "NCCL": 150.0}, own="NCCL")).findings == []


def test_a_failed_collective_names_the_task_not_the_ones_released(
        monkeypatch: pytest.MonkeyPatch) -> None:
    answers = timings({"RING": 12.0})
    answers["NCCL"] = {"worker:0": {"error": "NCCL error: unhandled system error"},
                       "worker:1": {"error": "Collective ops is aborted", "released": True}}
    report = analyse(two_tasks(monkeypatch, FakeNvml(count=2)), answers)
    assert not report.ok and issues(report) == {Issue.ALLREDUCE_FAILED: ("worker:0",)}
    assert "the NCCL all-reduce failed: NCCL error: unhandled system error" in report.summary


def test_a_task_that_does_not_answer_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    readings: dict[str, dict[str, Any]] = two_tasks(monkeypatch, FakeNvml(count=2))
    readings["worker:1"] = {"error": "no answer within 60s", "answered": False}
    report = analyse(readings)
    assert not report.ok and report.summary == "worker:1 did not answer the GPU check"
    assert allreduce_plan(readings)[0] == []


# ------------------------------------------------------------------ no GPU: why, no failure


@pytest.mark.parametrize(("nvml", "cvd", "task", "cause"), [
    (FakeNvml(init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found")), None,
     "worker:0", "no NVML library (libnvidia-ml.so) on"),
    (FakeNvml(init_error=NVMLError_DriverNotLoaded("Driver Not Loaded")), None, "worker:0",
     "no driver: the NVIDIA kernel driver is not loaded on"),
    (FakeNvml(count=0), None, "worker:0", "no device: NVML finds no GPU on"),
    (FakeNvml(count=2), "", "worker:0",
     "hidden: CUDA_VISIBLE_DEVICES='' (what --gpus none gives), and"),
    (FakeNvml(count=2), "", "ps:0", "ps tasks are given no GPU"),
])
def test_a_task_without_a_gpu_says_why_and_does_not_fail(
        monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml, cvd: str | None, task: str,
        cause: str) -> None:
    report = analyse({task: read(monkeypatch, nvml, cvd, tf_view(gpus=0))})
    assert report.ok and report.findings == []
    assert cause in report.no_gpu[task] and report.summary.startswith(f"no GPU: {task}: ")
    assert report.table["verdict"][0].startswith("no GPU: ")


def test_no_nvml_module_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    report = analyse({"worker:0": read(monkeypatch, None, None)})
    assert report.ok and report.no_gpu["worker:0"] == (
        "no NVML library: nvidia-ml-py is not installed in the task's Python")


def test_a_ps_without_a_gpu_beside_workers_with_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(count=2)
    readings = {**two_tasks(monkeypatch, nvml), "ps:0": read(monkeypatch, nvml, "", None)}
    report = analyse(readings)
    assert report.ok and report.no_gpu == {"ps:0": "ps tasks are given no GPU"}
    assert "ps:0: no GPU (ps tasks are given no GPU)" in report.summary


def test_env_names_the_driver_and_the_models_of_the_gpus_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tfdist_nb.worker.probes import env_report

    nvml = FakeNvml(gpus=[FakeGpu(0, name="NVIDIA A100"), FakeGpu(1, name="NVIDIA H100")])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    props = env_report()["props"]
    assert (props["nvidia_driver"], props["gpus"]) == ("560.35.03", "NVIDIA H100")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fail_init=True))
    assert "nvidia_driver" not in env_report()["props"]  # no GPU reads as empty


# ------------------------------------------------------------------ a real cluster, no GPU


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_the_check_on_this_cpu_machine_says_no_gpu_and_why() -> None:
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    from tests.gpu_here import visible_nvml_gpus
    from tfdist_nb import Cluster
    from tfdist_nb.cluster.session import SESSION

    if visible_nvml_gpus():
        pytest.skip("this machine has a GPU: bench/gpu_device_check.py covers GPU hosts")
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("tfdist_nb")
    with Cluster(workers=2) as c:
        made = c.run("import tensorflow as tf\n"
                     "strategy = tf.distribute.MultiWorkerMirroredStrategy()")
        assert made.ok, made
        SESSION.clusters.set_current(c)
        try:
            report = ip.run_line_magic("tfdist_check", "gpu")
            with pytest.raises(UsageError, match="the gpu check takes no argument"):
                ip.run_line_magic("tfdist_check", "gpu model")
        finally:
            SESSION.clusters.set_current(None)
        assert report.ok and set(report.no_gpu) == {"worker:0", "worker:1"}, report
        for cause in report.no_gpu.values():  # nvidia-ml-py is installed, no driver is
            assert cause.startswith("no NVML library (libnvidia-ml.so) on"), cause
        assert report.summary.startswith("no GPU: worker:0 and worker:1: no NVML library")
        assert report.allreduce is None  # the collective runs only where tasks have GPUs
        assert list(report.table["tf_sees"]) == [0, 0]
        # the per-call implementation the check times with, on the real strategy
        nccl = c.run("from tfdist_nb.worker.probes import allreduce_bandwidth\n"
                     "got = allreduce_bandwidth([1.0], implementation='NCCL')\n"
                     "print(got['implementation'], got['replicas'], len(got['rows']))")
        assert nccl.ok, nccl
        assert nccl.tasks["worker:1"].stdout.splitlines()[-1] == "AUTO 2 1", nccl
