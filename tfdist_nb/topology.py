"""The pure grammar of cluster SPECs ("1 chief 2 workers") and task lists ("0,1", "worker:0,ps:0"),
the order tasks are listed in, and the rules of a TF_CONFIG: the magics, the Python API and
``%tfdist_check tfconfig`` share them, so a mistake gets the same message wherever it is made.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tfdist_nb.errors import SpecError

ROLES: tuple[str, ...] = ("chief", "worker", "ps", "evaluator")
_PLURALS = {"chief": "chiefs", "worker": "workers", "ps": "ps", "evaluator": "evaluators"}
_ROLE_WORDS = {**{r: r for r in ROLES}, **{p: r for r, p in _PLURALS.items()}}
MAX_TASKS_PER_ROLE = 1024  # measured at 1,024 (docs/performance.md)
SPEC_EXAMPLE = "%%tfcluster 2 workers   (or: 1 worker, 1 chief 2 workers 1 ps)"


@dataclass(frozen=True, order=True)
class TaskId:
    """A task in TensorFlow's job/index form, e.g. ``worker:1``."""

    role: str
    index: int

    def __str__(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def slug(self) -> str:
        """A file-name-safe form (``worker-1``) for run-directory paths."""
        return f"{self.role}-{self.index}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        """Parse ``worker:1`` or a bare ``1`` (a bare integer means a worker)."""
        text = text.strip()
        if re.fullmatch(r"\d+", text):
            return cls("worker", int(text))
        m = re.fullmatch(r"([a-z]+)[:/](\d+)", text)
        if not m or m.group(1) not in ROLES:
            raise SpecError(f"cannot read task {text!r}: use role:index (worker:1, chief:0, "
                            "ps:0) or a bare worker index (1)")
        return cls(m.group(1), int(m.group(2)))


@dataclass(frozen=True)
class ClusterSpec:
    """How many tasks of each role. Equal specs mean the cluster can be reused as it is."""

    workers: int = 0
    chief: int = 0
    ps: int = 0
    evaluator: int = 0

    def __post_init__(self) -> None:
        for role in ROLES:
            n = self.count(role)
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise SpecError(f"{_PLURALS[role]} must be a non-negative integer, got {n!r}")
            if n > MAX_TASKS_PER_ROLE:
                raise SpecError(f"{n} {_PLURALS[role]} is more than {MAX_TASKS_PER_ROLE}")
        for role in ("chief", "evaluator"):
            if self.count(role) > 1:
                raise SpecError(f"a cluster has at most 1 {role}")
        if self.ps and not (self.workers or self.chief):
            raise SpecError("ps tasks need workers to serve")
        if self.workers + self.chief == 0:
            raise SpecError(
                f"a cluster needs at least 1 worker or a chief; example: {SPEC_EXAMPLE}")

    def count(self, role: str) -> int:
        return {"worker": self.workers, "chief": self.chief, "ps": self.ps,
                "evaluator": self.evaluator}[role]

    @property
    def size(self) -> int:
        """How many tasks, without building them (``len(tasks)``)."""
        return self.workers + self.chief + self.ps + self.evaluator

    @property
    def tasks(self) -> list[TaskId]:
        """Every task, chief first, then workers, ps, evaluator (TensorFlow's usual order)."""
        return [TaskId(role, i) for role in ROLES for i in range(self.count(role))]

    def __str__(self) -> str:
        return spec_words({role: self.count(role) for role in ROLES})


def spec_words(counts: Mapping[str, int]) -> str:
    """``{"chief": 1, "worker": 2, "ps": 1}`` as a SPEC is written: ``1 chief 2 workers 1 ps``
    (roles in their order, none left out but those counted 0; another role last, as given)."""
    roles = [r for r in ROLES if counts.get(r)] + [r for r in counts if r not in ROLES
                                                    and counts[r]]
    return " ".join(f"{counts[r]} {r if counts[r] == 1 else _PLURALS.get(r, r + 's')}"
                    for r in roles)


def parse_spec(text: str | Iterable[str]) -> ClusterSpec:
    """Parse ``"2 workers"``, ``"1 worker"``, ``"1 chief 2 workers 1 ps"`` (pairs in any order)."""
    tokens = text.split() if isinstance(text, str) else [t for part in text for t in part.split()]
    if not tokens:
        raise SpecError(f"no cluster SPEC given; example: {SPEC_EXAMPLE}")
    if len(tokens) % 2:
        raise SpecError(f"SPEC is pairs of '<count> <role>', got {' '.join(tokens)!r}; "
                        f"example: {SPEC_EXAMPLE}")
    counts: dict[str, int] = {}
    for count_text, word in zip(tokens[::2], tokens[1::2], strict=False):
        count = _parse_count(count_text, word)
        role = _parse_role(word)
        if role in counts:
            raise SpecError(f"role {role!r} given twice in SPEC {' '.join(tokens)!r}")
        counts[role] = count
    if counts.get("worker") == 0 and not counts.get("chief"):
        raise SpecError(f"0 workers is not a cluster; example: {SPEC_EXAMPLE}")
    return ClusterSpec(workers=counts.get("worker", 0), chief=counts.get("chief", 0),
                       ps=counts.get("ps", 0), evaluator=counts.get("evaluator", 0))


def _parse_count(text: str, word: str) -> int:
    if not re.fullmatch(r"\d+", text):
        raise SpecError(f"expected a number before {word!r}, got {text!r}; write digits: "
                        f"{SPEC_EXAMPLE}")
    return int(text)


def _parse_role(word: str) -> str:
    role = _ROLE_WORDS.get(word.lower())
    if role is None:
        close = difflib.get_close_matches(word.lower(), list(_ROLE_WORDS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise SpecError(f"unknown role {word!r}; roles are chief, worker(s), ps, evaluator."
                        f"{hint} Example: {SPEC_EXAMPLE}")
    return role


#: what ``on=``/``--on`` takes: ``"0,1"``, ``"worker:0"``, an index, a TaskId, a list of
#: them, or None / ``"all"`` for every task
Targets = str | int | TaskId | Iterable[str | int | TaskId] | None


def parse_targets(text: Targets, spec: ClusterSpec) -> list[TaskId]:
    """Resolve ``--on``/``on=`` against a spec (``None``/``"all"``: every task); a task the
    spec does not have is an error naming those it does have."""
    if text is None or (isinstance(text, str) and text.strip() in ("", "all")):
        return spec.tasks
    items: list[str | int | TaskId]
    if isinstance(text, str):
        items = [p for p in text.split(",") if p.strip()]
    elif isinstance(text, (int, TaskId)):
        items = [text]
    else:
        items = list(text)
    if not items:
        raise SpecError("empty task list; example: --on 0,1 or --on worker:0,ps:0")
    known = spec.tasks
    chosen: list[TaskId] = []
    for item in items:
        if isinstance(item, TaskId):
            task = item
        elif isinstance(item, int) and not isinstance(item, bool):
            task = TaskId("worker", item)
        else:
            task = TaskId.parse(str(item))
        if task not in known:
            raise SpecError(f"no task {task} in a cluster of {spec}; its tasks are "
                            f"{', '.join(map(str, known))}")
        if task not in chosen:
            chosen.append(task)
    return chosen


def task_order(name: str) -> tuple[int, str, int]:
    """Sort key of a task name (``"worker:1"``): chief, workers, ps, evaluator, each by index;
    other names (``"given"``) last."""
    role, _, index = name.partition(":")
    rank = ROLES.index(role) if role in ROLES else len(ROLES)
    return rank, role, int(index) if index.isdigit() else 0


#: more task names than this are said as runs (``worker:0-1022``) with their count
NAMES_IN_FULL = 8


def name_tasks(names: Iterable[str]) -> str:
    """``"worker:0, worker:1 and ps:0"``: task names in task order, for a sentence; more than
    ``NAMES_IN_FULL`` as runs of consecutive indexes, ``"worker:0-1022 and ps:0 (1,024 tasks)"``."""
    ordered = sorted(names, key=task_order)
    if len(ordered) > NAMES_IN_FULL:
        runs: list[list[str]] = []
        for name in ordered:
            if runs and _follows(runs[-1][-1], name):
                runs[-1].append(name)
            else:
                runs.append([name])
        said = [run[0] if len(run) == 1 else f"{run[0]}-{run[-1].partition(':')[2]}"
                for run in runs]
        return f"{_in_full(said)} ({len(ordered):,} tasks)"
    return _in_full(ordered)


def _in_full(ordered: list[str]) -> str:
    return ordered[0] if len(ordered) == 1 else ", ".join(ordered[:-1]) + " and " + ordered[-1]


def _follows(before: str, name: str) -> bool:
    role, _, index = name.partition(":")
    was, _, last = before.partition(":")
    return role == was and index.isdigit() and last.isdigit() and int(index) == int(last) + 1


def validate_tf_config(cfg: object) -> list[str]:
    """Every structural problem of one TF_CONFIG, each naming its field; empty when valid."""
    if not isinstance(cfg, Mapping):
        return ["TF_CONFIG: must be a JSON object with 'cluster' and 'task'"]
    errors: list[str] = []
    cluster, task = cfg.get("cluster"), cfg.get("task")
    if not isinstance(cluster, Mapping) or not cluster:
        errors.append("cluster: missing or empty (expected {'worker': ['host:port', ...]})")
        cluster = {}
    seen: dict[str, str] = {}
    for role, addrs in cluster.items():
        if role not in ROLES:
            errors.append(f"cluster.{role}: unknown task type (expected one of "
                          f"{', '.join(ROLES)})")
        if not isinstance(addrs, list) or not addrs:
            errors.append(f"cluster.{role}: must be a non-empty list of 'host:port'")
            continue
        for i, addr in enumerate(addrs):
            where = f"cluster.{role}[{i}]"
            errors.extend(_address_problems(where, addr))
            if isinstance(addr, str) and addr in seen:
                errors.append(f"{where}: duplicate address {addr} (also {seen[addr]})")
            seen[str(addr)] = where
    chiefs = cluster.get("chief")
    if isinstance(chiefs, list) and len(chiefs) > 1:
        errors.append(f"cluster.chief: {len(chiefs)} chiefs; a cluster has at most one")
    if cluster.get("ps") and not (cluster.get("worker") or cluster.get("chief")):
        errors.append("cluster.ps: ps tasks without workers (add 'worker' addresses)")
    if not isinstance(task, Mapping):
        errors.append("task: missing (expected {'type': 'worker', 'index': 0})")
        return errors
    ttype, index = task.get("type"), task.get("index")
    if ttype not in ROLES:
        errors.append(f"task.type: {ttype!r} is not a task type (expected one of "
                      f"{', '.join(ROLES)})")
    elif ttype != "evaluator" and ttype not in cluster:
        errors.append(f"task.type: {ttype!r} has no entry in cluster")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        errors.append(f"task.index: {index!r} must be a non-negative integer")
    elif isinstance(cluster.get(ttype), list) and index >= len(cluster[ttype]):
        errors.append(f"task.index: {index} is out of range for {ttype} "
                      f"(it has {len(cluster[ttype])})")
    return errors


def _address_problems(where: str, addr: object) -> list[str]:
    if not isinstance(addr, str) or ":" not in addr:
        return [f"{where}: {addr!r} is not 'host:port'"]
    host, _, port = addr.rpartition(":")
    if not host:
        return [f"{where}: {addr!r} has no host"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        return [f"{where}: port {port!r} is not a port number (1-65535)"]
    return []
