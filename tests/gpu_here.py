"""What GPUs this machine really has, asked of NVML directly (not through tfdist_nb), so tests
of real telemetry can expect readings on a GPU host and empty columns elsewhere."""

from __future__ import annotations

import os


def visible_nvml_gpus() -> list[int]:
    """Indices of the GPUs NVML reports that CUDA_VISIBLE_DEVICES lets a task use; [] when
    there is no NVML library, driver or device."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # no library, no driver, no device: no GPU
        return []
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    try:
        wanted = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:  # UUIDs: every device stays visible
        return list(range(count))
    return [i for i in wanted if 0 <= i < count]
