"""Classifying a dead task (pure)."""

from __future__ import annotations

import signal

from tfdist_nb.diagnostics.crash import crash_report, describe_exit, likely_oom

KILL = -signal.SIGKILL


def test_exit_descriptions() -> None:
    assert describe_exit(KILL) == "killed by SIGKILL"
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert describe_exit(3) == "exited with code 3"


def test_sigkill_with_memory_evidence_is_likely_oom() -> None:
    big = {"rss_mb": 20000.0, "host_mem_total_mb": 24000.0, "host_mem_available_mb": 900.0}
    assert likely_oom(KILL, big) == "its last RSS was 20000 MB of 24000 MB on the host, 900 MB free"
    host_full = {"rss_mb": 900.0, "host_mem_total_mb": 24000.0, "host_mem_available_mb": 1000.0}
    assert likely_oom(KILL, host_full) is not None


def test_sigkill_without_evidence_or_other_exits_are_not_called_oom() -> None:
    calm = {"rss_mb": 700.0, "host_mem_total_mb": 24000.0, "host_mem_available_mb": 20000.0}
    assert likely_oom(KILL, calm) is None
    assert likely_oom(KILL, None) is None
    assert likely_oom(-signal.SIGSEGV, {"rss_mb": 23000.0, "host_mem_total_mb": 24000.0}) is None


def test_report_has_the_evidence() -> None:
    text = crash_report("worker:1", KILL, {"rss_mb": 650.0, "cpu_percent": 97.0},
                        ["step 19", "step 20"], ["Fatal Python error"])
    assert text.splitlines()[0] == "worker:1 killed by SIGKILL."
    assert "RSS 650 MB, CPU 97%" in text
    assert "step 20" in text and "Fatal Python error" in text
