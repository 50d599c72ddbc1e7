"""What a dead task died of, from its exit status and its last telemetry (pure).

SIGKILL is what the kernel's OOM killer (and a cgroup memory limit) sends, so a SIGKILL with an OOM
kill counted in the task's memory cgroup, its cgroup near its limit, or its memory high or the
host's nearly exhausted in its last sample reads as "likely out of memory"; a plain SIGKILL without
that evidence is said as it is. An address-space limit (RLIMIT_AS) fails allocations instead
(MemoryError), which the task itself explains (``worker.telemetry.out_of_memory_error``).
"""

from __future__ import annotations

import signal
from typing import Any

OOM_HOST_FREE_FRACTION = 0.10
OOM_TASK_FRACTION = 0.50


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def likely_oom(code: int, last: dict[str, Any] | None,
               after: dict[str, Any] | None = None) -> str | None:
    """The memory evidence when a SIGKILL looks like the OOM killer, else None.

    ``last``: the task's last telemetry sample. ``after``: its memory cgroup read after the
    death (``{"oom_kills": N}``, e.g. from ``mem_cgroup`` on its host, or a later sample of a
    task in the same cgroup); an OOM kill count that rose since the last sample is the
    strongest evidence there is (docs/design.md, "Telemetry on the kernel's own iopub").
    """
    if code != -signal.SIGKILL or not last:
        return None
    rss, total = last.get("rss_mb"), last.get("host_mem_total_mb")
    free, limit = last.get("host_mem_available_mb"), last.get("mem_limit_mb")
    source = last.get("mem_limit_source") or "injected"  # older samples: only injected limits
    used = last.get("mem_limit_used_mb", rss)
    before, later = last.get("oom_kills"), (after or {}).get("oom_kills")
    if before is not None and later is not None and later > before:
        evidence = (f"the OOM killer killed {later - before} process(es) of its memory cgroup "
                    "after its last sample")
        if source == "cgroup" and limit:
            evidence += f"; its cgroup memory limit is {limit:.0f} MB"
            if used is not None:
                evidence += f", {used:.0f} MB in use at its last sample"
        return evidence
    if source == "injected" and rss is not None and limit and rss >= 0.8 * limit:
        return f"its last RSS was {rss:.0f} MB against its own limit of {limit:.0f} MB"
    if source == "cgroup" and used is not None and limit and used >= 0.8 * limit:
        return (f"its memory cgroup used {used:.0f} MB of its {limit:.0f} MB limit at its last "
                "sample")
    # RLIMIT_AS makes allocations fail (MemoryError), it never SIGKILLs: only host evidence
    if rss is None or not total:
        return None
    evidence = f"its last RSS was {rss:.0f} MB of {total:.0f} MB on the host"
    if free is not None:
        evidence += f", {free:.0f} MB free"
    if rss >= OOM_TASK_FRACTION * total or (free is not None
                                            and free <= OOM_HOST_FREE_FRACTION * total):
        return evidence
    return None


def in_profiler_capture(code: int, lines: list[str]) -> str | None:
    """The profiler line a task printed last, when it died of a signal between TensorFlow's
    "Profiler session started" / "collecting data" and its "tear down": the crash happened
    inside TensorFlow's own profiler while it held this task's trace (TF 2.21 does this now and
    then, SIGSEGV or ``free(): invalid pointer`` then SIGABRT), not in the user's code."""
    if code >= 0:
        return None
    for line in reversed(lines):
        if "Profiler session tear down" in line:
            return None
        for phase in ("Profiler session collecting data", "Profiler session started"):
            if phase in line:
                return phase
    return None


def crash_report(task: str, code: int, last: dict[str, Any] | None, last_lines: list[str],
                 log_tail: list[str], what: str | None = None,
                 after: dict[str, Any] | None = None) -> str:
    """``what``: how it ended, when the launcher knows better than the code (a lost SSH link);
    ``after``: its memory cgroup read after the death (see :func:`likely_oom`)."""
    what = what or describe_exit(code)
    oom = likely_oom(code, last, after)
    parts = [f"{task} {what}" + (f": likely out of memory ({oom})." if oom else ".")]
    if profiling := in_profiler_capture(code, last_lines + log_tail):
        parts.append(f"It died inside TensorFlow's profiler, during a %tfdist_profile capture "
                     f"(its last profiler line: '{profiling}', no 'tear down' after it): a "
                     "crash in TensorFlow, not in this cell's code. Restart the task "
                     "(%tfdist_restart) and run the cell again, or without the capture.")
    if last:
        gpu = last.get("gpu_mem_mb")
        parts.append(f"Last resource sample: RSS {last.get('rss_mb', 0):.0f} MB, CPU "
                     f"{last.get('cpu_percent', 0):.0f}%" + (f", GPU memory {gpu:.0f} MB"
                                                             if gpu is not None else ""))
    if last_lines:
        parts.append("Its last output lines:\n" + "\n".join(last_lines))
    if log_tail:
        parts.append("Last lines of its process log:\n" + "\n".join(log_tail))
    return "\n".join(parts)
