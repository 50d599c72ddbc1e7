"""Per-GPU readings through NVML (nvidia-ml-py's ``pynvml`` module), or None when there is no GPU.

The NVML module is a parameter so tests can hand in a stand-in (no GPU exists on CI); every NVML
failure — library missing, no driver, no device — reads as "no GPU", never as zeros.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

# NVML throttle-reason bits (nvml.h), named as a user would search for them.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def decode_throttle(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


class GpuSampler:
    """Reads the GPUs this task may use (CUDA_VISIBLE_DEVICES honoured) once per call."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml
        self._handles: list[tuple[int, Any]] | None = None
        self.reason: str | None = None
        self._open()

    def _open(self) -> None:
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
            count = self._nvml.nvmlDeviceGetCount()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver missing ...
            self.reason = f"no GPU ({type(exc).__name__}: {exc})"
            self._handles = None
            return
        indices = _visible(count)
        if not indices:
            self.reason = "no GPU (none visible to this task)"
            self._handles = None
            return
        self._handles = [(i, self._nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def sample(self) -> list[dict[str, Any]] | None:
        if not self._handles:
            return None
        return [self._read(index, handle) for index, handle in self._handles]

    def _read(self, index: int, handle: Any) -> dict[str, Any]:
        nv = self._nvml
        out: dict[str, Any] = {"index": index}
        readers = {
            "name": lambda: _text(nv.nvmlDeviceGetName(handle)),
            "util_percent": lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
            "mem_used_mb": lambda: nv.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
            "mem_total_mb": lambda: nv.nvmlDeviceGetMemoryInfo(handle).total / 2**20,
            "temperature_c": lambda: float(nv.nvmlDeviceGetTemperature(handle,
                                                                       nv.NVML_TEMPERATURE_GPU)),
            "sm_clock_mhz": lambda: float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)),
            "power_w": lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "throttle": lambda: decode_throttle(
                int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle))),
        }
        for key, read in readers.items():
            try:
                out[key] = read()
            except Exception:  # one unsupported query (e.g. power on some boards) is just absent
                logger.debug("GPU %s: no %s", index, key, exc_info=True)
                out[key] = None
        return out


def _visible(count: int) -> list[int]:
    """Device indices CUDA_VISIBLE_DEVICES allows (integers only; UUIDs keep all devices)."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    spec = spec.strip()
    if spec in ("", "-1"):
        return []
    try:
        wanted = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        return list(range(count))
    return [i for i in wanted if 0 <= i < count]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
