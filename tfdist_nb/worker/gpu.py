"""Per-GPU readings through NVML (nvidia-ml-py's ``pynvml`` module, or a stand-in in tests: no
GPU exists on CI), or None when there is no GPU: every NVML failure — library missing, no
driver, no device — reads as "no GPU", never as zeros. One GPU's part of a task's telemetry
sample is the compact per-GPU record of docs/reference.md ("GPU readings").

A query this board or driver does not answer (power on some boards, ECC on consumer cards, the
throttle-time counters on older drivers, XID events in some containers) reads as None, never as
0: a zero would claim a healthy reading nobody took.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from tfdist_nb.gpu_plan import CVD, Device, select
from tfdist_nb.samples import GpuReading, GpuStatic

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Nvml(Protocol):
    """nvidia-ml-py's ``pynvml`` module, or a stand-in with its interface (tests): its functions
    and constants are read by their NVML names (``nvmlDeviceGetCount`` ...); handles it returns
    are opaque, passed back to it only."""

    def __getattr__(self, name: str) -> Any: ...

#: clock event reason bits (nvml.h ``nvmlClocksEventReason*``; nvidia-ml-py names 0x200 and
#: 0x400 only in its deprecated ``nvmlClocksThrottleReason*`` set), as a user searches for them
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
#: the field values that count, in ns since the driver loaded, how long each reason held the
#: clocks down (where the driver keeps them)
REASON_FIELDS = (
    ("sw_power_cap", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP"),
    ("sync_boost", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST"),
    ("sw_thermal_slowdown", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN"),
    ("hw_thermal_slowdown", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN"),
    ("hw_power_brake_slowdown", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN"),
    ("board_limit", "NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT"),
    ("reliability", "NVML_FI_DEV_PERF_POLICY_RELIABILITY"),
)
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by valueType
XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
MAX_XIDS = 16  # distinct XID codes kept per GPU
#: what an XID code means (NVIDIA's XID catalogue), for the codes a training job meets
XID_MEANINGS = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup after an earlier fault", 48: "double-bit ECC error",
    61: "internal micro-controller warning", 62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping", 64: "ECC page retirement or row remap failure",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout",
    120: "GSP error",
}
#: XIDs that a program's own kernels raise as often as the hardware (an illegal address)
PROGRAM_XIDS = frozenset({13, 31, 43, 45})


def decode_throttle(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]


def describe_xid(code: int) -> str:
    """``XID 79 (GPU has fallen off the bus), a hardware or driver fault``."""
    meaning = XID_MEANINGS.get(code)
    kind = ("often an illegal memory access in a kernel, else a hardware fault"
            if code in PROGRAM_XIDS else "a hardware or driver fault")
    return f"XID {code} ({meaning}), {kind}" if meaning else f"XID {code}, {kind}"


def own_pids() -> set[int]:
    """This process and every process it started (a task's data loaders, a ``!`` command)."""
    import psutil

    pids = {os.getpid()}
    try:
        pids.update(c.pid for c in psutil.Process().children(recursive=True))
    except psutil.Error:
        logger.debug("the task's children could not be listed", exc_info=True)
    return pids


class GpuReader:
    """Reads one GPU a task may use; a MIG instance reads its memory and processes from the
    instance and its clocks, power, link and errors from the board it is part of."""

    def __init__(self, nv: Nvml, index: int, handle: object) -> None:
        self._nv, self.index, self._handle = nv, index, handle
        mig = maybe(lambda: nv.nvmlDeviceIsMigDeviceHandle(handle))
        self._board = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle) if mig else handle
        self._events = maybe(self._xid_events)
        self.xids: list[int] = []
        board = self._board
        self._static: GpuStatic = {
            "uuid": maybe(lambda: nvml_text(nv.nvmlDeviceGetUUID(handle))),
            "name": maybe(lambda: nvml_text(nv.nvmlDeviceGetName(board))),
            "mem_total_mb": maybe(lambda: nv.nvmlDeviceGetMemoryInfo(handle).total / 2**20),
            "sm_clock_max_mhz": maybe(lambda: float(nv.nvmlDeviceGetMaxClockInfo(
                board, nv.NVML_CLOCK_SM))),
            "power_limit_w": maybe(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(board) / 1000.0),
            "pcie_gen_max": maybe(lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(board)),
            "pcie_width_max": maybe(lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(board)),
        }

    def read(self, pids: set[int]) -> GpuReading:
        """The record; ``pids``: the task's processes (:func:`own_pids`)."""
        nv, handle, board = self._nv, self._handle, self._board

        def get(key: str, read: Callable[[], T]) -> T | None:
            return maybe(read, f"GPU {self.index}: no {key}")

        return {
            "index": self.index, **self._static,
            "util_percent": get("util_percent",
                                lambda: float(nv.nvmlDeviceGetUtilizationRates(board).gpu)),
            "mem_used_mb": get("mem_used_mb",
                               lambda: nv.nvmlDeviceGetMemoryInfo(handle).used / 2**20),
            "task_mem_mb": get("task_mem_mb", lambda: self._task_mem_mb(pids)),
            "temperature_c": get("temperature_c", lambda: float(nv.nvmlDeviceGetTemperature(
                board, nv.NVML_TEMPERATURE_GPU))),
            "sm_clock_mhz": get("sm_clock_mhz", lambda: float(nv.nvmlDeviceGetClockInfo(
                board, nv.NVML_CLOCK_SM))),
            "power_w": get("power_w", lambda: nv.nvmlDeviceGetPowerUsage(board) / 1000.0),
            "throttle": get("throttle", lambda: decode_throttle(int(self._reasons()(board)))),
            "throttle_ms": get("throttle_ms", self._throttle_ms),
            "pcie_gen": get("pcie_gen", lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(board)),
            "pcie_width": get("pcie_width", lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(board)),
            "pcie_replays": get("pcie_replays", lambda: nv.nvmlDeviceGetPcieReplayCounter(board)),
            "ecc_corrected": get("ecc_corrected",
                                 lambda: self._ecc(0)),  # NVML_MEMORY_ERROR_TYPE_CORRECTED
            "ecc_uncorrected": get("ecc_uncorrected", lambda: self._ecc(1)),  # ..._UNCORRECTED
            "xid": get("xid", self._poll_xids),
        }

    def _reasons(self) -> Callable[[object], int]:
        """The clock event reasons getter; the deprecated throttle one only where it is all the
        installed nvidia-ml-py has."""
        nv = self._nv
        return getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons

    def _task_mem_mb(self, pids: set[int]) -> float | None:
        """What this task's processes hold on the GPU. None when NVML lists no process (no
        one to tell apart) or, in a container's PID namespace, none that exists here."""
        import psutil

        procs = self._nv.nvmlDeviceGetComputeRunningProcesses(self._handle)
        ours = [p for p in procs if p.pid in pids]
        if not ours:
            return 0.0 if any(psutil.pid_exists(p.pid) for p in procs) else None
        used = [p.usedGpuMemory for p in ours]
        return None if any(u is None for u in used) else sum(used) / 2**20

    def _throttle_ms(self) -> dict[str, float] | None:
        fields = [(name, getattr(self._nv, const)) for name, const in REASON_FIELDS
                  if hasattr(self._nv, const)]
        if not fields:
            return None
        values = self._nv.nvmlDeviceGetFieldValues(self._board, [f for _, f in fields])
        out = {name: getattr(v.value, _VALUE_MEMBERS[v.valueType]) / 1e6
               for (name, _), v in zip(fields, values, strict=False) if v.nvmlReturn == 0}
        return out or None

    def _ecc(self, kind: int) -> int:
        return int(self._nv.nvmlDeviceGetTotalEccErrors(self._board, kind, 0))  # volatile

    def _xid_events(self) -> object:
        events = self._nv.nvmlEventSetCreate()
        self._nv.nvmlDeviceRegisterEvents(self._board, XID_CRITICAL, events)
        return events

    def _poll_xids(self) -> list[int] | None:
        """The distinct XID codes the driver reported for this GPU since the task began;
        waits for none (a timeout of 0: NVML's timeout error says none is pending)."""
        if self._events is None:
            return None
        for _ in range(32):
            try:
                data = self._nv.nvmlEventSetWait(self._events, 0)
            except Exception:  # NVMLError_Timeout: nothing pending
                break
            code = int(data.eventData)
            if code not in self.xids and len(self.xids) < MAX_XIDS:
                self.xids.append(code)
        return list(self.xids)


def maybe(read: Callable[[], T], what: str = "an NVML query") -> T | None:
    """``read()``, or None where this board, driver or nvidia-ml-py does not answer."""
    try:
        return read()
    except Exception:  # NVMLError_NotSupported and kin: absent on this board or driver
        logger.debug("%s failed", what, exc_info=True)
        return None


def nvml_text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuSampler:
    """Reads the GPUs this task may use (CUDA_VISIBLE_DEVICES honoured) once per call."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self._nvml = nvml
        self._handles: list[tuple[int, object]] | None = None  # None: not opened yet
        self._readers: list[GpuReader] = []  # one per handle, made at the first reading
        self.reason: str | None = None

    def _open(self) -> list[tuple[int, object]]:
        """Opened at the first reading, not when made: a spare kernel gets its task's
        CUDA_VISIBLE_DEVICES at adoption, and its telemetry starts only then (worker/adopt.py)."""
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
            # the devices CUDA_VISIBLE_DEVICES lets this task use (indices, UUIDs and their
            # prefixes, MIG instances), mapped onto NVML's by UUID
            devices = select(os.environ.get(CVD), read_devices(self._nvml))
            handles = [(d.index, device_handle(self._nvml, d)) for d in devices]
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver missing ...
            self.reason = f"no GPU ({type(exc).__name__}: {exc})"
            return []
        if not handles:
            self.reason = "no GPU (none visible to this task)"
        return handles

    @property
    def available(self) -> bool:
        if self._handles is None:
            self._handles = self._open()
        return bool(self._handles)

    def sample(self) -> list[GpuReading] | None:
        if not self.available:
            return None
        assert self._handles is not None and self._nvml is not None  # opened
        if len(self._readers) != len(self._handles):
            self._readers = [GpuReader(self._nvml, index, handle)
                             for index, handle in self._handles]
        pids = own_pids()
        return [reader.read(pids) for reader in self._readers]


def read_devices(nvml: Nvml) -> list[Device]:
    """Every device NVML enumerates (an initialised ``nvml``), in its order: each GPU, or the
    MIG instances of a GPU in MIG mode. NVML ignores CUDA_VISIBLE_DEVICES: apply it with
    :func:`tfdist_nb.gpu_plan.select`."""
    out: list[Device] = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
        try:
            mig = nvml.nvmlDeviceGetMigMode(handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) if mig else 0
        except Exception:  # no MIG on this board (NotSupported), or an older driver
            slots = 0
        migs = []
        for slot in range(slots):
            try:  # an empty slot is NVML's NotFound
                instance = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except Exception:
                continue
            migs.append(Device(index, nvml_text(nvml.nvmlDeviceGetUUID(instance)), uuid, slot))
        out.extend(migs or [Device(index, uuid)])
    return out


def host_devices() -> list[Device] | None:
    """The devices NVML sees on this host (what the controller places), or None without NVML
    (no module, library, driver): nothing is known, nothing is placed."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return read_devices(pynvml)
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
    except Exception:
        logger.debug("NVML not available, or it could not list the GPUs", exc_info=True)
        return None


def given() -> str | None:
    """The GPUs this task was given, as its environment says: CUDA_VISIBLE_DEVICES, else
    what SLURM set for the step (None: nothing set, e.g. a host without GPUs)."""
    return os.environ.get(CVD, os.environ.get("SLURM_STEP_GPUS"))


def device_handle(nvml: Nvml, device: Device) -> object:
    """NVML's handle of ``device``: its GPU's, or the MIG instance's."""
    gpu = nvml.nvmlDeviceGetHandleByIndex(device.index)
    return gpu if device.slot is None else nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu,
                                                                                    device.slot)

