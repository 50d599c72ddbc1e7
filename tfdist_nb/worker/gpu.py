"""Per-GPU readings through NVML (nvidia-ml-py's ``pynvml`` module), or None when there is no GPU.

The NVML module is a parameter so tests can hand in a stand-in (no GPU exists on CI); every NVML
failure — library missing, no driver, no device — reads as "no GPU", never as zeros.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from tfdist_nb.gpu_plan import CVD, Device, select
from tfdist_nb.worker.gpu_readings import GpuReader, Nvml, decode_throttle, nvml_text, own_pids

__all__ = ["GpuSampler", "decode_throttle", "device_handle", "given", "host_devices",
           "read_devices"]

logger = logging.getLogger(__name__)


class GpuSampler:
    """Reads the GPUs this task may use (CUDA_VISIBLE_DEVICES honoured) once per call."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self._nvml = nvml
        self._handles: list[tuple[int, object]] | None = None
        self._readers: list[GpuReader] = []  # one per handle, made at the first reading
        self._opened = False
        self.reason: str | None = None

    def _open(self) -> None:
        """Opened at the first reading, not when made: a spare kernel gets its task's
        CUDA_VISIBLE_DEVICES at adoption, and its telemetry starts only then (worker/adopt.py)."""
        self._opened = True
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
            # the devices CUDA_VISIBLE_DEVICES lets this task use (indices, UUIDs and their
            # prefixes, MIG instances), mapped onto NVML's by UUID
            devices = select(os.environ.get(CVD), read_devices(self._nvml))
            self._handles = [(d.index, device_handle(self._nvml, d)) for d in devices] or None
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver missing ...
            self.reason = f"no GPU ({type(exc).__name__}: {exc})"
            self._handles = None
            return
        if not self._handles:
            self.reason = "no GPU (none visible to this task)"

    @property
    def available(self) -> bool:
        if not self._opened:
            self._open()
        return bool(self._handles)

    def sample(self) -> list[dict[str, Any]] | None:
        if not self.available:
            return None
        assert self._handles is not None and self._nvml is not None
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

