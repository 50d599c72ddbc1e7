"""The dashboard's axes (tfdist_nb/chart_axes.py), the one home of the widget's and the lab
pane's choices: what a user must judge decides them, not the noise in the numbers."""

from __future__ import annotations

from tfdist_nb.chart_axes import BY_KEY, CHARTS, NO_GPU, WINDOW_S, x_range, y_range


def test_two_flat_lines_close_together_look_close_together() -> None:
    """The quickstart's healthy tasks: CPU 35.6 and 36.0 %, RSS 351.1 and 351.9 MB. From 0, on
    a percentage axis to 100 and a memory axis with a tenth of headroom, the gap between the
    tasks is under 1 % of each chart's height, not all of it."""
    cpu = y_range(BY_KEY["cpu"], [35.6, 36.0, 35.8])
    rss = y_range(BY_KEY["rss"], [351.1, 351.9])
    assert cpu == (0.0, 100.0)
    assert rss[0] == 0.0 and 351.9 * 1.1 <= rss[1] <= 1000.0
    assert (36.0 - 35.6) / (cpu[1] - cpu[0]) < 0.01
    assert (351.9 - 351.1) / (rss[1] - rss[0]) < 0.01


def test_percentages_reach_past_100_when_a_task_uses_several_cores() -> None:
    assert y_range(BY_KEY["cpu"], [180.0]) == (0.0, 200.0)  # two cores: 100 is one
    assert "100 = one core" in BY_KEY["cpu"].title
    assert y_range(BY_KEY["gpu"], [12.0]) == (0.0, 100.0)


def test_step_charts_start_at_zero_with_headroom() -> None:
    assert y_range(BY_KEY["step_time"], [41.0, 45.0]) == (0.0, 50.0)
    assert y_range(BY_KEY["input_wait"], [0.02]) == (0.0, 1.0)
    assert y_range(BY_KEY["step_time"], []) == (0.0, 1.0)


def test_time_charts_span_the_run_while_short_and_its_last_minutes_once_long() -> None:
    cpu = BY_KEY["cpu"]
    assert x_range(cpu, 0.0, 20.0) == (0.0, 20.0)  # a 20 s run: all of it
    assert x_range(cpu, 0.0, 0.3) == (0.0, 1.0)  # never a fraction of a second wide
    assert x_range(cpu, 0.0, 1000.0) == (1000.0 - WINDOW_S, 1000.0)
    assert x_range(BY_KEY["step_time"], 3, 40) == (3, 40)


def test_every_chart_says_why_it_is_empty() -> None:
    assert {c.key for c in CHARTS} == {"step_time", "input_wait", "cpu", "rss", "gpu"}
    assert all(c.empty and c.empty.startswith("no ") for c in CHARTS)
    assert "tw.timed" in BY_KEY["input_wait"].empty
    assert NO_GPU == "no GPU on this host"
