"""The SLURM job as SLURM reports it: its state, pending reason and end, in SLURM's words.

Read with SLURM's own tools as configured (``squeue``; ``sacct`` or ``scontrol`` once it ended)
and its ``*** JOB ... ***`` output lines; driven by :mod:`.slurm` (docs/remote.md, SLURM).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tfdist_nb.topology import TaskId

#: Job states after which no task of the job runs (squeue/sacct/scontrol spelling); GONE: SLURM
#: no longer knows the job. COMPLETING: its processes are being ended (the final state follows).
FINAL = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                   "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT", "GONE"})
ENDED = FINAL | {"COMPLETING"}
#: Pending reasons that waiting does not cure: the request exceeds what the partition, QOS or
#: account allows or has, so the start fails at once instead of running into its timeout.
NEVER_STARTS = re.compile(r"PartitionNodeLimit|PartitionTimeLimit|PartitionConfig|"
                          r"BadConstraints|InvalidAccount|InvalidQOS|AccountNotAllowed|"
                          r"DependencyNeverSatisfied|QOSMax\w*PerJob\w*|AssocMax\w*PerJob\w*|"
                          r"MaxCpuPerAccount|JobHeldAdmin")
#: A few pending reasons in words (SLURM's squeue man page, "JOB REASON CODES").
REASONS = {
    "Resources": "waiting for resources (nodes, CPUs, GPUs) to become free",
    "Priority": "jobs of higher priority are queued ahead of it",
    "Dependency": "waiting for a job it depends on",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "ReqNodeNotAvail": "a node it requires is not available (down, drained or reserved)",
    "Reservation": "waiting for its reservation",
    "BeginTime": "its earliest start time has not come",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "PartitionNodeLimit": "it asks for more nodes than its partition has or allows",
    "PartitionTimeLimit": "its time limit exceeds its partition's",
    "PartitionConfig": "its partition cannot satisfy the request (nodes, CPUs, memory)",
    "BadConstraints": "its constraints cannot be satisfied",
    "InvalidAccount": "its account is invalid",
    "InvalidQOS": "its QOS is invalid",
    "DependencyNeverSatisfied": "a job it depends on can never satisfy the dependency",
}
#: A few job states in words (squeue's man page, "JOB STATE CODES").
STATES = {
    "COMPLETING": "its processes are being ended",
    "NODE_FAIL": "a node of the job failed",
    "TIMEOUT": "it reached its time limit",
    "PREEMPTED": "it was preempted",
    "OUT_OF_MEMORY": "it ran out of memory",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "it reached its deadline",
    "GONE": "SLURM no longer knows the job",
}
#: SLURM's own one-line announcements in job output: ``*** JOB 7 ON n1 CANCELLED AT ... ***``.
_STAR_LINE = re.compile(r"\*\*\* (?:JOB|STEP) .* \*\*\*")
_STATE_FORMAT = "%i|%T|%r|%S|%N|%M"


@dataclass
class JobState:
    """What SLURM says about the job (``state`` GONE: SLURM no longer knows it)."""

    state: str
    reason: str = ""
    start: str = ""  # squeue's %S: the expected start while pending, the start once running
    nodes: str = ""
    exit_code: str = ""
    source: str = "squeue"
    announcements: list[str] = field(default_factory=list)  # *** JOB ... CANCELLED AT ... ***

    @property
    def ended(self) -> bool:
        """No task of the job runs any more, or they are being ended."""
        return self.state.split()[0] in ENDED

    @property
    def final(self) -> bool:
        return self.state.split()[0] in FINAL

    def words(self, job_id: str) -> str:
        """``SLURM job 7 CANCELLED (...)``: the state and everything SLURM said with it."""
        text = f"SLURM job {job_id} {self.state}"
        if self.state in STATES:
            text += f" ({STATES[self.state]})"
        reason = self.reason if self.reason not in ("", "None", "(null)") else ""
        if reason:
            text += f" ({reason}" + (f": {REASONS[reason]}" if reason in REASONS else "") + ")"
        if self.exit_code and self.exit_code not in ("0:0",):
            text += f", exit code {self.exit_code}"
        if self.state == "PENDING" and self.start and self.start not in ("N/A", "Unknown"):
            text += f", expected to start at {self.start}"
        if self.state == "RUNNING" and self.nodes:
            text += f" on {self.nodes}"
        if self.announcements:
            text += "; " + "; ".join(self.announcements)
        return text


def slurm_tool(argv: list[str], timeout: float = 15.0,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """One run of a SLURM tool; no answer or no tool is a failed run (124, 127) saying why."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False,
                              env=dict(env) if env is not None else None)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]}: no answer in {timeout}s")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: {exc.strerror}")


class SlurmJob:
    """One submitted job: its id, its directory, and the latest state SLURM gave for it."""

    def __init__(self, job_id: str, directory: Path, tasks: Sequence[TaskId]) -> None:
        self.id = job_id
        self.dir = directory
        self.tasks = list(tasks)
        self.state = JobState("PENDING", "None", source="sbatch")
        self.submitted = time.monotonic()
        self.tool_error = ""  # the last error of squeue (the controller unreachable, say)

    @property
    def output(self) -> Path:
        return self.dir / f"slurm-{self.id}.out"

    def task_log(self, task: TaskId) -> Path:
        return self.dir / f"task-{self.tasks.index(task)}.log"

    def query(self) -> JobState:
        """SLURM's current word on the job; an unreachable controller keeps the last one."""
        proc = slurm_tool(["squeue", "-h", "--states=all", "-j", self.id, "-o", _STATE_FORMAT])
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(f"{self.id}|")), "")
        if proc.returncode == 0 and line:
            _, state, reason, start, nodes, _elapsed = (line.split("|") + [""] * 6)[:6]
            found = JobState(state, reason, start, nodes)
            if found.ended:
                found = self._after_end(found)
        elif proc.returncode == 0 or "Invalid job id" in proc.stderr:
            found = self._after_end(JobState("GONE", "", source="squeue"))
        else:
            self.tool_error = (proc.stderr or proc.stdout).strip()
            return self.state
        self.tool_error = ""
        self.state = found
        return found

    def _after_end(self, seen: JobState) -> JobState:
        """The ended job's state, reason and exit code: sacct when accounting is on, else
        scontrol (which knows the job for MinJobAge after its end)."""
        found = seen
        proc = slurm_tool(["sacct", "-n", "-P", "-X", "-j", self.id, "-o", "State,Reason,ExitCode,"
                      "NodeList"])
        rows = [r.split("|") for r in proc.stdout.splitlines() if r.count("|") >= 3]
        if proc.returncode == 0 and rows:
            state, reason, code, nodes = rows[0][:4]
            found = JobState(state, reason, seen.start, nodes or seen.nodes, code, "sacct")
        else:
            proc = slurm_tool(["scontrol", "show", "job", "-o", self.id])
            # its Key=Value pairs (values have no spaces but Command=...)
            info = (dict(re.findall(r"(\w[\w/:]*)=(\S*)", proc.stdout)) if proc.returncode == 0
                    else {})
            if info.get("JobState"):
                found = JobState(info["JobState"], info.get("Reason", ""), seen.start,
                                 info.get("NodeList", seen.nodes), info.get("ExitCode", ""),
                                 "scontrol")
        if seen.state == "COMPLETING" and not found.ended:
            found.state = "COMPLETING"
        found.announcements = self.announcements()
        return found

    def announcements(self) -> list[str]:
        """SLURM's ``*** JOB 7 ON node CANCELLED AT ... ***`` lines in the job's output files."""
        said: list[str] = []
        for path in [self.output, *(self.task_log(t) for t in self.tasks)]:
            with contextlib.suppress(OSError):
                for m in _STAR_LINE.finditer(file_tail(path, 16384)):
                    if m.group(0) not in said:
                        said.append(m.group(0))
        return said[:3]


def file_tail(path: Path, size: int) -> str:
    """The last ``size`` bytes of ``path`` as text (a job's output can be large)."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - size))
        return f.read().decode("utf-8", "replace")
