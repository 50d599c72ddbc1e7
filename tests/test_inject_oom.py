"""The ``oom`` teaching fault with ``--at-step`` (issue 41): it sets the task's own limit when
armed, but grows only when the task's training reaches that step, so the task dies in the
training cell and never while it is idle between cells (notebook 09's race). Without
``--at-step`` it grows at once, as before (notebook 10's parameter-server worker runs no steps
of its own). No kernels: the fault runs in a plain subprocess, which it kills."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)


def test_oom_at_a_step_waits_for_that_step_then_dies_in_it() -> None:
    ran = run("""
        import threading, time
        from tfdist_nb.worker import inject
        print(inject.set_fault("oom", {"limit_mb": 96, "at_step": 3}), flush=True)
        assert inject.mem_limit_mb is not None          # the limit is there from the start
        assert inject._oom_thread is None               # but nothing grows yet
        time.sleep(1.0)                                 # idle: a second is plenty to die in
        print("alive while idle", flush=True)
        for step in range(10):
            inject.before_step(step)
            print("step", step, "ran", flush=True)
        print("survived", flush=True)
    """)
    assert ran.returncode == -signal.SIGKILL, ran.stdout + ran.stderr
    assert "oom armed" in ran.stdout and "alive while idle" in ran.stdout
    assert "step 2 ran" in ran.stdout and "step 3 ran" not in ran.stdout  # killed in step 3
    assert "survived" not in ran.stdout


def test_oom_at_a_step_cleared_before_that_step_does_nothing() -> None:
    ran = run("""
        from tfdist_nb.worker import inject
        inject.set_fault("oom", {"limit_mb": 96, "at_step": 3})
        inject.clear()
        for step in range(5):
            inject.before_step(step)
        print("survived", flush=True)
    """)
    assert ran.returncode == 0 and "survived" in ran.stdout, ran.stdout + ran.stderr


def test_oom_without_a_step_grows_at_once_as_before() -> None:
    ran = run("""
        import time
        from tfdist_nb.worker import inject
        inject.set_fault("oom", {"limit_mb": 96})
        print("armed", flush=True)
        time.sleep(30)                                  # never runs a step
        print("survived", flush=True)
    """)
    assert ran.returncode == -signal.SIGKILL, ran.stdout + ran.stderr
    assert "armed" in ran.stdout and "survived" not in ran.stdout
