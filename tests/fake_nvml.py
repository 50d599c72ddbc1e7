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
NVML_ERROR_NOT_SUPPORTED = 3
nvmlEventTypeXidCriticalError = 0x8
# the throttle-time field ids of nvidia-ml-py (nvml.h), by the reason names tfdist_nb decodes
REASON_FIELD_IDS = {"sw_power_cap": 74, "sync_boost": 76, "board_limit": 77, "reliability": 79,
                    "sw_thermal_slowdown": 269, "hw_thermal_slowdown": 270,
                    "hw_power_brake_slowdown": 271}


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # what a host without a driver raises
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):  # an event wait that found none
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
    # health, where the board reports it (None: NVML says NotSupported, as on consumer boards)
    ecc_mode: tuple[int, int] | None = (1, 1)  # (current, pending)
    ecc_uncorrected: int = 0  # volatile uncorrected ECC errors
    retired_pending: int | None = 0  # pages waiting to be retired at the next reset
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corr, unc, pending, failed
    ecc_corrected: int = 0  # volatile corrected ECC errors
    # cumulative ns each clock event reason held the clocks down (field values); None: the
    # driver keeps no such counter (every field answers NotSupported)
    throttle_ns: dict[str, int] | None = None
    # XID critical errors waiting in the driver's event queue; None: events not supported here
    xids: list[int] | None = field(default_factory=list)

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
                 cuda_driver: int = 12060, init_error: NVMLError | None = None) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu(i) for i in range(count)]
        self.fail_init = fail_init
        self.no_power = no_power
        self.driver = driver
        self.cuda_driver = cuda_driver
        self.init_error = init_error  # what nvmlInit raises (fail_init: the library is missing)
        self.calls: list[str] = []

    @property
    def count(self) -> int:
        return len(self.gpus)

    # -- the library -------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
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

    def _supported(self, value: Any) -> Any:
        if value is None:
            raise NVMLError_NotSupported("Not Supported")
        return value

    def nvmlDeviceGetEccMode(self, h: Any) -> list[int]:
        return list(self._supported(self._gpu(h).ecc_mode))

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter: int) -> int:
        self._supported(self._gpu(h).ecc_mode)
        gpu = self._gpu(h)
        return gpu.ecc_uncorrected if error_type == 1 else gpu.ecc_corrected

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        return int(self._supported(self._gpu(h).retired_pending))

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        return tuple(self._supported(self._gpu(h).remapped_rows))

    # -- throttle time, XID events (additions for the GPU evidence, tests/test_gpu_evidence.py)
    NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP = REASON_FIELD_IDS["sw_power_cap"]
    NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST = REASON_FIELD_IDS["sync_boost"]
    NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN = REASON_FIELD_IDS["sw_thermal_slowdown"]
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN = REASON_FIELD_IDS["hw_thermal_slowdown"]
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN = \
        REASON_FIELD_IDS["hw_power_brake_slowdown"]
    NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT = REASON_FIELD_IDS["board_limit"]
    NVML_FI_DEV_PERF_POLICY_RELIABILITY = REASON_FIELD_IDS["reliability"]
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError

    def nvmlDeviceGetFieldValues(self, h: Any, ids: list[int]) -> list[SimpleNamespace]:
        """One value per id, as nvidia-ml-py's c_nvmlFieldValue_t: its own nvmlReturn (3: not
        supported) and an unsigned long long (valueType 3) in ns."""
        by_id = {i: name for name, i in REASON_FIELD_IDS.items()}
        known = self._gpu(h).throttle_ns
        out = []
        for i in ids:
            ns = None if known is None else known.get(by_id.get(i, ""))
            out.append(SimpleNamespace(fieldId=i, valueType=3, nvmlReturn=(
                0 if ns is not None else NVML_ERROR_NOT_SUPPORTED),
                value=SimpleNamespace(ullVal=ns or 0)))
        return out

    def nvmlEventSetCreate(self) -> list[int]:
        return []  # the GPUs registered on it

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, event_set: list[int]) -> None:
        if self._gpu(h).xids is None or not types & nvmlEventTypeXidCriticalError:
            raise NVMLError_NotSupported("Not Supported")
        event_set.append(self._gpu(h).index)

    def nvmlEventSetWait(self, event_set: list[int], timeout_ms: int) -> SimpleNamespace:
        for index in event_set:
            pending = self.gpus[index].xids
            if pending:
                return SimpleNamespace(device=index, eventType=nvmlEventTypeXidCriticalError,
                                       eventData=pending.pop(0))
        raise NVMLError_Timeout("Timeout")  # never waits: the tests' timeout is 0
