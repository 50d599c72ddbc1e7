"""A stand-in for nvidia-ml-py's ``pynvml`` module: there is no GPU on CI machines.

It implements only the NVML calls tfdist_nb makes, with fixed readings, so the GPU path of the
sampler, the store and the status table can be tested. It is not a model of a real GPU.
"""

from __future__ import annotations

from types import SimpleNamespace

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1


class NVMLError(Exception):
    pass


class FakeNvml:
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM

    def __init__(self, count: int = 2, fail_init: bool = False, no_power: bool = False) -> None:
        self.count = count
        self.fail_init = fail_init
        self.no_power = no_power

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"Fake H200"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=40 + 10 * h, memory=5)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=(1024 + h) * 2**20, total=143771 * 2**20)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 61 + h

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return 1980 - 500 * h

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if self.no_power:
            raise NVMLError("Not Supported")
        return 350_000

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x0 if h == 0 else 0x40 | 0x4
