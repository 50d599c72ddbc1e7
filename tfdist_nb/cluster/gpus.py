"""Where a cluster's GPUs go (docs/reference.md, GPU placement): its launcher says who places
them, NVML here says which there are, :mod:`tfdist_nb.gpu_plan` decides. Made with the
``Cluster``, so a request that cannot be met is a SpecError before anything starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from tfdist_nb.errors import SpecError
from tfdist_nb.gpu_plan import CVD, GpuPlan, GpuRequest, Placement, gpu_request, plan_gpus
from tfdist_nb.launchers.base import Launcher
from tfdist_nb.topology import ClusterSpec
from tfdist_nb.worker.gpu import host_devices


def place(gpus: str | Sequence[str | int], per_task: int | None, spec: ClusterSpec,
          launcher: Launcher, env: Mapping[str, str]) -> tuple[GpuRequest, GpuPlan]:
    """The request ``gpus=`` / ``gpus_per_task=`` make, and the plan for ``spec``'s tasks."""
    request = gpu_request(gpus, per_task)
    where = launcher.gpu_placement
    env_cvd = env.get(CVD)
    if (where is Placement.SCHEDULER and request.per_task and env_cvd is None
            and not launcher.ask_gpus(request.per_task)):
        raise SpecError(f"--gpus-per-task {request.per_task}: the {launcher.name} launcher's "
                        "tasks get their GPUs from whoever started them; ask there (e.g. "
                        "srun --gpus-per-task=1)")
    asks_nvml = where is Placement.HERE and env_cvd is None and request.choice != "none"
    base = launcher.base_environment()
    return request, plan_gpus(
        request, spec.tasks, where=where, seen=host_devices() if asks_nvml else None,
        notebook_cvd=(os.environ if base is None else base).get(CVD), env_cvd=env_cvd,
        hosts=launcher.task_hosts(spec.tasks))
