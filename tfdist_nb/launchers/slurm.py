"""Tasks run as one SLURM job: ``sbatch`` submits it, each SLURM task is one cluster task.

Each SLURM task ``exec``s the worker entry point (so ``scancel`` reaches it), which announces
itself in the connection directory like an attached worker; TF_CONFIG follows where the tasks
landed (``env_at_launch = False``). One watcher thread per job asks SLURM
(:mod:`.slurm_job`). How it works and its limits: docs/remote.md, SLURM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from tfdist_nb.debuglog import swallowed
from tfdist_nb.errors import ClusterStartError, SpecError
from tfdist_nb.gpu_plan import CVD, Placement
from tfdist_nb.launchers.attach import (
    GONE,
    AttachedTaskHandle,
    AttachLauncher,
    check_connection_dir,
)
from tfdist_nb.launchers.base import (
    Launcher,
    LauncherOption,
    StopReport,
    TaskHandle,
    TaskLaunch,
)
from tfdist_nb.launchers.slurm_job import NEVER_STARTS, JobState, SlurmJob, file_tail, slurm_tool
from tfdist_nb.topology import TaskId

logger = logging.getLogger(__name__)

#: sbatch options the launcher sets itself: the task count comes from the cluster's SPEC, and
#: the output files and the script are what it reads and writes.
OWN_OPTIONS = {"--ntasks": "the cluster's SPEC sets the number of tasks",
               "--output": "the launcher keeps the job's output in the connection directory",
               "--error": "the launcher keeps the job's output in the connection directory",
               "--array": "one job runs the whole cluster", "--wrap": "the launcher writes the "
               "batch script", "--parsable": "the launcher reads the job id itself"}
OWN_SHORT = {"-n": "--ntasks", "-o": "--output", "-e": "--error", "-a": "--array"}
#: ... and the notebook's GPUs: SLURM gives the tasks theirs (docs/reference.md, GPUs)
_SCRUB_EXACT = {"TF_CONFIG", "TFDIST_TASK", "PYTEST_CURRENT_TEST", "JPY_PARENT_PID",
                "JPY_SESSION_NAME", "SLURM_CONF_IN_JOB", CVD}
STATUS_INTERVAL_S = 1.0  # between squeue calls while the job runs (one call per cluster)
STOP_WAIT_S = 15.0  # after scancel, until squeue no longer lists the job


def check_sbatch_args(args: str | Iterable[object] | None) -> list[str]:
    """``args`` as sbatch words (a string split like a shell); ValueError for an option the
    launcher sets itself."""
    if args is None:
        return []
    words = shlex.split(args) if isinstance(args, str) else [str(a) for a in args]
    for word in words:
        name = word.split("=", 1)[0]
        for short, long in OWN_SHORT.items():
            if word.startswith(short) and not word.startswith("--"):
                name = long
        if name in OWN_OPTIONS:
            raise ValueError(f"sbatch option {word!r} is not allowed: {OWN_OPTIONS[name]}")
    return words


#: Each SLURM task finds the address its node is reached at: the node name's address, unless
#: that is loopback (Debian maps a host's own name to 127.0.1.1); then the address this node
#: uses toward the batch host (SLURM_LAUNCH_NODE_IPADDR) or the submit host.
_RESOLVE = (
    "import ipaddress, os, socket, sys\n"
    "def ok(a):\n"
    "    return a and not ipaddress.ip_address(a).is_loopback\n"
    "try:\n"
    "    ip = socket.gethostbyname(sys.argv[1])\n"
    "except OSError:\n"
    "    ip = ''\n"
    "for var in ('SLURM_LAUNCH_NODE_IPADDR', 'SLURM_SUBMIT_HOST'):\n"
    "    peer = os.environ.get(var)\n"
    "    if ok(ip) or not peer:\n"
    "        continue\n"
    "    try:\n"
    "        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "        s.connect((socket.gethostbyname(peer), 9))\n"
    "        ip = s.getsockname()[0]\n"
    "    except OSError:\n"
    "        pass\n"
    "if not ok(ip):\n"
    "    sys.exit(f'tfdist_nb: no address of node {sys.argv[1]} that other nodes can reach')\n"
    "print(ip)\n"
)


def task_script(tasks: Sequence[TaskId], python: str, directory: Path) -> str:
    """What each SLURM task runs: its cluster task from ``SLURM_PROCID``, then ``exec`` of the
    worker (no fork: it stays in the job step's process tree, so scancel ends it)."""
    cases = "\n".join(f"  {i}) task={shlex.quote(str(t))} ;;" for i, t in enumerate(tasks))
    py, d = shlex.quote(python), shlex.quote(str(directory))
    return f"""#!/bin/bash
# One SLURM task of a tfdist_nb cluster (tfdist_nb.launchers.slurm): SLURM task i is cluster
# task i; the worker announces itself in {directory}.
set -u
case "${{SLURM_PROCID:-}}" in
{cases}
  *) echo "tfdist_nb: no cluster task for SLURM task ${{SLURM_PROCID:-?}}" >&2; exit 2 ;;
esac
node="${{SLURMD_NODENAME:-$(hostname)}}"
ip="$({py} -I -S -c {shlex.quote(_RESOLVE)} "$node")" || {{
  echo "tfdist_nb: {py} did not run on node $node (it needs the notebook's Python)" >&2; exit 3; }}
exec {py} -m tfdist_nb.worker --task "$task" --connection-dir {d} --ip "$ip" --tf-host "$node"
"""


def batch_script(tasks: Sequence[TaskId], directory: Path) -> str:
    """The job's batch script: one srun step running ``task.sh`` per cluster task."""
    d = shlex.quote(str(directory))
    return f"""#!/bin/bash
# tfdist_nb: cluster tasks {' '.join(map(str, tasks))} as SLURM tasks 0..{len(tasks) - 1}.
# Written by tfdist_nb.launchers.slurm; the notebook attaches to the workers and cancels the
# job when the cluster stops.
exec srun --ntasks={len(tasks)} --kill-on-bad-exit=0 --output={d}/task-%t.log \\
    /bin/bash {d}/task.sh
"""


@dataclass
class SlurmTaskHandle(AttachedTaskHandle):
    """An attached worker that is also a task of ``job``: the job's end is the task's end."""

    job: SlurmJob = field(default=None, repr=False)  # type: ignore[assignment]  # set at start

    async def poll(self) -> int | None:
        return GONE if self.job.state.ended else await super().poll()

    def describe_exit(self, code: int) -> str:
        state = self.job.state if self.job.state.final else self.job.query()
        if state.ended:
            return f"ended with its job: {state.words(self.job.id)}"
        return (f"{super().describe_exit(code)}; on node {self.host}, while "
                f"{state.words(self.job.id)}")

    async def stop(self, grace_s: float) -> StopReport:
        if self.job.state.ended:
            grace_s = min(grace_s, 0.2)  # nothing left to ask: SLURM has ended it
        return await super().stop(grace_s)


class SlurmLauncher(Launcher):
    """Submits one job whose SLURM tasks are the cluster's tasks and attaches to them."""

    name = "slurm"
    remote = True  # the interpreter path is the one the nodes run
    env_at_launch = False
    restartable = False
    gpu_placement = Placement.SCHEDULER  # --gpus-per-task N is asked of SLURM
    no_hosts = ("launcher='slurm' places tasks where SLURM allocates them; drop hosts= and ask "
                "with launcher_options={'sbatch_args': ['--nodes=2']}")
    restart_instead = ("stop the cluster and start it again (%%tfcluster --restart submits a "
                       "new job)")
    line_options = (
        LauncherOption("--sbatch", "sbatch_args", metavar='"ARGS"', parse=check_sbatch_args,
                       dashed=True,
                       help="for --launcher slurm (implied): sbatch options of the job, quoted, "
                            "e.g. --sbatch \"--partition=gpu --nodes=2 --time=1:00:00\"; "
                            "SLURM_CONF and the rest of the environment configure SLURM's tools "
                            "as usual"),
    )

    @classmethod
    def cluster_options(cls, hosts: list[str] | None, python: str | None,
                        options: dict[str, object]) -> dict[str, object]:
        super().cluster_options(hosts, python, options)
        options.setdefault("python", python or sys.executable)  # the nodes share this path
        if "sbatch_args" in options:  # checked here, before anything is submitted
            try:
                given = cast("str | Iterable[object] | None", options["sbatch_args"])  # as given
                options["sbatch_args"] = check_sbatch_args(given)
            except ValueError as exc:
                raise SpecError(f"sbatch_args: {exc}") from None
        return options

    def __init__(self, sbatch_args: str | Iterable[object] | None = None,
                 connection_dir: str | os.PathLike[str] | None = None,
                 wait_timeout: float = 100.0, python: str | None = None,
                 progress: Callable[[str], None] | None = None,
                 status_interval: float = STATUS_INTERVAL_S, **_: object) -> None:
        for tool in ("sbatch", "squeue", "scancel"):
            if shutil.which(tool) is None:
                raise ValueError(f"{tool} not found on PATH: the slurm launcher runs SLURM's "
                                 "client tools (sbatch, squeue, scancel; Debian: slurm-client)")
        self.sbatch_args = check_sbatch_args(sbatch_args)
        if wait_timeout <= 0:
            raise ValueError("wait_timeout must be positive (seconds from submission until "
                             "every task has announced itself)")
        self.base = Path(connection_dir or os.environ.get("TFDIST_RUNS_DIR")
                         or "tfdist_runs").expanduser().absolute()
        if connection_dir is not None:
            check_connection_dir(self.base)
        self.wait_timeout = float(wait_timeout)
        self.python = python or sys.executable
        self.progress = progress if progress is not None else _print
        self.status_interval = status_interval
        self.gpus_per_task: int | None = None  # asked with --gpus-per-task (ask_gpus)
        self.job: SlurmJob | None = None
        self.started: set[TaskId] = set()
        self.attach: AttachLauncher | None = None
        self._released = threading.Event()
        self._starting = False
        self._watcher: threading.Thread | None = None
        self._said_lock = threading.Lock()
        self._last_said: tuple[str, str, str] | None = None

    def line_values(self) -> dict[str, object]:
        return {"sbatch_args": list(self.sbatch_args)}

    def ask_gpus(self, per_task: int) -> bool:
        self.gpus_per_task = per_task
        return True

    def base_environment(self) -> dict[str, str]:
        """The notebook's environment, less its GPUs: SLURM's CUDA_VISIBLE_DEVICES is kept."""
        return {k: v for k, v in os.environ.items() if k != CVD}

    # ------------------------------------------------------------------ submission
    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        self._starting = True
        try:
            if self.job is not None:  # TF ports taken on a node: a fresh job draws fresh ones
                if avoid:
                    self._say(f"TF ports taken ({', '.join(f'{t} {a}' for t, a in avoid.items())}"
                              f"); cancelling SLURM job {self.job.id} and submitting another")
                self.release()
            self._released.clear()
            self.started.clear()
            job = self._submit(tasks)
            deadline = job.submitted + self.wait_timeout
            assert self.attach is not None
            missing = self.attach.wait_for(tasks, deadline, lambda m: self._watch_start(job, m))
            if missing:
                state = job.query()
                self.release()
                raise ClusterStartError(
                    f"{state.words(job.id)} after {self.wait_timeout:.0f}s (wait_timeout), and "
                    f"{', '.join(map(str, missing))} had not announced themselves in {job.dir}; "
                    f"cancelled it{self.attach.ignored_note(missing)}"
                    + (f"; squeue said: {job.tool_error}" if job.tool_error else "")
                    + _tail_note(job))
            self._report(job, job.query())  # RUNNING on its nodes, even between watcher looks
            addresses = {t: self.attach.found[t]["tf_address"] for t in tasks}
            nodes = sorted({a.rpartition(":")[0] for a in addresses.values()})
            self._say(f"SLURM job {job.id}: {len(tasks)} task(s) up on {', '.join(nodes)} "
                      f"{time.monotonic() - job.submitted:.1f}s after submission")
            return addresses
        finally:
            self._starting = False

    def _submit(self, tasks: Sequence[TaskId]) -> SlurmJob:
        directory = self.base / f"slurm-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        self.base.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.mkdir(mode=0o700)
        script = directory / "job.sh"
        for path, text in ((directory / "task.sh", task_script(tasks, self.python, directory)),
                           (script, batch_script(tasks, directory))):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        argv = ["sbatch", "--parsable", f"--job-name=tfdist-{directory.name[6:]}",
                *self.sbatch_args, f"--ntasks={len(tasks)}",
                *([f"--gpus-per-task={self.gpus_per_task}"] if self.gpus_per_task else []),
                f"--output={directory}/slurm-%j.out", str(script)]
        proc = slurm_tool(argv, timeout=60, env=_job_environment())
        job_id = proc.stdout.strip().split(";")[0]
        if proc.returncode != 0 or not job_id.isdigit():
            said = (proc.stderr or proc.stdout).strip() or f"sbatch exited {proc.returncode}"
            raise ClusterStartError(f"SLURM refused the job: {said} (submitted: "
                                    f"{shlex.join(argv[1:-1])})")
        self.job = job = SlurmJob(job_id, directory, tasks)
        self.attach = AttachLauncher(connection_dir=directory)
        for line in proc.stderr.splitlines():  # warnings: "can't run 2 processes on 3 nodes..."
            if line.strip():
                self._say(f"sbatch said: {line.strip()}")
        self._say(f"submitted SLURM job {job_id} ({len(tasks)} task(s); "
                  f"sbatch {shlex.join(self.sbatch_args) or '(no options)'}); connection "
                  f"directory {directory}")
        self._watcher = threading.Thread(target=self._watch, args=(job,), daemon=True,
                                         name=f"tfdist-slurm-{job_id}")
        self._watcher.start()
        return job

    def _watch(self, job: SlurmJob) -> None:
        """Ask SLURM every ``status_interval`` until the job ends or is released: one squeue
        call per cluster, the task handles read ``job.state``."""
        while not self._released.is_set():
            state = job.query()
            self._report(job, state)
            if state.final:
                return
            self._released.wait(self.status_interval)

    def _report(self, job: SlurmJob, state: JobState) -> None:
        """Say a state once, when it changes (the watcher and the start both look)."""
        with self._said_lock:
            seen = (job.id, state.state, state.reason)
            if seen == self._last_said:
                return
            self._last_said = seen
        self._say(state.words(job.id))

    def _watch_start(self, job: SlurmJob, missing: list[TaskId]) -> None:
        """Between looks at the directory: end the start when the job cannot bring them."""
        if self._released.is_set():
            raise ClusterStartError(f"SLURM job {job.id} was cancelled: the cluster was "
                                    "stopped while it started")
        state = job.state
        if state.ended:
            raise ClusterStartError(
                f"{state.words(job.id)} before {', '.join(map(str, missing))} announced "
                f"themselves" + _tail_note(job, task_lines=6))
        if state.state == "PENDING" and NEVER_STARTS.fullmatch(state.reason or ""):
            self.release()
            raise ClusterStartError(f"{state.words(job.id)}: it cannot start as requested "
                                    f"(sbatch {shlex.join(self.sbatch_args)}); cancelled it")

    # ------------------------------------------------------------------ tasks
    async def start(self, launch: TaskLaunch) -> TaskHandle:
        job, attach = self.job, self.attach
        info = attach.found.get(launch.task) if attach is not None else None
        if job is None or attach is None or info is None:
            raise ClusterStartError(f"{launch.task}: no SLURM task announced it")
        if job.state.ended:
            raise ClusterStartError(f"{launch.task}: {job.state.words(job.id)}")
        if launch.task in self.started:  # a retry: only SLURM could start that process again
            raise ClusterStartError(f"{launch.task}: its SLURM task cannot be started again "
                                    f"({job.query().words(job.id)})")
        self.started.add(launch.task)
        with contextlib.suppress(OSError):  # its process log is its SLURM task's output
            if not launch.log_path.exists():
                launch.log_path.symlink_to(job.task_log(launch.task))
        handle = await attach.start(launch, SlurmTaskHandle)
        assert isinstance(handle, SlurmTaskHandle)
        handle.host = str(info.get("tf_address", "")).rpartition(":")[0] or handle.host
        handle.job = job
        return handle

    def release(self) -> None:
        """Cancel the job (its steps with SIGKILL first: a TF task only logs SIGTERM) and wait
        until squeue no longer lists it. Idempotent."""
        self._released.set()
        job = self.job
        if job is None:
            return
        if not job.state.final:  # also while COMPLETING: a TF task may outlive SIGTERM
            slurm_tool(["scancel", "--signal=KILL", job.id], timeout=15)
            slurm_tool(["scancel", job.id], timeout=15)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            proc = slurm_tool(["squeue", "-h", "-j", job.id, "-o", "%T"], timeout=10)
            gone = proc.returncode == 0 and not proc.stdout.strip()
            if gone or "Invalid job id" in proc.stderr:
                break
            time.sleep(0.2)
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=5)

    def _say(self, text: str) -> None:
        """Progress while the job starts, to ``progress`` (the cell); later a task's crash
        report says what matters."""
        if self._starting:
            with swallowed(logger):
                self.progress(text)


def _print(text: str) -> None:
    print(f"tfdist_nb: {text}", flush=True)


def _tail_note(job: SlurmJob, task_lines: int = 0) -> str:
    """The last lines of the job's output (and, with ``task_lines``, of each task's)."""
    note = ""
    for path, n in [(job.output, 12), *((job.task_log(t), task_lines) for t in job.tasks)]:
        with contextlib.suppress(OSError):
            if n and (tail := file_tail(path, 16384).splitlines()[-n:]):
                note += f"\n--- last lines of {path} ---\n" + "\n".join(tail)
    return note


def _job_environment() -> dict[str, str]:
    """What sbatch exports: this environment less what would make a worker act as another
    process and the variables of a SLURM job the notebook may run in (SLURM_CONF kept)."""
    return {k: v for k, v in os.environ.items()
            if k not in _SCRUB_EXACT and (not k.startswith("SLURM_") or k == "SLURM_CONF")}
