"""What ``%tfdist_check gpu`` reads in each task (docs/gpus.md): the GPUs given, each one's NVML
reading (by UUID, MIG devices too), and what TensorFlow sees and was built for; the verdict is
:mod:`tfdist_nb.diagnostics.gpu_check`'s. It may initialise CUDA in a TensorFlow the task
imported (the user asked), and never imports TensorFlow.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import socket
import sys
from types import ModuleType
from typing import Any

from tfdist_nb.gpu_plan import GROWTH, Device, resolve
from tfdist_nb.strenum import StrEnum
from tfdist_nb.worker.gpu import Nvml, device_handle, given, maybe, read_devices
from tfdist_nb.worker.replies import GivenGpu, GpuReadings, NvmlView, TfGpuView

logger = logging.getLogger(__name__)


class NvmlState(StrEnum):
    """How NVML answered in a task: the word travels in the reading and the judgement words the
    cause from it (docs/gpus.md)."""

    OK = "ok"
    NO_MODULE = "no_module"  # nvidia-ml-py is not installed in the task's Python
    NO_LIBRARY = "no_library"  # libnvidia-ml.so missing: no NVIDIA driver installed
    NO_DRIVER = "no_driver"  # the library is there, the kernel driver is not loaded
    ERROR = "error"  # another NVML failure (its text in ``error``)


def gpu_readings(nvml: Nvml | None = None) -> GpuReadings:
    """This task's GPU facts now: ``host``, ``cuda_visible_devices`` (None: unset),
    ``allow_growth_env``, ``nvml`` (state, driver, CUDA driver version, device count),
    ``devices`` (one per entry given, in CUDA's order) and ``tf`` (None: not imported)."""
    view = nvml_view(nvml)
    return {"host": socket.gethostname(), "cuda_visible_devices": given(),
            "allow_growth_env": os.environ.get(GROWTH), "nccl": _nccl_version(),
            "tf": _tf_view(), "devices": view.pop("devices", []), "nvml": view}


def nvml_view(nvml: Nvml | None = None) -> NvmlView:
    """NVML's side alone (no TensorFlow, no CUDA): ``state``, ``error``, ``driver``,
    ``cuda_driver``, ``count`` and the ``devices`` given to this task; ``%tfdist_env`` reads
    its driver and GPU models from here too."""
    nv, state, error = _open(nvml)
    out: NvmlView = {"state": state, "error": error, "devices": []}
    if nv is None:
        return out
    try:
        out.update({"driver": _text(_read(nv, "nvmlSystemGetDriverVersion")),
                    "cuda_driver": _read(nv, "nvmlSystemGetCudaDriverVersion"),
                    "count": int(nv.nvmlDeviceGetCount()),
                    "devices": _given_devices(nv, given(), read_devices(nv))})
    finally:
        _read(nv, "nvmlShutdown")
    return out


def _given_devices(nv: Nvml, cvd: str | None, devices: list[Device]) -> list[GivenGpu]:
    """A reading per device each entry given names (an index, a ``GPU-``/``MIG-`` UUID or a
    prefix; every device when nothing is set), in CUDA's order. CUDA stops at the first entry
    that names no device: that one is kept, unfound, with the entries it hides."""
    if cvd is None:
        return [_device(nv, str(d.index) if d.slot is None else d.uuid, d) for d in devices]
    entries = [e.strip() for e in cvd.split(",") if e.strip() not in ("", "-1")]
    out: list[GivenGpu] = []
    for i, entry in enumerate(entries):
        found = resolve(entry, devices)
        if found is None:
            out.append({"entry": entry, "found": False, "hidden_after": entries[i + 1:]})
            break
        out += [_device(nv, entry, d) for d in found]
    return out


def _open(nvml: Nvml | None) -> tuple[Nvml | None, NvmlState, str | None]:
    """The initialised NVML module (``nvml``: a stand-in for tests), or how it failed."""
    try:
        nv = nvml if nvml is not None else importlib.import_module("pynvml")
    except ImportError as exc:
        return None, NvmlState.NO_MODULE, str(exc)
    try:
        nv.nvmlInit()
    except Exception as exc:  # pynvml's NVMLError_* subclasses, named by the failure
        kind = type(exc).__name__
        state = (NvmlState.NO_LIBRARY if kind.endswith("LibraryNotFound") else
                 NvmlState.NO_DRIVER if kind.endswith("DriverNotLoaded") else NvmlState.ERROR)
        return None, state, f"{kind}: {exc}"
    return nv, NvmlState.OK, None


def _device(nv: Nvml, entry: str, device: Device) -> GivenGpu:
    """One given device as NVML reads it; an unsupported query (ECC on a consumer board, row
    remapping before Ampere) is None, never a guess. Link and health are the whole GPU's,
    also for a MIG instance."""
    gpu = nv.nvmlDeviceGetHandleByIndex(device.index)
    mig = device.slot is not None
    handle = device_handle(nv, device)
    cc = _read(nv, "nvmlDeviceGetCudaComputeCapability", gpu)
    memory = _read(nv, "nvmlDeviceGetMemoryInfo", handle)
    ecc = _read(nv, "nvmlDeviceGetEccMode", gpu)
    remap = _read(nv, "nvmlDeviceGetRemappedRows", gpu)  # (corrected, uncorrected, pending, failed)
    retired = _read(nv, "nvmlDeviceGetRetiredPagesPendingStatus", gpu)
    return {
        "entry": entry, "found": True, "mig": mig, "uuid": device.uuid, "index": device.index,
        "name": _text(_read(nv, "nvmlDeviceGetName", gpu)),
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
        "mem_total_mb": memory.total / 2**20 if memory is not None else None,
        "util_percent": getattr(_read(nv, "nvmlDeviceGetUtilizationRates", gpu), "gpu", None),
        "pcie_gen": _read(nv, "nvmlDeviceGetCurrPcieLinkGeneration", gpu),
        "pcie_gen_max": _read(nv, "nvmlDeviceGetMaxPcieLinkGeneration", gpu),
        "pcie_width": _read(nv, "nvmlDeviceGetCurrPcieLinkWidth", gpu),
        "pcie_width_max": _read(nv, "nvmlDeviceGetMaxPcieLinkWidth", gpu),
        "ecc_on": bool(ecc[0]) if ecc else None,
        "ecc_pending_on": bool(ecc[1]) if ecc else None,
        "ecc_uncorrected": _read(nv, "nvmlDeviceGetTotalEccErrors", gpu,
                                 getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                                 getattr(nv, "NVML_VOLATILE_ECC", 0)),
        "retired_pending": None if retired is None else bool(retired),
        "remap_pending": bool(remap[2]) if remap else None,
        "remap_failure": bool(remap[3]) if remap else None,
    }


def _tf_view() -> TfGpuView | None:
    """What TensorFlow sees and was built for, in a task that imported it (None otherwise):
    GPU count, memory growth and limit per GPU, CUDA / cuDNN / compute capabilities built."""
    tf = sys.modules.get("tensorflow")
    if tf is None or not hasattr(tf, "config"):
        return None
    view: TfGpuView = {"build": {}, "gpus": None, "growth": [], "limit_mb": []}
    try:
        info = dict(tf.sysconfig.get_build_info())
        view["build"] = {"cuda_build": bool(info.get("is_cuda_build")),
                         "cuda": info.get("cuda_version"), "cudnn": info.get("cudnn_version"),
                         "capabilities": list(info.get("cuda_compute_capabilities") or [])}
        devices = tf.config.list_physical_devices("GPU")
        view["gpus"] = len(devices)
        view["growth"] = [bool(tf.config.experimental.get_memory_growth(d)) for d in devices]
        view["limit_mb"] = [_limit_mb(tf, d) for d in devices]
    except Exception as exc:  # a broken CUDA set-up raises here: that is the finding
        logger.debug("TensorFlow could not list its GPUs", exc_info=True)
        view["error"] = f"{type(exc).__name__}: {exc}"
    return view


def _limit_mb(tf: ModuleType, device: object) -> float | None:
    configs = tf.config.get_logical_device_configuration(device) or []
    limits = [c.memory_limit for c in configs if getattr(c, "memory_limit", None)]
    return float(sum(limits)) if limits else None


def _nccl_version() -> str | None:
    """The NCCL wheel TensorFlow loads (``nvidia-nccl-cu12`` and kin), if installed."""
    for dist in ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _read(nv: Nvml, name: str, *args: object) -> Any:
    """``nv.name(*args)``, or None where the driver or nvidia-ml-py lacks it or the board does
    not support it (NVML's NotSupported, FunctionNotFound)."""
    return maybe(lambda: getattr(nv, name)(*args), f"no {name}")


def _text(value: object) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)
