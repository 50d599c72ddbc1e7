"""GPU failures and advice (pure; docs/reference.md, "GPU advice"): a GPU out-of-memory, NCCL's
errors and XIDs, and the collective implementation MultiWorkerMirroredStrategy runs on GPUs,
each cause chosen from evidence: the error, the task's output, every task's last GPU reading
(which GPU by UUID, what its processes held) and the task's environment."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tfdist_nb.results import TaskResult, TaskStatus
from tfdist_nb.samples import GpuReading, sample_gpus
from tfdist_nb.strenum import StrEnum
from tfdist_nb.worker.gpu import describe_xid

NCCL_FIX = ("tf.distribute.MultiWorkerMirroredStrategy(communication_options="
            "tf.distribute.experimental.CommunicationOptions(implementation="
            "tf.distribute.experimental.CommunicationImplementation.NCCL))")


def ring_on_gpus(facts: Mapping[str, object] | None) -> str | None:
    """The advice for a strategy whose collectives run RING on GPUs (``facts``: a
    ``Finding.STRATEGY`` note's): TensorFlow picks NCCL only when asked, AUTO is RING
    (docs/design.md, Facts). None on CPUs and where NCCL was asked for."""
    if not facts or facts.get("device") != "GPU":
        return None
    asked = facts.get("implementation")
    if asked not in ("AUTO", "RING"):
        return None
    how = ("AUTO, which TensorFlow runs as RING (it picks NCCL only when asked)"
           if asked == "AUTO" else "RING, as asked")
    return (f"MultiWorkerMirroredStrategy on {facts.get('devices')} GPU(s) per task runs its "
            f"collectives with {how}: TensorFlow's own ring over gRPC, where NCCL would move "
            f"the tensors GPU to GPU. Fix: {NCCL_FIX}")


class GpuFaultKind(StrEnum):
    """What a failure was, on the GPU side (an alert's ``kind``)."""

    OUT_OF_MEMORY = "gpu_out_of_memory"
    NCCL_OUT_OF_MEMORY = "nccl_out_of_memory"
    NCCL_DUPLICATE_GPU = "nccl_duplicate_gpu"
    NCCL_SYSTEM_ERROR = "nccl_system_error"
    NCCL_CONNECT = "nccl_connect"
    XID = "gpu_xid"


@dataclass(frozen=True)
class GpuFault:
    kind: GpuFaultKind
    task: str
    text: str
    about: tuple[str, ...] = ()  # the other tasks it concerns (on the same GPU)

    def __str__(self) -> str:
        return self.text


TF_OOM = re.compile(r"OOM when allocating tensor(?: with shape\s*\[([\d, ]*)\] and type (\w+))?"
                    r"[^\n]*(?:device:GPU|GPU_\d+_bfc)")
# the CUDA driver's and runtime's words, and those of the other GPU libraries a task's cell may
# use beside TensorFlow (PyTorch's "CUDA out of memory. Tried to allocate", CuPy's "Out of
# memory allocating"): the device check (bench/gpu_device_check.py) runs without TensorFlow
CUDA_OOM = re.compile(r"CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|CUDA out of memory"
                      r"|OutOfMemoryError: Out of memory allocating")
NCCL_OOM = re.compile(r"NCCL WARN Cuda failure '?out of memory'?")
NCCL_DUPLICATE = re.compile(r"Duplicate GPU detected : rank (\d+) and rank (\d+) both on CUDA "
                            r"device (\w+)")
NCCL_CONNECT = re.compile(r"NCCL WARN [^\n]*(?:Connect to \S+ failed|socketStartConnect|"
                          r"socketPollConnect|timed out|Timeout)[^\n]*")
NCCL_IFACE = re.compile(r"NCCL INFO Bootstrap : Using (?:\[\d+\])?([\w.-]+):")
NCCL_WARN = re.compile(r"NCCL WARN [^\n]*")
GPU_WORDS = re.compile(r"CUDA|NCCL|GPU|cuDNN|CUBLAS", re.IGNORECASE)
DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8,
               "float64": 8, "int32": 4, "int64": 8, "int8": 1, "uint8": 1, "bool": 1}
HELD_MOST = 0.9  # of a GPU's memory: TensorFlow took it all at its first op


def failure_fault(result: TaskResult, latest: Mapping[str, Mapping[str, object]],
                  env: dict[str, str] | None) -> GpuFault | None:
    """The GPU fault behind a task that raised or crashed; ``latest``: every task's last
    sample, ``env``: the task's environment (None: unknown)."""
    if result.status not in (TaskStatus.ERROR, TaskStatus.CRASHED) or result.error is None:
        return None
    parts = [result.error.evalue, result.stdout, result.stderr]
    if result.status is TaskStatus.CRASHED:
        parts.append(result.explanation or "")  # its process log's last lines
    return classify(result.task, "\n".join(parts), latest, env,
                    crashed=result.status is TaskStatus.CRASHED)


def classify(task: str, text: str, latest: Mapping[str, Mapping[str, object]],
             env: dict[str, str] | None, crashed: bool = False) -> GpuFault | None:
    """``text``: the error and the task's output (NCCL writes its lines to stdout)."""
    mine = sample_gpus(latest.get(task))
    shared = _sharing(task, mine, latest)
    on = _named(mine, env)
    if (crashed or GPU_WORDS.search(text)) and (xid := _xid(mine)):
        return GpuFault(GpuFaultKind.XID, task, f"{task}'s {xid}: the failure follows a fault of "
                        "its GPU, not of the code; restart the tasks on other GPUs")
    duplicate = NCCL_DUPLICATE.search(text)
    if duplicate or (shared and "invalid usage" in text):
        ranks = (f"ranks {duplicate.group(1)} and {duplicate.group(2)} on CUDA device "
                 f"{duplicate.group(3)}" if duplicate else "two ranks on one GPU")
        sharing = f"; {task} shares its GPU with {', '.join(shared)}" if shared else ""
        return GpuFault(GpuFaultKind.NCCL_DUPLICATE_GPU, task, (
            f"{task}: NCCL refused the collective ({ranks}): NCCL takes one rank of a "
            f"communicator per GPU{sharing}. Fix: one GPU per task "
            "(%%tfcluster --gpus auto), or CommunicationImplementation.RING on a shared GPU"),
            tuple(shared))
    if NCCL_OOM.search(text):
        return GpuFault(GpuFaultKind.NCCL_OUT_OF_MEMORY, task, (
            f"{task}: NCCL ran out of GPU memory on {on}{_held(mine)}: NCCL allocates its "
            "buffers outside TensorFlow's allocator (tensorflow#39110). "
            f"Likely: {'; '.join(_memory_causes(mine, shared, env, nccl=True))}"), tuple(shared))
    oom = TF_OOM.search(text)
    if oom or CUDA_OOM.search(text):
        causes = _memory_causes(mine, shared, env, nccl=False, tensor=oom)
        return GpuFault(GpuFaultKind.OUT_OF_MEMORY, task, (
            f"{task} ran out of GPU memory on {on}{_held(mine)}. Likely: {'; '.join(causes)}"),
            tuple(shared))
    if connect := NCCL_CONNECT.search(text):
        iface = NCCL_IFACE.search(text)
        where = (f"NCCL's bootstrap used interface {iface.group(1)}; if the tasks cannot "
                 "reach each other there, set NCCL_SOCKET_IFNAME to one they share (--env "
                 "NCCL_SOCKET_IFNAME=...)" if iface else "set NCCL_SOCKET_IFNAME to the "
                 "interface the tasks share (--env NCCL_SOCKET_IFNAME=...)")
        return GpuFault(GpuFaultKind.NCCL_CONNECT, task, (
            f"{task}: NCCL could not connect the tasks ('{connect.group(0).strip()}'): {where}; "
            "%tfdist_check network tests the tasks' addresses"))
    if "unhandled system error" in text:
        return GpuFault(GpuFaultKind.NCCL_SYSTEM_ERROR, task,
                        f"{task}: NCCL failed with 'unhandled system error': {_system(text)}")
    return None


def _sharing(task: str, mine: list[GpuReading],
             latest: Mapping[str, Mapping[str, object]]) -> list[str]:
    """The other tasks whose last reading shows one of this task's GPUs (by UUID: indices
    repeat from host to host)."""
    uuids = {g.get("uuid") for g in mine} - {None}
    return sorted(other for other, sample in latest.items() if other != task and uuids
                  & {g.get("uuid") for g in sample_gpus(sample)})


def _named(mine: list[GpuReading], env: dict[str, str] | None) -> str:
    """``GPU 1 (GPU-...) (CUDA_VISIBLE_DEVICES=1)``: what it had and what it was given."""
    said = ", ".join(f"GPU {g.get('index')} ({g.get('uuid')})" for g in mine) or "its GPU"
    given = (env or {}).get("CUDA_VISIBLE_DEVICES")
    return f"{said} (CUDA_VISIBLE_DEVICES={given})" if given is not None else said


def _held(mine: list[GpuReading]) -> str:
    """What the task held at its last sample: its own processes' memory where NVML told them
    apart, else the GPU's whole use."""
    parts = []
    for g in mine:
        own, used, total = g.get("task_mem_mb"), g.get("mem_used_mb"), g.get("mem_total_mb")
        if own is not None and total:
            parts.append(f"it held {own:.0f} of {total:.0f} MB on GPU {g.get('index')}")
        elif used is not None and total:
            parts.append(f"GPU {g.get('index')} had {used:.0f} of {total:.0f} MB in use (all "
                         "its processes)")
    return f"; at its last sample {', '.join(parts)}" if parts else ""


def _memory_causes(mine: list[GpuReading], shared: list[str], env: dict[str, str] | None,
                   nccl: bool, tensor: re.Match[str] | None = None) -> list[str]:
    """The usual causes, each only where the readings show it."""
    causes = []
    if shared:
        causes.append(f"{', '.join(shared)} use(s) the same GPU, and each TensorFlow process "
                      "takes nearly all of a GPU it sees: give each task its own GPU "
                      "(%%tfcluster --gpus auto or --gpus-per-task N)")
    most = any((g.get("task_mem_mb") or g.get("mem_used_mb") or 0)
               >= HELD_MOST * (g.get("mem_total_mb") or float("inf")) for g in mine)
    growth = (env or {}).get("TF_FORCE_GPU_ALLOW_GROWTH", "").lower() == "true"
    if env is not None and not growth and (shared or nccl or most):
        causes.append("memory growth is off (no TF_FORCE_GPU_ALLOW_GROWTH=true in its "
                      "environment): TensorFlow reserves nearly all of a GPU at its first op, "
                      "leaving little to NCCL, cuDNN or another process (--env "
                      "TF_FORCE_GPU_ALLOW_GROWTH=true)")
    if nccl:
        causes.append("NCCL's own buffers: NCCL_BUFFSIZE=2097152 makes them smaller")
    if tensor is not None and tensor.group(1):
        dims = [int(d) for d in tensor.group(1).replace(" ", "").split(",") if d]
        size = DTYPE_BYTES.get(tensor.group(2) or "", 4) * math.prod(dims)
        causes.append(f"the tensor it could not allocate, {tensor.group(2)}"
                      f"[{','.join(map(str, dims))}] ({size / 2**20:.0f} MB), grows with the "
                      "batch per replica (the global batch / the number of replicas): a "
                      "smaller one shrinks it")
    if not causes:
        causes.append("the model and its batch need more than this GPU holds: a smaller batch "
                      "per replica, mixed precision, or more GPUs")
    return causes


def _xid(mine: list[GpuReading]) -> str | None:
    return next((f"GPU {g.get('index')} ({g.get('uuid')}) reported {describe_xid(code)}"
                 for g in mine for code in g.get("xid") or ()), None)


def _system(text: str) -> str:
    """NCCL's 'unhandled system error' is a failed system call; which one its lines say."""
    if re.search(r"/dev/shm|shared memory|shm_open", text):
        return ("NCCL could not make its shared memory segment: /dev/shm is too small (a "
                "container's default is 64 MB: --shm-size, or --ipc=host), or NCCL_SHM_DISABLE=1")
    if re.search(r"ibv_|NET/IB", text):
        return ("InfiniBand verbs failed: NCCL_IB_DISABLE=1 uses TCP sockets instead; else check "
                "the IB devices and the locked-memory limit (ulimit -l)")
    warn = NCCL_WARN.search(text)
    if warn:
        return f"its first warning: '{warn.group(0).strip()}'"
    return ("NCCL did not say which: run with --env NCCL_DEBUG=WARN; its lines go to each "
            "task's log (%tfdist_logs --grep NCCL)")
