"""Finding the straggler from arrival times (pure)."""

from __future__ import annotations

from tfdist_nb.diagnostics.straggler import find_stragglers


def rows(lag_s: float, n: int = 20, step_ms: float = 50.0) -> list[list[float | None]]:
    return [[i, 100.0 + i + lag_s, step_ms, 1.0, 100.0 + i + lag_s] for i in range(1, n + 1)]


def test_the_task_that_arrives_last_step_after_step_is_the_straggler() -> None:
    found = find_stragglers({"worker:0": rows(0.0), "worker:1": rows(0.03),
                             "worker:2": rows(0.001)})
    assert [f.task for f in found] == ["worker:1"]
    assert round(found[0].lag_ms) == 30 and found[0].last_fraction == 1.0
    assert "worker:1 is a straggler" in str(found[0])


def test_small_jitter_is_not_a_straggler() -> None:
    assert find_stragglers({"worker:0": rows(0.0), "worker:1": rows(0.002)}) == []


def test_a_steady_lag_of_a_few_ms_on_short_steps_is_scheduler_noise_not_a_straggler() -> None:
    """A busy 2-core host: worker:1 arrives 2.5 ms late in every 5 ms step (half the step, so
    the ratio alone would flag it); under MIN_LAG_MS it is not worth a user's look."""
    short = {"worker:0": rows(0.0, step_ms=5.0), "worker:1": rows(0.0025, step_ms=5.0)}
    assert find_stragglers(short) == []
    late = {"worker:0": rows(0.0, step_ms=5.0), "worker:1": rows(0.012, step_ms=5.0)}
    assert [f.task for f in find_stragglers(late)] == ["worker:1"]


def test_too_few_steps_or_one_task_say_nothing() -> None:
    assert find_stragglers({"worker:0": rows(0.0, n=5), "worker:1": rows(0.5, n=5)}) == []
    assert find_stragglers({"worker:0": rows(0.0)}) == []


def test_evidence_names_cpu_contention_and_gpu_throttling() -> None:
    """GPU readings here come from the fake-NVML shapes (no GPU on this machine)."""
    from tfdist_nb.diagnostics.straggler import evidence

    latest = {"cpu_percent": 35.0, "load1": 3.9, "cpus": 2,
              "gpus": [{"index": 1, "sm_clock_mhz": 1480.0, "temperature_c": 87.0,
                        "throttle": ["hw_thermal_slowdown"]}]}
    text = evidence(latest, 210.0)
    assert text == ("its input wait 210 ms; its CPU 35%; host load 3.9 on 2 cores; its GPU 1 "
                    "at 1480 MHz, hw thermal slowdown, 87 C")
    assert "GPU" not in evidence({"cpu_percent": 5.0, "load1": 0.2, "cpus": 2, "gpus": None},
                                 None)


def test_a_slow_local_fetch_is_named_as_the_cause() -> None:
    from tfdist_nb.diagnostics.straggler import evidence, input_bound

    latest = {"cpu_percent": 20.0, "load1": 0.5, "cpus": 2}
    text = evidence(latest, 398.0, local_fetch_ms=395.0, others_fetch_ms=[0.4])
    assert text.startswith("cause: its input pipeline - its own tf.data fetch takes 395 ms per "
                           "batch against 0 ms on the other tasks")
    assert not input_bound(3.0, [0.5])  # a few ms is noise
    assert not input_bound(50.0, [40.0])  # everyone's pipeline is slow: not this task's fault
    assert not input_bound(None, [1.0])


def test_lateness_at_a_later_collective_counts() -> None:
    """Both tasks fetch together (first stamp), worker:1 enters the gradient all-reduce 80 ms
    late (second stamp), then both finish together (third): the others waited 80 ms for it."""
    def stamped(late_s: float) -> list[list[object]]:
        return [[i, 10.0 * i, 120.0, 1.0, 10.0 * i, 0.5,
                 [10.0 * i, 10.0 * i + 0.02 + late_s, 10.0 * i + 0.11]] for i in range(1, 21)]

    found = find_stragglers({"worker:0": stamped(0.0), "worker:1": stamped(0.08)})
    assert [f.task for f in found] == ["worker:1"] and round(found[0].lag_ms) == 80
    assert find_stragglers({"worker:0": stamped(0.0), "worker:1": stamped(0.001)}) == []
