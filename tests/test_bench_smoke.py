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
