"""What a dead task died of, from its exit status and its last telemetry (pure).

SIGKILL is what the kernel's OOM killer (and a cgroup memory limit) sends, so a SIGKILL with the
task's memory high or the host's nearly exhausted in its last sample reads as "likely out of
memory"; a plain SIGKILL without that evidence is said as it is.
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


def likely_oom(code: int, last: dict[str, Any] | None) -> str | None:
    """The memory evidence when a SIGKILL looks like the OOM killer, else None."""
    if code != -signal.SIGKILL or not last:
        return None
    rss, total = last.get("rss_mb"), last.get("host_mem_total_mb")
    free, limit = last.get("host_mem_available_mb"), last.get("mem_limit_mb")
    if rss is not None and limit and rss >= 0.8 * limit:
        return f"its last RSS was {rss:.0f} MB against its own limit of {limit:.0f} MB"
    if rss is None or not total:
        return None
    evidence = f"its last RSS was {rss:.0f} MB of {total:.0f} MB on the host"
    if free is not None:
        evidence += f", {free:.0f} MB free"
    if rss >= OOM_TASK_FRACTION * total or (free is not None
                                            and free <= OOM_HOST_FREE_FRACTION * total):
        return evidence
    return None


def crash_report(task: str, code: int, last: dict[str, Any] | None, last_lines: list[str],
                 log_tail: list[str], what: str | None = None) -> str:
    """``what``: how it ended, when the launcher knows better than the code (a lost SSH link)."""
    what = what or describe_exit(code)
    oom = likely_oom(code, last)
    parts = [f"{task} {what}" + (f": likely out of memory ({oom})." if oom else ".")]
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
