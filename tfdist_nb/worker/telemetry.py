"""The worker's telemetry thread: heartbeats, resource samples and step records, once a second.

It publishes on the kernel's own iopub socket (signed with the kernel's key, on the same loopback
or tunnelled channel as the output), from its own thread, so it keeps flowing while the main
thread is blocked inside a TensorFlow op — a stuck collective is exactly when it is needed.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

MSG_TYPE = "tfdist_telemetry"
MAX_STEPS_PER_MESSAGE = 2000


class Telemetry:
    def __init__(self, send: Callable[[dict[str, Any]], None], interval_s: float = 1.0,
                 gpu: Any = None) -> None:
        self._send = send
        self.interval_s = interval_s
        self._gpu = gpu
        self._steps: collections.deque[list[float | None]] = collections.deque()
        self._notes: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._last_resources: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="tfdist-telemetry", daemon=True)
        self._proc: Any = None
        self._net: tuple[float, int, int] | None = None
        self.step_count = 0
        self.total_steps: int | None = None
        self.seq = 0

    def start(self) -> None:
        import psutil

        self._proc = psutil.Process(os.getpid())
        self._proc.cpu_percent(interval=None)
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

    def note(self, text: str, level: str = "INFO") -> None:
        """A finding of the worker agent; it goes out with the next sample (within a second,
        or at the end of the cell)."""
        with self._lock:
            self._notes.append({"text": text, "level": level})

    def set_total(self, total: int | None) -> None:
        self.total_steps = total

    def _main(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception:  # the telemetry thread must never die of one bad reading
                time.sleep(self.interval_s)

    def flush_steps(self) -> None:
        """At the end of a cell: send the steps not yet sent, with the last resource reading.

        Cheap and skipped when the cell made no step, so a trivial cell pays nothing for it.
        """
        with self._lock:
            pending = bool(self._steps or self._notes)
        if pending:
            self.flush(resample=False)

    def flush(self, resample: bool = True) -> None:
        """Send a sample now, with every step recorded so far (the thread calls it every
        interval)."""
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
                self.seq += 1
                self._send({"kind": "sample", "seq": self.seq, "time": time.time(),
                            **resources, "step": count, "total_steps": self.total_steps,
                            "steps": steps, **({"notes": notes} if notes else {})})
                if not more:
                    return

    def _resources(self) -> dict[str, Any]:
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
        mem = psutil.virtual_memory()
        return {"cpu_percent": cpu, "rss_mb": rss, "threads": threads,
                "host_cpu_percent": psutil.cpu_percent(interval=None),
                "load1": os.getloadavg()[0], "cpus": os.cpu_count(),
                "host_mem_total_mb": mem.total / 2**20,
                "mem_limit_mb": _mem_limit_mb(),
                "host_mem_available_mb": mem.available / 2**20,
                "net_rx_mb_s": rx, "net_tx_mb_s": tx, "gpus": gpus,
                "gpu_reason": getattr(self._gpu, "reason", None)}


def _mem_limit_mb() -> float | None:
    """A memory limit on this task alone: an injected one, or RLIMIT_AS when set."""
    from tfdist_nb.worker import inject

    if inject.mem_limit_mb is not None:
        return inject.mem_limit_mb
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft / 2**20
