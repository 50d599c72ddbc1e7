"""The benchmarks stay runnable: a quick run reports every tool and the ratios (not timings)."""

from __future__ import annotations

import pytest

from bench import startup

pytestmark = pytest.mark.cluster


def test_quick_startup_benchmark_reports_all_tools(capsys: pytest.CaptureFixture[str]) -> None:
    """tfdist_nb (a first start, and the next with its fork server up), ipyparallel and
    hand-rolled jupyter_client kernels, 1 worker each."""
    results = startup.main(["--quick", "--workers", "1"])
    run = results["runs"][0]
    assert set(run["start_s"]) == {"tfdist_nb", "tfdist_nb_next", "ipyparallel",
                                   "jupyter_client"}
    assert all(v > 0 for v in run["rtt_ms"].values())
    # where each tool's start-up went, phase by phase, ending when it reported TF-ready
    assert "3 tensorflow imported (execute)" in run["phases_s"]["jupyter_client"]
    assert "3 preload imported (handshake)" in run["phases_s"]["tfdist_nb"]
    out = capsys.readouterr().out
    assert "start to TF-ready (s)" in out and "round trip" in out
    assert "ratio tfdist_nb / ipyparallel:" in out and "/ jupyter_client:" in out


def test_quick_rtt_benchmark_reports_each_size_with_ratios(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench import rtt

    res = rtt.main(["--quick", "--tasks", "1", "2", "--rtt", "5"])
    assert [r["tasks"] for r in res["runs"]] == [1, 2]
    for run in res["runs"]:
        assert set(run["rtt_ms"]) == {"tfdist_nb", "ipyparallel", "ipyparallel_silent_false",
                                      "jupyter_client"}
        assert set(run["rtt_p90_ms"]) == set(run["rtt_ms"])
        assert run["ratio"]["silent_true"] > 0 and run["ratio"]["silent_false"] > 0
    out = capsys.readouterr().out
    assert "1 tasks, median" in out and "2 tasks, median" in out
    assert out.count("ratio tfdist_nb / ipyparallel:") == 2


def test_summary_table_marks_each_goal() -> None:
    """``python -m bench`` prints one row per goal, met or NOT MET (canned results)."""
    from bench.__main__ import format_table, summary

    rtt_run = {"rtt_ms": {"tfdist_nb": 9.0, "ipyparallel": 8.0, "ipyparallel_silent_false": 10.0,
                          "jupyter_client": 8.5},
               "rtt_p90_ms": {"tfdist_nb": 12.0, "ipyparallel": 11.0,
                              "ipyparallel_silent_false": 13.0, "jupyter_client": 9.0}}
    parts = {
        "startup": {"runs": [{"workers": 2, "start_s": {"tfdist_nb": 5.0, "ipyparallel": 11.0,
                                                        "jupyter_client": 4.5}, **rtt_run}]},
        "rtt": {"runs": [{"tasks": 16, **rtt_run}]},
        "training": {"workers": 2, "steps": 300, "median_ms": {"tfdist_nb": 10.0, "plain": 9.8},
                     "ratio": 10.0 / 9.8},
        "flood": {"workers": 2, "lines": 100000,
                  "tfdist_nb": {"lines_lost": 0, "peak_rss_growth_mb": 26.0, "wall_s": 2.4,
                                "controller_cpu_s": 2.1},
                  "ipyparallel": {"lines_lost": 0, "peak_rss_growth_mb": 17.0, "wall_s": 1.0,
                                  "controller_cpu_s": 0.2},
                  "interleaved": {"lines_lost": 0, "out_of_order": 3, "time_back": 0,
                                  "peak_rss_growth_mb": 20.0, "wall_s": 3.0,
                                  "controller_cpu_s": 2.5}},
        "detect": {"error": "exit status 1"},
        "network": {"workers": 2, "rows": [
            {"size_mb": 16.0, "tfdist_nb": 0.19, "plain": 0.2, "ratio": 0.95},
            {"size_mb": 64.0, "tfdist_nb": 0.1, "plain": 0.2, "ratio": 0.5}]},
    }
    rows = summary(parts)
    by_measure = {r["measure"]: r for r in rows}
    start = by_measure["start to TF-ready, 2 workers (s)"]
    assert (start["ratio"], start["result"]) == ("0.45x", "met")
    loud = by_measure["x = 1 round trip, 16 tasks, no TF (ms), vs silent=False"]
    quiet = by_measure["x = 1 round trip, 16 tasks, no TF (ms), vs silent=True"]
    assert (loud["result"], quiet["result"]) == ("met", "NOT MET")
    assert by_measure["median step time, 2 workers, 300 steps (ms)"]["result"] == "met"
    mixed = by_measure["100000 lines x 2 tasks, print / stderr / os.write in turn: lines out of "
                       "order"]
    assert (mixed["tfdist_nb"], mixed["result"]) == ("3", "NOT MET")
    assert [r["goal"] for r in rows if r["goal"]] == sorted(r["goal"] for r in rows if r["goal"])
    failed = next(r for r in rows if r["goal"] == "(e)")
    assert failed["result"] == "NOT MET"  # a failed part shows
    network = [r for r in rows if r["goal"] == "(f)"]
    assert [r["result"] for r in network] == ["met", "NOT MET"]
    assert network[0]["measure"] == "all-reduce bus bandwidth, 2 workers, 16 MB (GB/s)"
    table = format_table(rows)
    assert "NOT MET" in table and "<= 0.50x" in table and "jupyter_client" in table
    assert format_table(rows, markdown=True).startswith("| goal | measure |")


def test_summary_has_the_many_task_goals() -> None:
    """Part (h), bench.fleet: start and round trip at each size vs ipyparallel, and the
    controller keeping up with 64 tasks' telemetry, each marked met / NOT MET (canned results)."""
    from bench.__main__ import PARTS, summary

    assert "fleet" in PARTS
    run = {"tasks": 64, "start_s": {"tfdist_nb": 30.0, "ipyparallel": 25.0}, "start_ratio": 1.2,
           "rtt_ms": {"tfdist_nb": 40.0, "ipyparallel": 50.0, "ipyparallel_silent_false": 60.0},
           "rtt_p90_ms": {"tfdist_nb": 50.0, "ipyparallel": 60.0,
                          "ipyparallel_silent_false": 70.0}}
    telemetry = {"tasks": 64, "lag_max_s": 1.4, "lag_median_s": 0.5, "steps_lost": 0,
                 "steps_made": 100_000, "controller_cpu_share": 0.7,
                 "dashboard_refresh_median_ms": 12.0}
    rows = summary({"fleet": {"runs": [run], "telemetry": telemetry}})
    assert {r["goal"] for r in rows} == {"(h)"}
    result = {r["measure"]: r["result"] for r in rows}
    assert result["start, 64 tasks, no TF (s)"] == "NOT MET"
    assert result["x = 1 round trip, 64 tasks, no TF (ms), vs silent=True"] == "met"
    tel = "64 tasks stepping every 10 ms, dashboard on"
    assert result[f"{tel}: newest sample age, max (s)"] == "met"
    assert result[f"{tel}: steps lost"] == "met"
    assert result[f"{tel}: controller CPU (share of a core)"] == "NOT MET"


def test_ledger_benchmark_compares_rows_and_runs_carrying_the_same_rows() -> None:
    """Process-free: both forms unfold to every row on the controller (checked inside), and
    runs are a small fraction of the bytes."""
    from bench import ledger

    res = ledger.main(["--quick", "--steps-per-s", "50"])
    assert set(res) >= {"rows", "runs", "ratio"}
    assert res["ratio"]["bytes"] < 0.2
