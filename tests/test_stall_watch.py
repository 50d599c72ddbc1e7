"""Stall detection rules (pure)."""

from __future__ import annotations

from tfdist_nb.diagnostics.stall import Progress, StallWatch


def test_no_step_no_output_no_cpu_is_a_stall() -> None:
    w = StallWatch(stall_timeout=10)
    assert not w.observe("worker:0", Progress(5, 100, 0.0, 1.0), 0.0)
    assert not w.observe("worker:0", Progress(5, 100, 0.5, 2.0), 9.0)
    assert w.observe("worker:0", Progress(5, 100, 0.3, 3.0), 10.5)
    assert w.quiet_for("worker:0", 10.5) == 10.5


def test_steps_output_or_own_cpu_count_as_progress() -> None:
    w = StallWatch(stall_timeout=10)
    w.observe("t", Progress(0, 0, 0.0, 0.0), 0.0)
    assert not w.observe("t", Progress(1, 0, 0.0, 1.0), 9.0)       # a step
    assert not w.observe("t", Progress(1, 7, 0.0, 2.0), 18.0)      # output
    assert not w.observe("t", Progress(1, 7, 99.0, 3.0), 27.0)     # numpy at 100% CPU
    assert not w.observe("t", Progress(1, 7, 99.0, 4.0), 36.0)
    assert w.observe("t", Progress(1, 7, 99.0, 4.0), 47.0)          # no fresh sample: stale


def test_tasks_are_watched_apart() -> None:
    w = StallWatch(stall_timeout=5)
    w.observe("a", Progress(0, 0, 0.0, 0.0), 0.0)
    w.observe("b", Progress(0, 0, 0.0, 0.0), 0.0)
    assert not w.observe("a", Progress(1, 0, 0.0, 1.0), 6.0)
    assert w.observe("b", Progress(0, 0, 0.0, 1.0), 6.0)


def test_a_prompt_holds_the_clock_until_it_is_answered() -> None:
    """While a task waits at an input prompt the run waits for a person: ``hold`` counts every
    task as moving, and the stall clock starts again from the answer."""
    w = StallWatch(stall_timeout=3)
    quiet = Progress(0, 0, 0.0, 0.0)
    w.observe("a", quiet, 0.0)
    for t in (2.0, 4.0, 8.0, 20.0):  # the prompt stays open far past stall_timeout
        w.hold(["a"], t)
        assert not w.observe("a", quiet, t)
    assert not w.observe("a", quiet, 22.9)  # answered at 20: quiet for 2.9 s
    assert w.observe("a", quiet, 23.0)
