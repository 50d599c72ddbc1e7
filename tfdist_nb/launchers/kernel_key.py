"""The one rule for reusing a kernel that imported TensorFlow before its task was known.

Spare kernels and fork servers (docs/design.md) serve a task only when its :class:`KernelKey`
is theirs: what was read at start-up and import cannot be taken back.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfdist_nb.gpu_plan import CVD, GROWTH
from tfdist_nb.worker.state import SPARE_ENV

#: Read after the import, so a kernel takes the task's values: TF_CONFIG when a strategy is
#: made, CUDA_VISIBLE_DEVICES when CUDA initialises (which a spare or fork server must never
#: do), the growth flag when TF makes its GPU devices.
LATE = frozenset({"TF_CONFIG", "TFDIST_TASK", SPARE_ENV, CVD, GROWTH})
#: Variables read while the process starts or TensorFlow and what it loads are imported, or by
#: the worker agent at kernel start; anything else (``--env MY_FLAG=1``, PATH) is set later.
IMPORT_TIME_PREFIXES = (
    "TF_", "TF2_", "TFDIST_", "TENSORFLOW_", "XLA_", "CUDA_", "CUDNN_", "NVIDIA_", "NCCL_",
    "NV_", "HIP_", "ROCR_", "ROCM_", "GPU_", "TPU_", "KERAS_", "OMP_", "KMP_", "MKL_", "DNNL_",
    "ONEDNN_", "OPENBLAS_", "GOTO_", "BLIS_", "NUMPY_", "NUMEXPR_", "LD_", "DYLD_", "PYTHON",
    "PYDEVD", "MALLOC_", "GLIBC_", "GRPC_", "ABSL_", "GLOG_", "PROTOCOL_BUFFERS_", "HDF5_", "JPY_",
    "IPY", "JUPYTER", "MPL", "LC_", "LANG", "TZ", "TMP", "TEMP", "HOME", "XDG_",
)


def import_time(key: str) -> bool:
    """Whether a variable is read at start-up or import (see IMPORT_TIME_PREFIXES)."""
    return key not in LATE and key.startswith(IMPORT_TIME_PREFIXES)


class Part(enum.Enum):
    """The part of a :class:`KernelKey` in which two kernels differ."""

    PYTHON = "python"
    PRELOAD = "preload"
    CWD = "cwd"
    ENV = "env"


@dataclass(frozen=True)
class Unfit:
    """Why a kernel made for one key cannot serve a task of another; ``str()`` is the line."""

    part: Part
    have: str
    want: str
    names: tuple[str, ...] = ()  # the import-time variables that differ (part ENV)

    def __str__(self) -> str:
        if self.part is Part.PYTHON:
            return f"the spares run {self.have}, the tasks {self.want}"
        if self.part is Part.PRELOAD:
            return f"the spares preloaded {self.have}, the tasks want {self.want}"
        if self.part is Part.CWD:
            return f"the working directory changed ({self.have} -> {self.want})"
        keys = self.names
        named = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        return (f"{named} {'differs' if len(keys) == 1 else 'differ'} from the spares' (read "
                "when TensorFlow is imported)")


@dataclass(frozen=True)
class KernelKey:
    """What a kernel made ahead of its task shares with every task it can serve."""

    python: str
    preload: tuple[str, ...]
    cwd: str
    env: tuple[tuple[str, str], ...]  # the import-time environment, sorted

    @classmethod
    def of(cls, python: str, preload: Sequence[str], cwd: str,
           env: Mapping[str, str]) -> KernelKey:
        return cls(python, tuple(preload), cwd,
                   tuple(sorted((k, v) for k, v in env.items() if import_time(k))))

    def unfit(self, task: KernelKey) -> Unfit | None:
        """Why this key's kernel cannot become a task of key ``task``; None: it can."""
        if self.python != task.python:
            return Unfit(Part.PYTHON, self.python, task.python)
        if self.preload != task.preload:
            return Unfit(Part.PRELOAD, str(list(self.preload)), str(list(task.preload)))
        if self.cwd != task.cwd:
            return Unfit(Part.CWD, self.cwd, task.cwd)
        have, want = dict(self.env), dict(task.env)
        if keys := tuple(sorted(k for k in have.keys() | want.keys()
                                if have.get(k) != want.get(k))):
            return Unfit(Part.ENV, "", "", keys)
        return None
