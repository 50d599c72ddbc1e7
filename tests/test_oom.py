"""Out of memory against REAL limits, on real worker kernels.

- A cgroup memory limit: the kernel's OOM killer SIGKILLs the task; the crash report must say
  "likely out of memory" with the cgroup evidence the task itself read. It needs a memory cgroup
  this test can create (root, a writable cgroup fs); where there is none it is skipped, saying
  why, and the RLIMIT_AS test below still covers a real limit end to end.
- An address-space limit (RLIMIT_AS, set inside the cell): allocations fail with MemoryError;
  the task must say it ran out of memory against that limit.
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.diagnostics.crash import likely_oom
from tfdist_nb.events import TaskNote
from tfdist_nb.worker.memory_limits import read_oom_kills
from tfdist_nb.worker.telemetry import out_of_memory_error

pytestmark = pytest.mark.cluster

LIMIT_MB = 300
GROW_UNTIL_KILLED = """
import time
hoard = []
print("growing", flush=True)
while True:   # 4 MB every 20 ms, like a job whose memory creeps up batch after batch
    hoard.append(b"\\x01" * (4 * 2**20))
    time.sleep(0.02)
"""


def samples(cluster: Any, task: str) -> list[dict[str, Any]]:
    path = cluster.run_dir / "telemetry.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r["data"] for r in rows if r["task"] == task]


def _own_memory_cgroup() -> tuple[int, Path] | None:
    """This process's memory cgroup directory (v2 preferred), read from /proc and /sys
    directly (not through the code under test)."""
    entries = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    for hid, _controllers, path in entries:
        d = Path("/sys/fs/cgroup", path.lstrip("/"))
        if hid == "0" and (d / "memory.max").exists():
            return 2, d
    for _hid, controllers, path in entries:
        d = Path("/sys/fs/cgroup/memory", path.lstrip("/"))
        if "memory" in controllers.split(",") and (d / "memory.limit_in_bytes").exists():
            return 1, d
    return None


@contextlib.contextmanager
def memory_cgroup(limit_mb: int) -> Iterator[Path]:
    """A child memory cgroup with a real limit, removed afterwards; skips saying why if this
    machine does not let the test make one."""
    found = _own_memory_cgroup()
    if found is None:
        pytest.skip("no memory cgroup controller visible here (/proc/self/cgroup, /sys/fs/cgroup)"
                    "; the RLIMIT_AS test covers a real memory limit")
    version, parent = found
    child = parent / f"tfdist-oom-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
        if version == 2:
            (parent / "cgroup.subtree_control").write_text("+memory")
            (child / "memory.max").write_text(str(limit_mb * 2**20))
            (child / "memory.swap.max").write_text("0")
        else:
            (child / "memory.limit_in_bytes").write_text(str(limit_mb * 2**20))
    except OSError as exc:
        with contextlib.suppress(OSError):
            child.rmdir()
        pytest.skip(f"cannot make a memory cgroup with a limit here ({exc}; needs root and a "
                    f"writable cgroup v{version} fs); the RLIMIT_AS test covers a real limit")
    try:
        yield child
    finally:
        # the killed kernel leaves its cgroup when it is reaped: bounded wait, then remove
        def removed() -> bool:
            try:
                child.rmdir()
            except FileNotFoundError:
                return True
            except OSError:
                return False
            return True

        wait_for(removed, 30, f"removing the test cgroup {child}")


def test_a_task_oom_killed_under_a_cgroup_limit_is_reported_as_out_of_memory(
        tmp_path: Path) -> None:
    with memory_cgroup(LIMIT_MB) as cgroup:
        # the task starts inside the cgroup, as a scheduler (SLURM) would start it
        procs = cgroup / "cgroup.procs"
        wrapper = tmp_path / "python-in-cgroup"
        wrapper.write_text(f"#!/bin/sh\necho $$ > {procs} || exit 97\n"
                           f"exec {sys.executable} \"$@\"\n")
        wrapper.chmod(0o755)
        with Cluster(workers=1, python=str(wrapper), preload=()) as c:
            pid = c.status()["pid"].iloc[0]
            assert str(pid) in procs.read_text().split()
            result = c.run(GROW_UNTIL_KILLED, timeout=120)
            dead = result.tasks["worker:0"]
            assert dead.status == "crashed", result.summary()
            assert dead.error.evalue == "worker:0 killed by SIGKILL (likely out of memory)"
            first = dead.explanation.splitlines()[0]
            # the controller read the cgroup after the death: its OOM kill count rose
            assert first.startswith("worker:0 killed by SIGKILL: likely out of memory (the OOM "
                                    "killer killed 1 process(es) of its memory cgroup after "
                                    "its last sample"), dead.explanation
            assert f"its cgroup memory limit is {LIMIT_MB} MB" in first
            last = samples(c, "worker:0")[-1]
            assert last["mem_limit_source"] == "cgroup"
            assert last["mem_cgroup"] == str(cgroup)
            # read after the death, the kill count of its cgroup rose: the strongest evidence
            kills = read_oom_kills(last["mem_cgroup"])
            assert kills is not None and kills > (last["oom_kills"] or 0)
            evidence = likely_oom(-9, last, {"oom_kills": kills})
            assert evidence is not None
            assert evidence.startswith("the OOM killer killed 1 process(es) of its memory cgroup "
                                       f"after its last sample; its cgroup memory limit is "
                                       f"{LIMIT_MB} MB")


RLIMIT_THEN_GROW = """
import resource, psutil
limit = psutil.Process().memory_info().vms + 200 * 2**20
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
print("limit_mb", round(limit / 2**20), flush=True)
hoard = []
while True:
    hoard.append(b"\\x01" * (16 * 2**20))
"""


def test_memory_error_under_an_address_space_limit_is_said_with_the_limit() -> None:
    with Cluster(workers=1, preload=()) as c:
        notes: list[TaskNote] = []
        result = c.run(RLIMIT_THEN_GROW, timeout=60,
                       on_event=lambda e: notes.append(e) if isinstance(e, TaskNote) else None)
        task = result.tasks["worker:0"]
        assert task.status == "error" and task.error.ename == "MemoryError"
        limit_mb = int(task.stdout.split("limit_mb")[1].split()[0])
        said = [n.text for n in notes if "ran out of memory" in n.text]
        # said in the cell itself (before it returned), and kept as an alert
        assert len(said) == 1, [n.text for n in notes]
        assert said[0].startswith(f"ran out of memory (MemoryError) against its address-space "
                                  f"limit (RLIMIT_AS) of {limit_mb} MB ("), said[0]
        assert any(a == f"worker:0: {said[0]}" for a in c.alerts())
        # the task is alive, and its samples name the limit it runs under
        assert c.run("del hoard; print('alive')").tasks["worker:0"].stdout.strip() == "alive"
        last = wait_for(lambda: [s for s in samples(c, "worker:0")
                                 if s.get("mem_limit_source") == "rlimit"], 10,
                        "a sample naming the RLIMIT_AS limit")[-1]
        assert round(last["mem_limit_mb"]) == limit_mb
        # an error that is not about memory says nothing of the kind
        before = len(c.alerts())
        assert c.run("raise ValueError('not memory')").tasks["worker:0"].status == "error"
        assert not [a for a in c.alerts()[before:] if "out of memory" in a]


def test_cgroup_reading_follows_the_limit_of_an_ancestor(tmp_path: Path) -> None:
    """cgroup v2 parsing, on a copy of the files a v2 host has (this machine's memory cgroup is
    v1, read by the test above): /proc/self/cgroup, mountinfo and the cgroup directories."""
    from tfdist_nb.worker.memory_limits import CgroupMemory

    proc = tmp_path / "proc"
    proc.mkdir()
    fs = tmp_path / "cgroup"
    job = fs / "system.slice" / "slurm" / "job_7"
    step = job / "step_0"
    step.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/system.slice/slurm/job_7/step_0\n")
    (proc / "mountinfo").write_text(
        f"31 23 0:28 / {fs} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    (step / "memory.max").write_text("max\n")
    (step / "memory.current").write_text(str(50 * 2**20))
    (step / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    (job / "memory.max").write_text(str(2048 * 2**20))
    (job / "memory.current").write_text(str(1900 * 2**20))
    found = CgroupMemory.find(str(proc))
    assert found is not None and found.version == 2
    assert found.read() == {"path": str(step), "limit_mb": 2048.0, "used_mb": 1900.0,
                            "oom_kills": 1}
    # a task whose cgroup path the mount does not show has no reading
    (proc / "cgroup").write_text("0::/elsewhere\n")
    (proc / "mountinfo").write_text(f"31 23 0:28 /system.slice {fs} rw - cgroup2 cgroup2 rw\n")
    assert CgroupMemory.find(str(proc)) is None


def test_a_spare_is_not_started_into_a_containers_limit_the_host_has_room_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Binder's 2 GB with 1.9 GB used, on a host with plenty free: what is left is the
    container's 148 MB, and the spare pool starts nothing (it used to read the host's)."""
    import psutil

    from tfdist_nb.cluster.spares import SparePool
    from tfdist_nb.worker.memory_limits import TF_TASK_MB as TASK_MB
    from tfdist_nb.worker.memory_limits import CgroupMemory, available_mb

    group = tmp_path / "binder"
    group.mkdir()
    (group / "memory.max").write_text(str(2048 * 2**20))
    (group / "memory.current").write_text(str(1900 * 2**20))
    monkeypatch.setattr(CgroupMemory, "find", classmethod(
        lambda cls, proc_self="/proc/self": cls(2, group, group)))
    host_mb = psutil.virtual_memory().available / 2**20
    assert available_mb() == min(host_mb, 148.0)
    said: list[str] = []
    pool = SparePool.__new__(SparePool)  # the memory rule alone, no cluster
    pool._said, pool._note, pool.skipped = set(), lambda text, level="INFO": said.append(text), None
    assert not pool._memory_allows()
    assert said == [f"no spare started: {min(host_mb, 148.0):.0f} MB available, a spare would "
                    f"leave less than the {TASK_MB} MB one TensorFlow "
                    "task needs"]
    monkeypatch.setattr(CgroupMemory, "find", classmethod(lambda cls, proc_self="": None))
    assert available_mb() == pytest.approx(psutil.virtual_memory().available / 2**20, rel=0.2)


def test_the_telemetry_of_this_process_reads_its_real_memory_cgroup() -> None:
    """Whatever this machine is, the reading matches /sys read directly."""
    from tfdist_nb.worker.memory_limits import CgroupMemory

    found = _own_memory_cgroup()
    reading = CgroupMemory.find()
    if found is None:
        assert reading is None
        return
    assert reading is not None and reading.directory == found[1]
    values = reading.read()
    assert values["oom_kills"] is not None and values["oom_kills"] >= 0
    assert values["used_mb"] is not None and values["used_mb"] > 0


def test_memory_errors_are_said_with_the_limit_they_hit() -> None:
    """The wording, on readings of each kind (pure)."""
    sample = {"mem_limit_mb": 2048.0, "mem_limit_source": "rlimit", "mem_limit_used_mb": 2040.0}
    assert out_of_memory_error("MemoryError", "", sample) == (
        "ran out of memory (MemoryError) against its address-space limit (RLIMIT_AS) of 2048 MB "
        "(2040 MB of address space in use after the error)")
    oom = "OOM when allocating tensor with shape[1000,1000] on /job:worker/device:CPU:0"
    assert out_of_memory_error("ResourceExhaustedError", oom, {
        "host_mem_total_mb": 24000.0, "host_mem_available_mb": 300.0}) == (
        "ran out of memory (ResourceExhaustedError) with no memory limit of its own; the host "
        "has 300 MB of 24000 MB free")
    gpu_oom = "OOM when allocating tensor on /job:worker/replica:0/task:0/device:GPU:0"
    # a GPU's is the controller's to explain, with every task's GPUs (tests/test_gpu_evidence.py)
    assert out_of_memory_error("ResourceExhaustedError", gpu_oom, {"gpus": [
        {"index": 0, "mem_used_mb": 140000.0, "mem_total_mb": 143771.0}]}) is None
    assert out_of_memory_error("ValueError", "OOM", sample) is None
    assert out_of_memory_error("ResourceExhaustedError", "too many open files", sample) is None
