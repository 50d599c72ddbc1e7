"""This process's memory cgroup (v2 or v1) and what memory is left to start a process in: the
worker's telemetry samples it, the controller reads a dead task's OOM kills from it and asks it
before it starts a spare kernel or a fork server (a container's limit, not the host's memory,
is what an OOM kill enforces: Binder's 2 GB, a SLURM job's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

V1_UNLIMITED = 2**60  # cgroup v1 says "no limit" with a number near 2**63


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # missing, or "max" (no limit)
        return None


def _read_key(path: Path, key: str) -> int | None:
    """``key N`` lines (memory.events, memory.oom_control)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def read_oom_kills(cgroup_dir: str) -> int | None:
    """The OOM kills counted in a memory cgroup (v2 ``memory.events``, v1
    ``memory.oom_control``), e.g. read by the controller after a task died (``mem_cgroup``)."""
    d = Path(cgroup_dir)
    found = _read_key(d / "memory.events", "oom_kill")
    return found if found is not None else _read_key(d / "memory.oom_control", "oom_kill")


class CgroupMemory:
    """This process's memory cgroup (v2 or v1), found once and read on every sample; the limit
    in force is the smallest of its and its ancestors' (SLURM limits the job, above the step)."""

    def __init__(self, version: int, directory: Path, top: Path) -> None:
        self.version = version
        self.directory = directory
        self.top = top

    @classmethod
    def find(cls, proc_self: str = "/proc/self") -> CgroupMemory | None:
        try:
            groups = Path(proc_self, "cgroup").read_text().splitlines()
            mounts = Path(proc_self, "mountinfo").read_text().splitlines()
        except OSError:
            return None
        v2_path = v1_path = None
        for line in groups:
            hid, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if hid == "0" and controllers == "":
                v2_path = path
            elif "memory" in controllers.split(","):
                v1_path = path
        for line in mounts:
            left, _, right = line.partition(" - ")
            fields, super_fields = left.split(), right.split()
            if len(fields) < 5 or len(super_fields) < 3:
                continue
            root, mountpoint, fstype = fields[3], fields[4], super_fields[0]
            if fstype == "cgroup2" and v2_path is not None:
                d = _below(mountpoint, root, v2_path)
                if d is not None and (d / "memory.max").exists():
                    return cls(2, d, Path(mountpoint))
            elif (fstype == "cgroup" and v1_path is not None
                  and "memory" in super_fields[2].split(",")):
                d = _below(mountpoint, root, v1_path)
                if d is not None and (d / "memory.limit_in_bytes").exists():
                    return cls(1, d, Path(mountpoint))
        return None

    def read(self) -> dict[str, Any]:
        """``{"path", "limit_mb", "used_mb", "oom_kills"}``; ``used_mb`` is the usage of the
        cgroup whose limit is in force (this one's when none is set)."""
        limit_file, usage_file = (("memory.max", "memory.current") if self.version == 2 else
                                  ("memory.limit_in_bytes", "memory.usage_in_bytes"))
        limit: int | None = None
        limiting = self.directory
        d = self.directory
        while True:
            value = _read_int(d / limit_file)
            if value is not None and value < V1_UNLIMITED and (limit is None or value < limit):
                limit, limiting = value, d
            if d == self.top or self.top not in d.parents:
                break
            if self.version == 1 and _read_int(d.parent / "memory.use_hierarchy") == 0:
                break  # v1 without hierarchy: the parent's limit does not cover this cgroup
            d = d.parent
        used = _read_int(limiting / usage_file)
        return {"path": str(self.directory),
                "limit_mb": None if limit is None else limit / 2**20,
                "used_mb": None if used is None else used / 2**20,
                "oom_kills": read_oom_kills(str(self.directory))}


def _below(mountpoint: str, root: str, path: str) -> Path | None:
    """Where cgroup ``path`` (from /proc/self/cgroup) is under a mount of hierarchy ``root``."""
    if root != "/" and path != root and not path.startswith(root.rstrip("/") + "/"):
        return None
    rel = path[len(root):] if root != "/" else path
    return Path(mountpoint, rel.lstrip("/"))


#: Memory one TensorFlow task needs (docs/design.md, Facts: 550-600 MB on import): what the
#: spare pool leaves free, and below which an idle fork server is ended at once.
TF_TASK_MB = 600


def available_mb() -> float:
    """Memory a new process can take without an OOM kill: the host's available memory, or
    what this process's memory cgroup has left under its limit when that is less."""
    import psutil

    host = psutil.virtual_memory().available / 2**20
    group = CgroupMemory.find()
    if group is None:
        return host
    read = group.read()
    if read["limit_mb"] is None or read["used_mb"] is None:
        return host
    return min(host, read["limit_mb"] - read["used_mb"])
