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


def test_an_oom_kill_counted_after_the_last_sample_is_the_strongest_evidence() -> None:
    last = {"rss_mb": 120.0, "host_mem_total_mb": 24000.0, "host_mem_available_mb": 20000.0,
            "mem_limit_mb": 4096.0, "mem_limit_source": "cgroup", "mem_limit_used_mb": 900.0,
            "oom_kills": 2}
    # a sudden allocation between samples: only the count read after the death tells
    assert likely_oom(KILL, last) is None
    assert likely_oom(KILL, last, {"oom_kills": 2}) is None  # nothing counted since
    assert likely_oom(KILL, last, {"oom_kills": 3}) == (
        "the OOM killer killed 1 process(es) of its memory cgroup after its last sample; its "
        "cgroup memory limit is 4096 MB, 900 MB in use at its last sample")
    assert likely_oom(-signal.SIGSEGV, last, {"oom_kills": 3}) is None


def test_a_cgroup_near_its_limit_counts_an_address_space_limit_does_not() -> None:
    near = {"rss_mb": 500.0, "host_mem_total_mb": 24000.0, "host_mem_available_mb": 20000.0,
            "mem_limit_mb": 1000.0, "mem_limit_used_mb": 950.0}
    assert likely_oom(KILL, {**near, "mem_limit_source": "cgroup"}) == (
        "its memory cgroup used 950 MB of its 1000 MB limit at its last sample")
    # RLIMIT_AS fails allocations (MemoryError); it never sends a SIGKILL
    assert likely_oom(KILL, {**near, "mem_limit_source": "rlimit"}) is None



PROFILER = ["I0000 profiler_session.cc:117] Profiler session initializing.",
            "I0000 profiler_session.cc:132] Profiler session started.",
            "W0000 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized",
            "I0000 profiler_session.cc:81] Profiler session collecting data."]


def test_a_signal_inside_a_profiler_capture_is_said_to_be_tensorflows_profiler() -> None:
    # the last lines of a task TF 2.21's profiler killed in CI (SIGSEGV while collecting)
    text = crash_report("worker:1", -signal.SIGSEGV, None, PROFILER, [])
    assert text.splitlines()[0] == "worker:1 killed by SIGSEGV."
    assert ("It died inside TensorFlow's profiler, during a %tfdist_profile capture (its last "
            "profiler line: 'Profiler session collecting data'") in text
    # the abort's own line comes on the process log (stderr), after the session started
    aborted = crash_report("worker:0", -signal.SIGABRT, None, PROFILER[:2],
                           ["free(): invalid pointer"])
    assert "its last profiler line: 'Profiler session started'" in aborted


def test_a_crash_after_the_capture_ended_or_an_exit_is_not_blamed_on_the_profiler() -> None:
    ended = [*PROFILER, "I0000 profiler_session.cc:164] Profiler session tear down.", "step 9"]
    said = "died inside TensorFlow's profiler"
    assert said not in crash_report("worker:1", -signal.SIGSEGV, None, ended, [])
    assert said not in crash_report("worker:1", 1, None, PROFILER, [])
    assert said not in crash_report("worker:1", -signal.SIGSEGV, None, ["step 9"], [])
