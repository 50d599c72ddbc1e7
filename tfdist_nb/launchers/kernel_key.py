"""The one rule for reusing a kernel that imported TensorFlow before its task was known.

A spare kernel (docs/design.md, "Spare kernels") and the fork server a task is forked from
(docs/design.md, "Fork server") serve a task only when its :class:`KernelKey` is theirs: the same
interpreter, preload, working directory, and environment variables read while a process starts
and imports TensorFlow (a kernel that imported it with one value of these cannot serve a task
that asks for another). :meth:`KernelKey.unfit` says which differs, as a record.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfdist_nb.gpu_plan import CVD, GROWTH
from tfdist_nb.worker.state import SPARE_ENV

#: Read when a strategy or a cluster resolver is made (TF_CONFIG), or set for the task itself
#: (its identity, the spare flag, its GPUs): a kernel takes the task's values after the import.
#: CUDA reads CUDA_VISIBLE_DEVICES when it initialises (TensorFlow's first GPU op or device
#: listing), never at the import, and TensorFlow the growth flag when it makes its GPU devices:
#: so a spare or fork server serves any task's GPUs, and must never initialise CUDA itself
#: (tests/test_gpu_placement.py).
LATE = frozenset({"TF_CONFIG", "TFDIST_TASK", SPARE_ENV, CVD, GROWTH})
#: Variables read while the process starts or TensorFlow (and what it loads: CUDA, oneDNN,
#: OpenMP, gRPC, absl, Keras, NumPy) is imported, or by the worker agent at kernel start.
#: Anything else (a user's own ``--env MY_FLAG=1``, PATH) is read later and is set in the
#: kernel. ``TF2_BEHAVIOR`` is set by the import itself; ``NUMPY_*`` (``NUMPY_MADVISE_HUGEPAGE``)
#: are read by NumPy's, which a kernel cannot redo.
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


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if import_time(k)}


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
        return cls(python, tuple(preload), cwd, tuple(sorted(import_time_env(env).items())))

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
