"""GPU evidence and advice (docs/reference.md, "GPU readings" and "GPU advice"), pure: NVML is
the fake at the module boundary (tests/fake_nvml.py: no GPU here), the rest is the real sampler,
telemetry, event hub, detectors and classifier. Error texts are real ones, cited where found."""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.fake_nvml import FakeGpu, FakeNvml
from tfdist_nb.cluster.cells import Cells
from tfdist_nb.cluster.hub import EventHub
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.diagnostics.gpu_faults import GpuFaultKind, classify
from tfdist_nb.diagnostics.straggler import evidence
from tfdist_nb.display.printer import LivePrinter
from tfdist_nb.events import Finding, OutputLine, TelemetrySample, gpu_summary
from tfdist_nb.results import RemoteError, RunResult, TaskResult, TaskStatus
from tfdist_nb.store.logs import level_of
from tfdist_nb.store.rundir import RunDirectory
from tfdist_nb.store.tails import LiveStore
from tfdist_nb.topology import TaskId
from tfdist_nb.worker import _startup, state
from tfdist_nb.worker.gpu import GpuSampler
from tfdist_nb.worker.telemetry import Telemetry

UUID = "GPU-5a1c0e2d-0000-4000-8000-000000000001"


@pytest.fixture(autouse=True)
def _every_gpu_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def read(*gpus: FakeGpu, **nvml: Any) -> list[dict[str, Any]]:
    readings = GpuSampler(FakeNvml(gpus=list(gpus), **nvml)).sample()
    assert readings is not None
    return readings


def hub(tmp_path: Path, roles: dict[str, tuple[str, str]] | None = None) -> EventHub:
    return EventHub(RunDirectory(tmp_path, "c1"), LiveStore(), lambda: roles or {})


def sample(task: str, **data: Any) -> TelemetrySample:
    return TelemetrySample(1.0, task, data)


# ------------------------------------------------------------------------- the readings
def test_every_reading_of_a_throttled_gpu_reaches_its_record() -> None:
    """Board limit (0x200) and reliability (0x400) decode too; the clock event reasons come from
    the current getter, never the deprecated throttle one; the throttle time is in ms."""
    nvml = FakeNvml(gpus=[FakeGpu(
        0, uuid=UUID, sm_clock_mhz=1100, clock_reasons=0x40 | 0x200 | 0x400, temperature_c=88,
        power_mw=690_000, throttle_ns={"hw_thermal_slowdown": 7_500_000_000}, pcie_gen=3,
        pcie_width=8, pcie_replays=12, ecc_corrected=3, ecc_uncorrected=1)])
    [g] = GpuSampler(nvml).sample() or []
    assert g["uuid"] == UUID
    assert (g["sm_clock_mhz"], g["sm_clock_max_mhz"], g["temperature_c"]) == (1100, 1980, 88)
    assert g["throttle"] == ["hw_thermal_slowdown", "board_limit", "reliability"]
    assert g["throttle_ms"] == {"hw_thermal_slowdown": 7500.0}
    assert (g["power_w"], g["power_limit_w"]) == (690.0, 700.0)
    assert (g["pcie_gen"], g["pcie_gen_max"], g["pcie_width"], g["pcie_width_max"],
            g["pcie_replays"]) == (3, 5, 8, 16, 12)
    assert (g["ecc_corrected"], g["ecc_uncorrected"], g["xid"]) == (3, 1, [])
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" not in nvml.calls


def test_unsupported_queries_read_as_absent_never_zero() -> None:
    """A consumer board: no power reading, no ECC, no throttle-time counters, no XID events;
    an nvidia-ml-py without the clock event getter falls back to the throttle one."""
    nvml = FakeNvml(gpus=[FakeGpu(0, power_mw=None, ecc_mode=None, throttle_ns=None,
                                  xids=None)])
    nvml.nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment,method-assign]
    [g] = GpuSampler(nvml).sample() or []
    assert [g[k] for k in ("power_w", "ecc_corrected", "ecc_uncorrected", "throttle_ms",
                           "xid")] == [None] * 5
    assert g["throttle"] == [] and "nvmlDeviceGetCurrentClocksThrottleReasons" in nvml.calls


@pytest.fixture
def child() -> Iterator[int]:
    """A process this test's process started (as a task's data loader would be)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_per_process_memory_counts_only_the_tasks_own_processes(child: int) -> None:
    """Its own process and its child count; pid 1 (another process on the same GPU) does not;
    the status column then shows what the task holds, not the whole GPU's use."""
    [g] = read(FakeGpu(0, mem_used_mb=12000.0,
                       processes={os.getpid(): 700.0, child: 300.0, 1: 11000.0}))
    assert g["task_mem_mb"] == 1000.0 and g["mem_used_mb"] == 12000.0
    assert gpu_summary([g]) == (40.0, 1000.0)
    # NVML's pids from another PID namespace (a container): none exists here, so unknown
    [g] = read(FakeGpu(0, processes={2**22 - 7: 500.0}))
    assert g["task_mem_mb"] is None and gpu_summary([g])[1] == g["mem_used_mb"]


def test_an_xid_is_said_at_once_and_once_as_a_hardware_fault(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []
    nvml = FakeNvml(gpus=[FakeGpu(0, uuid=UUID, xids=[79])])
    tel = Telemetry(sent.append, gpu=GpuSampler(nvml))
    tel.start()
    tel.stop()
    tel.flush()
    nvml.gpus[0].xids = [79]  # the driver reports it again: known already
    tel.flush()
    [first, second] = sent
    [note] = first["notes"]
    assert note["finding"] == Finding.GPU_XID and note["level"] == "WARNING"
    assert f"GPU 0 ({UUID}) reported XID 79 (GPU has fallen off the bus), a hardware or " \
           "driver fault" in note["text"]
    assert "notes" not in second and second["gpus"][0]["xid"] == [79]
    h = hub(tmp_path)
    h.sink([sample("worker:0", **first)])
    assert [a.kind for a in h.alerts] == [Finding.GPU_XID]
    quiet: list[dict[str, Any]] = []  # a GPU that reports none
    tel = Telemetry(quiet.append, gpu=GpuSampler(FakeNvml(count=1)))
    tel.start()
    tel.stop()
    tel.flush()
    assert "notes" not in quiet[0] and quiet[0]["gpus"][0]["xid"] == []


# ------------------------------------------------------------------------- RING advice
Implementation = enum.Enum("Implementation", "AUTO RING NCCL")  # TF's CommunicationImplementation


def strategy_note(monkeypatch: pytest.MonkeyPatch, implementation: str, device: str,
                  devices: int) -> dict[str, Any]:
    """What the worker's MWMS start-up hook says about a strategy TensorFlow just made."""
    sent: list[dict[str, Any]] = []
    tel = Telemetry(sent.append)
    tel.start()
    tel.stop()
    monkeypatch.setattr(state, "telemetry", tel)
    extended = SimpleNamespace(
        _communication_options=SimpleNamespace(implementation=Implementation[implementation]),
        _local_device_type=device, _num_devices_per_worker=devices)
    _startup._observed(extended)
    tel.flush()
    [note] = sent[-1]["notes"]
    assert note["finding"] == Finding.STRATEGY and note["level"] == "INFO"
    return note


def test_ring_on_gpus_is_advised_once_per_cluster_with_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    note = strategy_note(monkeypatch, "AUTO", "GPU", 2)
    assert note["facts"] == {"implementation": "AUTO", "device": "GPU", "devices": 2}
    h = hub(tmp_path)
    h.sink([sample(t, notes=[note]) for t in ("worker:0", "worker:1")])
    [advice] = [a for a in h.alerts if a.kind == Finding.RING_ON_GPUS]
    assert advice.task == "worker:0"
    assert advice.text.startswith("MultiWorkerMirroredStrategy on 2 GPU(s) per task runs its "
                                  "collectives with AUTO, which TensorFlow runs as RING")
    assert "CommunicationImplementation.NCCL" in advice.text
    assert h.strategies["worker:1"]["implementation"] == "AUTO"


@pytest.mark.parametrize(("implementation", "device"), [("AUTO", "CPU"), ("NCCL", "GPU")])
def test_no_ring_advice_on_cpus_or_when_nccl_was_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, implementation: str,
        device: str) -> None:
    h = hub(tmp_path)
    h.sink([sample("worker:0", notes=[strategy_note(monkeypatch, implementation, device, 1)])])
    assert list(h.alerts) == []


# ------------------------------------------------------------------------- errors classified
def gpu(index: int, uuid: str = UUID, **reading: Any) -> dict[str, Any]:
    return {"index": index, "uuid": uuid, "mem_total_mb": 81559.0, "mem_used_mb": 80100.0,
            **reading}


# TensorFlow's OOM text, as in tensorflow/tensorflow#22088 ("Resource exhausted: OOM when
# allocating tensor with shape"), on a GPU allocator
TF_OOM = ("OOM when allocating tensor with shape[256,1024,1024] and type float on "
          "/job:worker/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")
# tensorflow/tensorflow#39110 (MWMS without memory growth)
CUDA_OOM = ("2020-05-03 02:06:02.069644: I tensorflow/stream_executor/cuda/cuda_driver.cc:764] "
            "failed to allocate 12.99G (13943597824 bytes) from device: "
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory")


def test_a_gpu_oom_names_the_task_its_gpu_what_it_held_and_the_causes_it_showed() -> None:
    """worker:0 and worker:1 show the same GPU UUID, memory growth is off, and the failed
    tensor's shape is known: each cause is said, with its evidence."""
    latest = {"worker:0": {"gpus": [gpu(0, task_mem_mb=80000.0)]},
              "worker:1": {"gpus": [gpu(0, task_mem_mb=100.0)]}}
    fault = classify("worker:0", f"ResourceExhaustedError: {TF_OOM}", latest,
                     {"CUDA_VISIBLE_DEVICES": "0"})
    assert fault is not None and fault.kind is GpuFaultKind.OUT_OF_MEMORY
    assert fault.text.startswith(f"worker:0 ran out of GPU memory on GPU 0 ({UUID}) "
                                 "(CUDA_VISIBLE_DEVICES=0); at its last sample it held 80000 "
                                 "of 81559 MB on GPU 0. Likely: worker:1 use(s) the same GPU")
    assert "memory growth is off" in fault.text
    assert "float[256,1024,1024] (1024 MB), grows with the batch per replica" in fault.text
    assert fault.about == ("worker:1",)


def test_a_gpu_oom_alone_on_its_gpu_with_memory_growth_names_no_cause_it_did_not_see() -> None:
    latest = {"worker:0": {"gpus": [gpu(0, task_mem_mb=30000.0)]},
              "worker:1": {"gpus": [gpu(1, uuid="GPU-other")]}}
    fault = classify("worker:0", CUDA_OOM, latest, {"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
    assert fault is not None and fault.kind is GpuFaultKind.OUT_OF_MEMORY
    assert fault.text.endswith("Likely: the model and its batch need more than this GPU "
                               "holds: a smaller batch per replica, mixed precision, or more "
                               "GPUs")
    assert fault.about == ()
    # PyTorch's and CuPy's own words (torch/csrc/cuda/CUDACachingAllocator.cpp, cupy/cuda/
    # memory.pyx), as the TF-free device check's cells raise them
    for other in ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
                  "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,024 bytes"):
        said = classify("worker:0", other, latest, {"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
        assert said is not None and said.kind is GpuFaultKind.OUT_OF_MEMORY
    assert classify("worker:0", "ValueError: bad shape", latest, {}) is None
    cpu_oom = "OOM when allocating tensor with shape[1000,1000] on /job:worker/device:CPU:0"
    assert classify("worker:0", cpu_oom, {"worker:0": {"gpus": None}}, {}) is None


def test_nccl_errors_are_classified_with_their_cause() -> None:
    latest = {"worker:0": {"gpus": [gpu(0)]}, "worker:1": {"gpus": [gpu(0)]}}
    # horovod/horovod#3929
    duplicate = ("smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : "
                 "rank 2 and rank 0 both on CUDA device 1000")
    fault = classify("worker:1", duplicate, latest, {})
    assert fault is not None and fault.kind is GpuFaultKind.NCCL_DUPLICATE_GPU
    assert "ranks 2 and 0 on CUDA device 1000" in fault.text
    assert "worker:1 shares its GPU with worker:0" in fault.text and fault.about == ("worker:0",)
    # without NCCL_DEBUG TensorFlow says only "invalid usage": the shared UUID tells the rest
    invalid = "InternalError: ncclCommInitRank failed: invalid usage"
    assert classify("worker:1", invalid, latest, {}).kind is GpuFaultKind.NCCL_DUPLICATE_GPU
    apart = {"worker:0": {"gpus": [gpu(0)]}, "worker:1": {"gpus": [gpu(1, uuid="GPU-b")]}}
    assert classify("worker:1", invalid, apart, {}) is None
    # tensorflow/tensorflow#36510
    nccl_oom = ("tf-run:2950:3374 [0] bazel-out/k8-py2-opt/bin/external/nccl_archive/"
                "_virtual_includes/include_hdrs/alloc.h:40 NCCL WARN Cuda failure 'out of memory'")
    fault = classify("worker:0", nccl_oom, apart, {})
    assert fault is not None and fault.kind is GpuFaultKind.NCCL_OUT_OF_MEMORY
    assert "outside TensorFlow's allocator" in fault.text and "memory growth is off" in fault.text
    # alibaba/FastNN#15 and tensorflow/tensorflow#51760
    system = ("W tensorflow/core/framework/op_kernel.cc:1651] OP_REQUIRES failed at "
              "nccl_communicator.cc:116 : Internal: unhandled system error")
    ib = "hai-a100-3:376586:377443 [4] ibvwrap.c:130 NCCL WARN Call to ibv_create_qp failed"
    fault = classify("worker:0", f"{system}\n{ib}", apart, {})
    assert fault is not None and fault.kind is GpuFaultKind.NCCL_SYSTEM_ERROR
    assert "InfiniBand verbs failed: NCCL_IB_DISABLE=1" in fault.text
    assert "--env NCCL_DEBUG=WARN" in classify("worker:0", system, apart, {}).text
    # NVIDIA/nccl-tests#166; the interface from Oneflow-Inc/oneflow#3586's bootstrap line
    connect = ("ubuntu:39964:40075 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect "
               "to 10.0.0.2<45763> failed : Software caused connection abort")
    iface = "worker:101542:101542 [0] NCCL INFO Bootstrap : Using [0]eno1:172.18.40.41<0>"
    fault = classify("worker:0", f"{iface}\n{connect}", apart, {})
    assert fault is not None and fault.kind is GpuFaultKind.NCCL_CONNECT
    assert "NCCL's bootstrap used interface eno1" in fault.text


def test_an_xid_on_the_tasks_gpu_is_the_cause_of_its_gpu_failure_only() -> None:
    latest = {"worker:0": {"gpus": [gpu(0, xid=[79])]}}
    fault = classify("worker:0", "InternalError: CUDA_ERROR_LAUNCH_FAILED", latest, {})
    assert fault is not None and fault.kind is GpuFaultKind.XID
    assert "XID 79 (GPU has fallen off the bus), a hardware or driver fault" in fault.text
    assert classify("worker:0", "ValueError: bad label", latest, {}) is None


def test_a_failed_cell_is_explained_and_alerted_from_every_tasks_last_reading(
        tmp_path: Path) -> None:
    h = hub(tmp_path)
    h.sink([sample("worker:0", gpus=[gpu(0, task_mem_mb=80000.0)]),
            sample("worker:1", gpus=[gpu(0, task_mem_mb=90.0)])])
    result = RunResult(cell=3, tasks={
        "worker:0": TaskResult("worker:0", TaskStatus.ERROR,
                               error=RemoteError("ResourceExhaustedError", TF_OOM, [])),
        "worker:1": TaskResult("worker:1", TaskStatus.OK)})
    targets = [TaskRuntime(TaskId("worker", i), f"localhost:{2220 + i}", "{}",
                           env={"CUDA_VISIBLE_DEVICES": "0"}) for i in range(2)]
    Cells._explain_gpu(result, h, targets)
    said = result.tasks["worker:0"].explanation or ""
    assert said.startswith(f"worker:0 ran out of GPU memory on GPU 0 ({UUID}) "
                           "(CUDA_VISIBLE_DEVICES=0)")
    [alert] = list(h.alerts)
    assert alert.kind == GpuFaultKind.OUT_OF_MEMORY and alert.tasks == ("worker:0", "worker:1")


# ------------------------------------------------------------------------- NCCL's lines
def test_ncclS_debug_lines_stay_in_the_log_not_the_cell() -> None:
    """NCCL_DEBUG=WARN output (its own line format) is held like TensorFlow's INFO records:
    said once per cluster; %tfdist_logs --level WARNING still finds the warnings."""
    import io

    out = io.StringIO()
    printer = LivePrinter(stdout=out, stderr=out, colour=False)
    warn = ("smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 "
            "and rank 0 both on CUDA device 1000")
    info = "worker:101542:101542 [0] NCCL INFO Bootstrap : Using [0]eno1:172.18.40.41<0>"
    for task in ("worker:0", "worker:1"):
        printer(OutputLine(1.0, task, "stdout", info, 1))
        printer(OutputLine(1.1, task, "stdout", warn, 1))
    printer(OutputLine(2.0, "worker:0", "stdout", "epoch 1 loss 0.3", 1))
    assert out.getvalue() == "[worker:0] epoch 1 loss 0.3\n"
    [said] = printer.noise_notes()
    assert "NCCL's debug lines (NCCL_DEBUG) of 2 task(s) (worker:0, worker:1)" in said
    assert (level_of("stdout", warn), level_of("stdout", info)) == ("WARNING", "INFO")


# ------------------------------------------------------------------------- stragglers
def steps(lag_s: float) -> list[list[float]]:
    return [[i, 100.0 + i + lag_s, 50.0, 1.0, 100.0 + i + lag_s] for i in range(1, 21)]


def straggler_alert(tmp_path: Path, slow_gpus: list[dict[str, Any]] | None) -> str:
    roles = {"worker:0": ("worker", "busy"), "worker:2": ("worker", "busy")}
    h = hub(tmp_path, roles)
    h.sink([sample("worker:0", steps=steps(0.0), gpus=None),
            sample("worker:2", steps=steps(0.04), gpus=slow_gpus, cpu_percent=90.0,
                   load1=1.0, cpus=16)])
    [alert] = [a for a in h.alerts if a.kind == "straggler"]
    assert alert.task == "worker:2"
    return alert.text


def test_the_straggler_alert_cites_its_throttled_gpu(tmp_path: Path) -> None:
    slow = read(FakeGpu(0), FakeGpu(1), FakeGpu(2, sm_clock_mhz=1100, clock_reasons=0x40,
                                                    temperature_c=88))
    text = straggler_alert(tmp_path, slow[2:])
    assert text.endswith("its GPU 2 at 1.10 GHz of 1.98 GHz, hw thermal slowdown, 88 C")


def test_the_straggler_alert_is_silent_about_a_healthy_gpu_and_a_cpu_task(
        tmp_path: Path) -> None:
    healthy = read(FakeGpu(0, sm_clock_mhz=1965, clock_reasons=0x0))
    assert "GPU" not in straggler_alert(tmp_path / "a", healthy)
    assert "GPU" not in straggler_alert(tmp_path / "b", None)
    idle = read(FakeGpu(0, sm_clock_mhz=210, clock_reasons=0x1))  # idle: waits for the host
    assert "GPU" not in evidence({"gpus": idle}, 1.0)


# ------------------------------------------------------------------------- through real kernels
@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_real_strategy_reports_what_it_runs_on_and_cpus_get_no_ring_advice() -> None:
    """TensorFlow's own MultiWorkerMirroredStrategy, made in two real tasks: the start-up hook
    reads its implementation and devices from TensorFlow's attributes (a rename would silence
    the advice, so it is checked here), and on CPUs no advice is given."""
    from tfdist_nb import Cluster

    with Cluster(workers=2) as c:
        result = c.run("import tensorflow as tf\n"
                       "strategy = tf.distribute.MultiWorkerMirroredStrategy()", timeout=120)
        assert result.ok, result.summary()
        assert c.hub is not None
        assert c.hub.strategies == {t: {"implementation": "AUTO", "device": "CPU", "devices": 1}
                                    for t in ("worker:0", "worker:1")}
        assert not [a for a in c.hub.alerts if a.kind == Finding.RING_ON_GPUS]
