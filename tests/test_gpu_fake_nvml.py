"""The GPU path against a fake NVML module (a stand-in at the module boundary: CI machines have
no GPU), and the real NVML module against what this machine really has."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.fake_nvml import FakeNvml
from tests.gpu_here import visible_nvml_gpus
from tfdist_nb.events import TelemetrySample
from tfdist_nb.store.tails import LiveStore
from tfdist_nb.worker.gpu import GpuSampler, decode_throttle
from tfdist_nb.worker.telemetry import Telemetry


def test_every_reading_of_every_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = GpuSampler(FakeNvml(count=2, no_power=True)).sample()
    assert [g["index"] for g in gpus] == [0, 1]
    g1 = gpus[1]
    assert g1["name"] == "Fake H200"
    assert (g1["util_percent"], g1["temperature_c"], g1["sm_clock_mhz"]) == (50.0, 62.0, 1480.0)
    assert g1["mem_used_mb"] == 1025.0 and g1["mem_total_mb"] == 143771.0
    assert g1["throttle"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert g1["power_w"] is None  # unsupported query: absent, not zero


def test_cuda_visible_devices_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g["index"] for g in GpuSampler(FakeNvml(count=2)).sample()] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    sampler = GpuSampler(FakeNvml(count=2))
    assert sampler.sample() is None and "none visible" in sampler.reason


def test_no_nvml_reads_as_no_gpu() -> None:
    sampler = GpuSampler(FakeNvml(fail_init=True))
    assert sampler.sample() is None
    assert not sampler.available
    assert sampler.reason.startswith("no GPU (NVMLError")


def test_real_nvml_reads_what_this_machine_has() -> None:
    """The real NVML module, on whatever this machine is: one reading per GPU NVML reports (and
    CUDA_VISIBLE_DEVICES allows), or "no GPU" without a driver or device, never zeros."""
    visible = visible_nvml_gpus()
    sampler = GpuSampler()
    if not visible:
        assert sampler.sample() is None and sampler.reason.startswith("no GPU")
        return
    gpus = sampler.sample()
    assert gpus is not None and [g["index"] for g in gpus] == visible
    assert all(g["name"] and g["mem_total_mb"] > 0 for g in gpus)


def test_gpu_readings_reach_the_status_columns() -> None:
    sent: list[dict[str, Any]] = []
    tel = Telemetry(sent.append, gpu=GpuSampler(FakeNvml(count=2)))
    tel.start()
    tel.stop()
    tel.record_step(0.0, 0.010, 0.002)
    tel.flush()
    store = LiveStore()
    store.add(TelemetrySample(1.0, "worker:0", sent[-1]))
    latest = store.view("worker:0").latest
    assert latest["gpu_util_percent"] == 45.0  # mean of 40 and 50
    assert latest["gpu_mem_mb"] == 1024.0 + 1025.0
    assert store.view("worker:0").step_count == 1
    assert math.isclose(store.view("worker:0").input_wait_ms(), 2.0)


def test_throttle_decoding() -> None:
    assert decode_throttle(0) == []
    assert decode_throttle(0x1 | 0x80) == ["gpu_idle", "hw_power_brake_slowdown"]
