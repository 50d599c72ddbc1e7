"""Which environment variables a process reads while it starts and imports TensorFlow.

A kernel that imported TensorFlow with one value of these cannot serve a task that asks for
another: a spare kernel (docs/design.md, "Spare kernels") and the fork server a task is forked
from (docs/design.md, "Fork server") are only used when these match the task's.
"""

from __future__ import annotations

from collections.abc import Mapping

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
