"""The worker's telemetry thread: heartbeats, resource samples and step records, once a second.

It publishes on the kernel's own iopub socket (signed with the kernel's key, on the same loopback
or tunnelled channel as the output), from its own thread, so it keeps flowing while the main
thread is blocked inside a TensorFlow op — a stuck collective is exactly when it is needed.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tfdist_nb.samples import (
    GpuReading,
    MemoryReading,
    Note,
    Resources,
    Sample,
    StepRow,
    TelemetryMessage,
)
from tfdist_nb.worker import state
from tfdist_nb.worker.memory_limits import CgroupMemory

if TYPE_CHECKING:
    from tfdist_nb.worker.gpu import GpuSampler
    from tfdist_nb.worker.ledger import Ledger

logger = logging.getLogger(__name__)

MSG_TYPE = "tfdist_telemetry"
MAX_STEPS_PER_MESSAGE = 2000
# Near its memory limit a task is sampled this often, so its last sample before an OOM kill
# shows how close it was (docs/design.md, "Telemetry on the kernel's own iopub").
NEAR_LIMIT_FRACTION = 0.75
NEAR_LIMIT_INTERVAL_S = 0.1
# A collective still open this long after it was entered goes out at once, in a ledger-only
# message, so the hang rules see a task waiting within about half a second (docs/reference.md,
# "Collectives and hangs").
LEDGER_TICK_S = 0.25
LEDGER_WAIT_S = 0.2
INTERVAL_ENV = "TFDIST_TELEMETRY_INTERVAL"  # read by the tasks, set or checked by the controller
MIN_TELEMETRY_INTERVAL_S = 0.05  # below it the telemetry thread would starve the kernel


def telemetry_interval(text: str | None) -> float:
    """Seconds between heartbeats from ``$TFDIST_TELEMETRY_INTERVAL`` (default 1.0); ValueError
    below MIN_TELEMETRY_INTERVAL_S or not finite (the controller checks it before any start)."""
    if text is None or text == "":
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= MIN_TELEMETRY_INTERVAL_S or value == float("inf"):
        raise ValueError(f"{INTERVAL_ENV}={text!r}: must be a number of seconds, "
                         f"at least {MIN_TELEMETRY_INTERVAL_S} (default 1.0)")
    return value


class Telemetry:
    def __init__(self, send: Callable[[TelemetryMessage], object], interval_s: float = 1.0,
                 gpu: GpuSampler | None = None) -> None:
        self._send = send
        self.interval_s = interval_s
        self._gpu = gpu
        # [step, begin, duration_ms, input_wait_ms, arrival, local_fetch_ms, sync_entries]
        self._steps: collections.deque[StepRow] = collections.deque()
        self._notes: list[Note] = []
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._last_resources: Resources | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="tfdist-telemetry", daemon=True)
        self._proc: Any = None
        self._net: tuple[float, int, int] | None = None
        self._cgroup: CgroupMemory | None = None
        self._net_scope = "host"
        self._xids_said: set[tuple[str | int, int]] = set()  # (GPU, XID code) noted already
        self.step_count = 0
        self.total_steps: int | None = None
        self.seq = 0
        self.ledger: Ledger | None = None  # the task's collective ledger, set by the agent
        #: waits until what was sent has left this process (the kernel's iopub thread took it);
        #: set by the agent. Returns False at its timeout.
        self.drained: Callable[[float], bool] | None = None

    def start(self) -> None:
        import psutil

        self._proc = psutil.Process(os.getpid())
        self._proc.cpu_percent(interval=None)
        self._cgroup = CgroupMemory.find()
        self._net_scope = net_scope()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def record_step(self, begin: float, duration_s: float, input_wait_s: float | None,
                    entry: float | None = None, fetch_s: float | None = None,
                    syncs: list[float] | None = None) -> None:
        """Called on the training thread; cheap: an append under a lock. A row is
        ``[step, begin, duration_ms, input_wait_ms, arrival, local_fetch_ms, sync_entries]``."""
        with self._lock:
            self.step_count += 1
            self._steps.append([self.step_count, begin, duration_s * 1000.0,
                                None if input_wait_s is None else input_wait_s * 1000.0,
                                begin if entry is None else entry,
                                None if fetch_s is None else fetch_s * 1000.0,
                                syncs or []])

    def note(self, text: str, level: str = "INFO", finding: str | None = None,
             facts: Mapping[str, object] | None = None) -> None:
        """A finding, sent with the next sample (within a second, or at the cell's end).
        ``finding``: its kind (``events.Finding``), so the controller never parses ``text``;
        ``facts``: what it saw, as JSON values."""
        with self._lock:
            note: Note = {"text": text, "level": level}
            if finding:
                note["finding"] = finding
            if facts:
                note["facts"] = facts
            self._notes.append(note)

    def _main(self) -> None:
        """A sample every ``interval_s``; with a memory limit the thread also looks at the
        usage every 0.1 s (one small read) and samples at that pace near the limit."""
        due = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, min(due - time.monotonic(), self._tick_s()))):
            try:
                if time.monotonic() >= due or self._near_limit():
                    self.flush()
                    due = time.monotonic() + self.interval_s
                elif self.ledger is not None and self.ledger.waiting_unsent(LEDGER_WAIT_S):
                    self.flush_ledger()
            except Exception:  # the telemetry thread must never die of one bad reading
                logger.debug("a telemetry sample failed", exc_info=True)
                self._stop.wait(self.interval_s)
                due = time.monotonic() + self.interval_s

    def _tick_s(self) -> float:
        limited = self._last_resources is not None and self._last_resources["mem_limit_mb"]
        tick = min(self.interval_s, NEAR_LIMIT_INTERVAL_S) if limited else self.interval_s
        return min(tick, LEDGER_TICK_S) if self.ledger is not None else tick

    def flush_ledger(self) -> None:
        """Send the ledger rows not yet sent, alone (no resource reading: that is a sample's)."""
        with self._flush_lock:
            ledger = self.ledger.drain() if self.ledger is not None else None
            if ledger:
                self._send({"kind": "ledger", "time": time.time(), "ledger": ledger,
                            "step": self.step_count})

    def deliver_ledger(self, timeout_s: float = 1.0) -> bool:
        """Send the ledger rows now and wait until they left: the caller is about to block
        holding the GIL (the strategy's start-up), where neither this nor the iopub thread runs."""
        self.flush_ledger()
        return self.drained(timeout_s) if self.drained is not None else False

    def _near_limit(self) -> bool:
        memory = self._memory()
        limit, used = memory["mem_limit_mb"], memory["mem_limit_used_mb"]
        return bool(limit and used is not None and used >= NEAR_LIMIT_FRACTION * limit)

    def resources(self) -> Resources:
        """A fresh resource reading (kept as the last one), e.g. right after a cell failed."""
        with self._flush_lock:
            self._last_resources = self._resources()
            return self._last_resources.copy()

    def flush_steps(self) -> None:
        """At the end of a cell: send the steps not yet sent, with the last resource reading;
        skipped when the cell made no step, so a trivial cell pays nothing."""
        with self._lock:
            pending = bool(self._steps or self._notes)
        if pending or (self.ledger is not None and self.ledger.pending()):
            self.flush(resample=False)

    def flush(self, resample: bool = True) -> None:
        """Send a sample now, with every step recorded so far."""
        with self._flush_lock:
            if resample or not self._last_resources:
                self._last_resources = self._resources()
            resources = self._last_resources
            while True:
                with self._lock:
                    steps = [self._steps.popleft()
                             for _ in range(min(len(self._steps), MAX_STEPS_PER_MESSAGE))]
                    count, more = self.step_count, bool(self._steps)
                    notes, self._notes = self._notes, []
                ledger = self.ledger.drain() if self.ledger is not None else None
                more = more or bool(ledger and ledger["more"])
                self.seq += 1
                errors = dict(state.instrumentation_errors)
                sample: Sample = {"kind": "sample", "seq": self.seq, "time": time.time(),
                                  **resources, "step": count, "total_steps": self.total_steps,
                                  "steps": steps}
                if notes:
                    sample["notes"] = notes
                if ledger:
                    sample["ledger"] = ledger
                if errors:
                    sample["instrumentation_errors"] = errors
                self._send(sample)
                if not more:
                    return

    def _resources(self) -> Resources:
        import psutil

        with self._proc.oneshot():
            cpu = self._proc.cpu_percent(interval=None)
            rss = self._proc.memory_info().rss / 2**20
            threads = self._proc.num_threads()
        now = time.monotonic()
        counters = psutil.net_io_counters()
        rx = tx = None
        if self._net is not None and now > self._net[0]:
            dt = now - self._net[0]
            rx = (counters.bytes_recv - self._net[1]) / dt / 2**20
            tx = (counters.bytes_sent - self._net[2]) / dt / 2**20
        self._net = (now, counters.bytes_recv, counters.bytes_sent)
        gpus = self._gpu.sample() if self._gpu is not None else None
        self._note_xids(gpus)
        mem = psutil.virtual_memory()
        return {"cpu_percent": cpu, "rss_mb": rss, "threads": threads,
                "host_cpu_percent": psutil.cpu_percent(interval=None),
                "load1": os.getloadavg()[0], "cpus": os.cpu_count(),
                "host_mem_total_mb": mem.total / 2**20,
                **self._memory(rss),
                "host_mem_available_mb": mem.available / 2**20,
                # /proc/net/dev counts the task's network namespace: its own, or the host's
                "net_rx_mb_s": rx, "net_tx_mb_s": tx, "net_scope": self._net_scope,
                "gpus": gpus, "gpu_reason": getattr(self._gpu, "reason", None)}

    def _note_xids(self, gpus: list[GpuReading] | None) -> None:
        """An XID the driver reported on one of this task's GPUs is said at once, once, as a
        WARNING (``Finding.GPU_XID``): the errors that follow it are the GPU's, not the code's
        (docs/reference.md, "GPU readings")."""
        from tfdist_nb.events import Finding
        from tfdist_nb.worker.gpu import PROGRAM_XIDS, describe_xid

        for gpu in gpus or ():
            for code in gpu.get("xid") or ():
                key = (gpu.get("uuid") or gpu.get("index"), code)
                if key in self._xids_said:
                    continue
                self._xids_said.add(key)
                then = ("CUDA_LAUNCH_BLOCKING=1 names the kernel that ran" if code in PROGRAM_XIDS
                        else "a GPU that keeps reporting it needs its host's attention (reset, "
                        "drain or replace it); restart the tasks on other GPUs meanwhile")
                self.note(f"GPU {gpu.get('index')} ({gpu.get('uuid')}) reported "
                          f"{describe_xid(code)}; the host's kernel log (dmesg) has the "
                          f"driver's line; {then}", "WARNING", Finding.GPU_XID)

    def _memory(self, rss_mb: float | None = None) -> MemoryReading:
        """The memory limit on this task and what it counts against it: "injected"
        (``%tfdist_inject oom``, against RSS), else the smaller of "cgroup" (against that
        cgroup's usage) and "rlimit" (RLIMIT_AS, against the address space)."""
        from tfdist_nb.worker import inject

        cg = self._cgroup.read() if self._cgroup is not None else {}
        out: MemoryReading = {"mem_limit_mb": None, "mem_limit_source": None,
                              "mem_limit_used_mb": None, "oom_kills": cg.get("oom_kills"),
                              "mem_cgroup": cg.get("path")}
        if inject.mem_limit_mb is not None:
            rss = rss_mb if rss_mb is not None else self._proc.memory_info().rss / 2**20
            return {**out, "mem_limit_mb": inject.mem_limit_mb, "mem_limit_source": "injected",
                    "mem_limit_used_mb": rss}
        limits = []
        if cg.get("limit_mb") is not None:
            limits.append((cg["limit_mb"], "cgroup", lambda: cg.get("used_mb")))
        rlimit = _rlimit_as_mb()
        if rlimit is not None:
            limits.append((rlimit, "rlimit", lambda: self._proc.memory_info().vms / 2**20))
        if limits:
            limit, source, used = min(limits, key=lambda x: x[0])
            out.update({"mem_limit_mb": limit, "mem_limit_source": source,
                        "mem_limit_used_mb": used()})
        return out


LIMIT_NAMES = {
    "cgroup": "cgroup memory limit",
    "rlimit": "address-space limit (RLIMIT_AS)",
    "injected": "own limit",
}


def out_of_memory_error(ename: str, evalue: str, sample: Resources | None) -> str | None:
    """What a task that ran out of memory without dying (MemoryError, TensorFlow's OOM
    ``ResourceExhaustedError``: how an RLIMIT_AS limit ends) ran into, from a reading taken
    right after; else None. A GPU's is the controller's to explain (``diagnostics.gpu_faults``)."""
    if not (ename == "MemoryError" or (ename == "ResourceExhaustedError" and "OOM" in evalue)):
        return None
    if "device:GPU" in evalue:
        return None
    if sample is None:  # no reading: no limit, no host figures
        return f"ran out of memory ({ename}) with no memory limit of its own"
    limit, used = sample.get("mem_limit_mb"), sample.get("mem_limit_used_mb")
    source = sample.get("mem_limit_source")
    if limit and source:
        what = "address space" if source == "rlimit" else "memory"
        text = (f"ran out of memory ({ename}) against its {LIMIT_NAMES.get(source, source)} of "
                f"{limit:.0f} MB")
        if used is not None:
            text += f" ({used:.0f} MB of {what} in use after the error)"
        return text
    total, free = sample.get("host_mem_total_mb"), sample.get("host_mem_available_mb")
    host = (f"; the host has {free:.0f} MB of {total:.0f} MB free" if total and free is not None
            else "")
    return f"ran out of memory ({ename}) with no memory limit of its own{host}"


def _rlimit_as_mb() -> float | None:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft / 2**20


def net_scope(proc: str = "/proc") -> str:
    """What the network columns measure: ``"task-netns"`` when this task has a network
    namespace of its own (not its parent's, not init's: /proc/net/dev then counts this task
    alone), ``"cluster-netns"`` when that namespace is the private network its local cluster's
    tasks share (``$TFDIST_NETNS``, set by the local launcher: it counts them all), else
    ``"host"`` (a namespace shared with other processes: the host's or a container's)."""
    try:
        mine = os.readlink(f"{proc}/self/ns/net")
    except OSError:
        return "host"
    if os.environ.get("TFDIST_NETNS") == "cluster":
        # the launcher started it there; inside that user namespace, the others' links are
        # unreadable (EACCES), so there is nothing to compare with
        return "cluster-netns"
    compared = False
    for pid in (1, os.getppid()):
        try:
            theirs = os.readlink(f"{proc}/{pid}/ns/net")
        except OSError:  # init's is often unreadable in a sandbox
            continue
        compared = True
        if theirs == mine:
            return "host"
    return "task-netns" if compared else "host"
