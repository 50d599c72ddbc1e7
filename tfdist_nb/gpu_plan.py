"""Which GPUs each task gets (docs/reference.md, GPU placement), pure: the devices NVML sees in,
each task's ``CUDA_VISIBLE_DEVICES`` out (:class:`GpuPlan`). NVML enumerates every GPU whatever
``CUDA_VISIBLE_DEVICES`` says, so :func:`select` applies a process's own value as CUDA reads it;
the controller and the tasks' sampler both map through here.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tfdist_nb.errors import SpecError
from tfdist_nb.strenum import StrEnum
from tfdist_nb.topology import TaskId

CVD = "CUDA_VISIBLE_DEVICES"
GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
#: the roles that get GPUs; ps tasks (and an evaluator) get none
GPU_ROLES = ("chief", "worker")
EXAMPLE = "e.g. --gpus 0,1 (gpus=[0, 1]), --gpus none, --gpus-per-task 2"


class Placement(StrEnum):
    """Who gives a launcher's tasks their GPUs (``Launcher.gpu_placement``)."""

    HERE = "here"  # this host's: NVML here says which GPUs there are
    PER_HOST = "per-host"  # other hosts', unseen from here: --gpus LIST or --gpus-per-task
    SCHEDULER = "scheduler"  # the scheduler's (SLURM): asked for a count, its choice kept


class NoteKind(StrEnum):
    """What a line about the placement says (the views pick by kind, never by words)."""

    ASSIGNED = "assigned"
    SHARED = "shared"
    UNUSED = "unused"
    UNSEEN = "unseen"
    NOT_PLACED = "not_placed"
    HIDDEN = "hidden"
    ENV_WINS = "env_wins"


@dataclass(frozen=True)
class Device:
    """One device CUDA can be given: a GPU, or a MIG instance of the GPU ``index``."""

    index: int  # NVML index of the GPU (the parent's for a MIG instance)
    uuid: str  # GPU-... or MIG-...
    gpu_uuid: str = ""  # a MIG instance's parent GPU
    slot: int | None = None  # a MIG instance's slot on its parent

    @property
    def parent(self) -> str:
        return self.gpu_uuid or self.uuid


@dataclass(frozen=True)
class GpuRequest:
    """What the user asked: ``choice`` "auto", "none" or the devices as given (indices as
    digits, or UUIDs), and ``per_task`` GPUs per task (None: an even share)."""

    choice: str | tuple[str, ...] = "auto"
    per_task: int | None = None


@dataclass(frozen=True)
class GpuNote:
    kind: NoteKind
    text: str
    level: str = "INFO"


@dataclass(frozen=True)
class GpuPlan:
    """Each placed task's ``CUDA_VISIBLE_DEVICES`` ("" hides every GPU; a task absent is not
    placed and keeps what it inherits), whether tasks share GPUs, and what is said about it."""

    tasks: Mapping[TaskId, str] = field(default_factory=dict)
    shared: bool = False
    notes: tuple[GpuNote, ...] = ()

    def env(self, task: TaskId) -> dict[str, str]:
        """The variables the placement sets for ``task`` (the user's ``env=`` go over them)."""
        if task not in self.tasks:
            return {}
        given = self.tasks[task]
        return {CVD: given, **({GROWTH: "true"} if self.shared and given else {})}

    @property
    def line(self) -> str | None:
        """The one line said at the start (None: nothing to say, e.g. no NVML)."""
        return "; ".join(n.text for n in self.notes) or None

    @property
    def level(self) -> str:
        return "WARNING" if any(n.level == "WARNING" for n in self.notes) else "INFO"


def gpu_request(gpus: str | Sequence[str | int] = "auto",
                per_task: int | None = None) -> GpuRequest:
    """``gpus=`` / ``--gpus`` and ``gpus_per_task=`` / ``--gpus-per-task`` checked; SpecError
    with an example for what CUDA could not be given."""
    if isinstance(gpus, str) and gpus.strip().lower() in ("auto", "none"):
        choice: str | tuple[str, ...] = gpus.strip().lower()
    elif isinstance(gpus, (str, list, tuple)):
        items = gpus.split(",") if isinstance(gpus, str) else list(gpus)
        choice = tuple(_item(x, gpus) for x in items)
        if not choice:
            raise SpecError(f"--gpus needs at least one GPU; {EXAMPLE}")
        twice = next((x for i, x in enumerate(choice) if x in choice[:i]), None)
        if twice is not None:
            raise SpecError(f"--gpus {_said(gpus)} lists GPU {twice} twice; each GPU once, "
                            f"{EXAMPLE}")
    else:
        raise SpecError(f"gpus= takes 'auto', 'none' or a list of GPUs, got {gpus!r}; {EXAMPLE}")
    if per_task is not None:
        if (isinstance(per_task, bool) or not isinstance(per_task, numbers.Integral)
                or per_task < 1):
            raise SpecError(f"--gpus-per-task takes a positive number of GPUs, got {per_task!r};"
                            f" {EXAMPLE}")
        per_task = int(per_task)
        if choice == "none":
            raise SpecError(f"--gpus-per-task {per_task} with --gpus none asks for GPUs and "
                            f"hides them; {EXAMPLE}")
        if isinstance(choice, tuple) and per_task > len(choice):
            raise SpecError(f"--gpus-per-task {per_task} is more than the {len(choice)} GPU(s) "
                            f"of --gpus {','.join(choice)}; {EXAMPLE}")
    return GpuRequest(choice, per_task)


def _item(value: str | int, whole: str | Sequence[str | int]) -> str:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0:
        return str(int(value))
    text = value.strip() if isinstance(value, str) else ""
    if text.isdigit() or (text[:4].upper() in ("GPU-", "MIG-") and len(text) > 4):
        return text
    raise SpecError(f"--gpus {_said(whole)}: {value!r} is not a GPU: give indices (0, 1, ...) "
                    f"or UUIDs (GPU-..., MIG-...); {EXAMPLE}")


def _said(gpus: str | Sequence[str | int]) -> str:
    return gpus if isinstance(gpus, str) else ",".join(map(str, gpus))


def resolve(entry: str, devices: Sequence[Device]) -> list[Device] | None:
    """The devices one ``CUDA_VISIBLE_DEVICES`` entry names, as CUDA reads it: an index (a GPU
    in MIG mode: its instances), a GPU or MIG UUID or a unique prefix of one; None: none."""
    entry = entry.strip()
    if entry.isdigit():
        found = [d for d in devices if d.index == int(entry)]
    elif entry[:4].upper() == "MIG-":
        found = [d for d in devices if d.slot is not None
                 and d.uuid.lower().startswith(entry.lower())]
        found = found if len(found) == 1 else []
    elif entry[:4].upper() == "GPU-":
        parents = {d.parent for d in devices if d.parent.lower().startswith(entry.lower())}
        found = [d for d in devices if d.parent in parents] if len(parents) == 1 else []
    else:
        found = []
    return found or None


def select(cvd: str | None, devices: Sequence[Device]) -> list[Device]:
    """The devices a process with ``CUDA_VISIBLE_DEVICES=cvd`` can use (None: unset, all);
    CUDA stops at the first entry that names no device ("" and "-1" hide them all)."""
    if cvd is None:
        return list(devices)
    out: list[Device] = []
    for entry in cvd.split(","):
        found = resolve(entry, devices)
        if found is None:
            break
        out.extend(d for d in found if d not in out)
    return out


def plan_gpus(request: GpuRequest, tasks: Sequence[TaskId], *, where: Placement = Placement.HERE,
              seen: Sequence[Device] | None = None, notebook_cvd: str | None = None,
              env_cvd: str | None = None,
              hosts: Mapping[TaskId, str] | None = None) -> GpuPlan:
    """Each task's GPUs (docs/reference.md, GPU placement). ``seen``: the devices NVML reads on
    this host (None: no NVML); ``notebook_cvd``: this process's own CUDA_VISIBLE_DEVICES;
    ``env_cvd``: one given with ``env=``, which wins; ``hosts``: each task's host (PER_HOST).
    SpecError for what cannot be placed."""
    if env_cvd is not None:
        return GpuPlan(notes=(GpuNote(NoteKind.ENV_WINS, f"{CVD}={env_cvd!r} from --env: every "
                                      "task starts with it, --gpus is not applied"),))
    if request.choice == "none":
        return GpuPlan({t: "" for t in tasks}, notes=(GpuNote(
            NoteKind.HIDDEN, f"--gpus none: no task sees a GPU ({CVD}='')"),))
    placed = {t: "" for t in tasks if t.role not in GPU_ROLES}
    gpu_tasks = [t for t in tasks if t.role in GPU_ROLES]
    listed = request.choice if isinstance(request.choice, tuple) else None
    per_task = request.per_task
    if where is Placement.SCHEDULER:
        if listed is not None:
            raise SpecError(f"--gpus {','.join(listed)}: the scheduler chooses the GPUs of "
                            "these tasks; ask for a count, e.g. --gpus-per-task 1")
        return GpuPlan() if per_task is None else GpuPlan(placed, notes=(GpuNote(
            NoteKind.ASSIGNED, f"--gpus-per-task {per_task}: asked the scheduler for "
            f"{per_task} GPU(s) per task; each keeps the {CVD} it gives"),))
    notes: list[GpuNote] = []
    if where is Placement.PER_HOST:  # their GPUs are unknown here: only a count places them
        if listed is None and per_task is None:
            return GpuPlan()
        groups: dict[str, list[TaskId]] = {}
        for t in gpu_tasks:
            groups.setdefault((hosts or {}).get(t, ""), []).append(t)
        ids: list[str] | None = list(listed) if listed else None  # else 0..N-1 per task
    elif listed is not None:
        ids, groups = list(listed), {"": gpu_tasks}
        if unseen := [x for x in listed if seen is None or resolve(x, seen) is None]:
            why = "NVML is not available here" if seen is None else "NVML does not see them"
            notes.append(GpuNote(NoteKind.UNSEEN, f"--gpus {','.join(unseen)}: {why}; used as "
                                 "given (CUDA can see GPUs NVML cannot)", "WARNING"))
    elif seen is None:  # no NVML: nothing is known; a count asked for is said unmet
        return GpuPlan() if per_task is None else GpuPlan(notes=(GpuNote(
            NoteKind.NOT_PLACED, f"--gpus-per-task {per_task}: NVML sees no GPU here (no "
            "library, driver or device), so none was placed; --gpus 0,1 gives GPUs NVML cannot "
            "see", "WARNING"),))
    else:
        visible = select(notebook_cvd, seen)
        if per_task is not None and per_task > len(visible):
            raise SpecError(f"--gpus-per-task {per_task} is more than the {len(visible)} GPU(s) "
                            f"the notebook sees here{_seen(visible)}; {EXAMPLE}")
        if not visible:
            return GpuPlan()  # a host without GPUs (or all hidden from the notebook)
        uuids = any(d.slot is not None for d in visible) or any(
            not e.strip().isdigit() for e in (notebook_cvd or "0").split(","))
        ids, groups = [d.uuid if uuids else str(d.index) for d in visible], {"": gpu_tasks}
    shared, unused = False, list[str]()
    for group in groups.values():
        got = ids if ids is not None else [str(i) for i in range(len(group) * (per_task or 1))]
        sets, share, unused = _deal(got, len(group), per_task)
        placed.update(zip(group, map(",".join, sets), strict=True))
        shared = shared or share
    if shared:
        notes.append(GpuNote(NoteKind.SHARED, f"{len(gpu_tasks)} tasks take turns on "
                             f"{len(ids or ()) - len(unused)} GPU(s): each has {GROWTH}=true so "
                             "TensorFlow takes GPU memory as it needs it; NCCL refuses two tasks "
                             "of one collective on one GPU ('Duplicate GPU detected'): keep RING "
                             "collectives (MultiWorkerMirroredStrategy's default) or start "
                             "fewer tasks", "WARNING"))
    if unused and where is Placement.HERE:
        notes.append(GpuNote(NoteKind.UNUSED, f"GPU(s) {','.join(unused)} left unused "
                             f"({len(ids or ())} for {len(gpu_tasks)} task(s)); --gpus-per-task N "
                             "to change"))
    each = ", ".join(f"{t} {placed[t]}" for t in gpu_tasks)
    on = " on each host" if where is Placement.PER_HOST else ""
    return GpuPlan(placed, shared, (GpuNote(NoteKind.ASSIGNED, f"GPUs{on}: {each}"), *notes))


def _deal(ids: list[str], tasks: int,
          per_task: int | None) -> tuple[list[list[str]], bool, list[str]]:
    """``ids`` cut into contiguous groups of ``per_task`` (else an even share), given out
    round robin; whether tasks share a group, and the ids no task got."""
    n = per_task or max(len(ids) // max(tasks, 1), 1)
    groups = max(len(ids) // n, 1)
    sets = [ids[(t % groups) * n:(t % groups) * n + n] for t in range(tasks)]
    return sets, tasks > groups, ids[min(tasks, groups) * n:]


def _seen(visible: Sequence[Device]) -> str:
    named = (d.uuid if d.slot is not None else str(d.index) for d in visible)
    return f" ({', '.join(named)})" if visible else ""
