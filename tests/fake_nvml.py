"""A stand-in for nvidia-ml-py's ``pynvml`` module: there is no GPU on CI machines.

It answers the NVML calls tfdist_nb makes from a list of :class:`FakeGpu` records (UUIDs, MIG
devices, memory, clocks, clock event reasons, PCIe, processes), so placement, the sampler, the
detectors and the status table can be tested. It is a model of NVML's *interface* (names,
argument order, error on unsupported queries), not of a GPU's behaviour.

``FakeNvml(count=2)`` keeps the fixed readings the older tests expect: GPU *h* at 40+10h %
utilisation, (1024+h) MiB used, 61+h °C, SM clock 1980-500h MHz, GPU 1 power-capped and thermally
slowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_DEVICE_MIG_ENABLE = 1


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # pynvml's own spelling
    pass


@dataclass
class FakeMig:
    """One MIG instance of a parent GPU (what `nvidia-smi -L` lists as `MIG-<uuid>`)."""

    uuid: str
    mem_total_mb: float = 20_000.0


@dataclass
class FakeGpu:
    index: int
    uuid: str = ""
    name: str = "Fake H200"
    util_percent: int | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float = 143771.0
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int = 1980
    power_mw: int | None = 350_000
    power_limit_mw: int = 700_000
    clock_reasons: int | None = None
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    pcie_replays: int = 0
    compute_capability: tuple[int, int] = (9, 0)
    processes: dict[int, float] = field(default_factory=dict)  # pid -> MiB used
    migs: list[FakeMig] = field(default_factory=list)

    def __post_init__(self) -> None:
        h = self.index
        self.uuid = self.uuid or f"GPU-{h:08d}-fake-4000-8000-{h:012d}"
        if self.util_percent is None:
            self.util_percent = 40 + 10 * h
        if self.mem_used_mb is None:
            self.mem_used_mb = 1024.0 + h
        if self.temperature_c is None:
            self.temperature_c = 61 + h
        if self.sm_clock_mhz is None:
            self.sm_clock_mhz = 1980 - 500 * h
        if self.clock_reasons is None:
            self.clock_reasons = 0x0 if h == 0 else 0x40 | 0x4


@dataclass(frozen=True)
class _MigHandle:
    parent: int
    slot: int


class FakeNvml:
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, count: int = 2, fail_init: bool = False, no_power: bool = False,
                 gpus: list[FakeGpu] | None = None, driver: str = "560.35.03",
                 cuda_driver: int = 12060) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu(i) for i in range(count)]
        self.fail_init = fail_init
        self.no_power = no_power
        self.driver = driver
        self.cuda_driver = cuda_driver
        self.calls: list[str] = []

    @property
    def count(self) -> int:
        return len(self.gpus)

    # -- the library -------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_driver

    # -- devices and handles -----------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < self.count:
            raise NVMLError("Invalid Argument")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            if gpu.uuid == wanted:
                return gpu.index
            for slot, mig in enumerate(gpu.migs):
                if mig.uuid == wanted:
                    return _MigHandle(gpu.index, slot)
        raise NVMLError("Not Found")

    def _gpu(self, h: Any) -> FakeGpu:
        return self.gpus[h.parent if isinstance(h, _MigHandle) else h]

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        if isinstance(h, _MigHandle):
            return self.gpus[h.parent].migs[h.slot].uuid
        return self._gpu(h).uuid

    def nvmlDeviceGetIndex(self, h: Any) -> int:
        return self._gpu(h).index

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        mode = NVML_DEVICE_MIG_ENABLE if self._gpu(h).migs else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        return len(self._gpu(h).migs)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, slot: int) -> _MigHandle:
        if slot >= len(self._gpu(h).migs):
            raise NVMLError("Not Found")
        return _MigHandle(self._gpu(h).index, slot)

    def nvmlDeviceIsMigDeviceHandle(self, h: Any) -> int:
        return int(isinstance(h, _MigHandle))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: Any) -> int:
        return h.parent if isinstance(h, _MigHandle) else h

    # -- readings ----------------------------------------------------------------------------
    def nvmlDeviceGetName(self, h: Any) -> bytes:
        return self._gpu(h).name.encode()

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._gpu(h).util_percent, memory=5)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> SimpleNamespace:
        if isinstance(h, _MigHandle):
            total = self.gpus[h.parent].migs[h.slot].mem_total_mb
            return SimpleNamespace(used=0, total=total * 2**20, free=total * 2**20)
        gpu = self._gpu(h)
        used, total = gpu.mem_used_mb or 0.0, gpu.mem_total_mb
        return SimpleNamespace(used=used * 2**20, total=total * 2**20,
                               free=(total - used) * 2**20)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._gpu(h).temperature_c  # type: ignore[return-value]

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        return self._gpu(h).sm_clock_mhz  # type: ignore[return-value]

    def nvmlDeviceGetMaxClockInfo(self, h: Any, clock: int) -> int:
        return self._gpu(h).sm_clock_max_mhz

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        gpu = self._gpu(h)
        if self.no_power or gpu.power_mw is None:
            raise NVMLError_NotSupported("Not Supported")
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return self._gpu(h).power_limit_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._gpu(h).clock_reasons  # type: ignore[return-value]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        self.calls.append("nvmlDeviceGetCurrentClocksThrottleReasons")  # the deprecated getter
        return self._gpu(h).clock_reasons  # type: ignore[return-value]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> int:
        return self._gpu(h).pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any) -> int:
        return self._gpu(h).pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> int:
        return self._gpu(h).pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any) -> int:
        return self._gpu(h).pcie_width_max

    def nvmlDeviceGetPcieReplayCounter(self, h: Any) -> int:
        return self._gpu(h).pcie_replays

    def nvmlDeviceGetCudaComputeCapability(self, h: Any) -> tuple[int, int]:
        return self._gpu(h).compute_capability

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=int(mb * 2**20))
                for pid, mb in self._gpu(h).processes.items()]
