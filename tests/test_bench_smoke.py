"""The benchmark stays runnable: a quick run reports both tools and their ratio (not a timing)."""

from __future__ import annotations

import pytest

from bench import startup

pytestmark = pytest.mark.cluster


def test_quick_startup_benchmark_reports_both_tools(capsys: pytest.CaptureFixture[str]) -> None:
    results = startup.main(["--quick", "--workers", "1"])
    run = results["runs"][0]
    assert set(run["start_s"]) == {"tfdist_nb", "ipyparallel"}
    assert all(v > 0 for v in run["rtt_ms"].values())
    out = capsys.readouterr().out
    assert "start to TF-ready (s)" in out and "x" in out and "round trip" in out


def test_quick_training_benchmark_compares_with_plain_processes() -> None:
    from bench import training

    res = training.main(["--quick"])
    assert set(res["median_ms"]) == {"tfdist_nb", "plain"}
    assert res["ratio"] > 0


def test_quick_flood_benchmark_loses_no_line() -> None:
    from bench import flood

    res = flood.main(["--quick"])
    assert res["tfdist_nb"]["lines_lost"] == 0
    assert res["ipyparallel"]["lines_lost"] == 0
