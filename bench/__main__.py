"""Every benchmark in one run, each against the tool a user would pick instead, with its goal.

    python -m bench [--quick] [--json PATH] [--only PART ...] [--markdown]

(a) ``bench.startup``  start to TF-ready, 2 and 4 workers: tfdist_nb vs ipyparallel vs
    hand-rolled jupyter_client kernels; goal at most 0.5x ipyparallel.
(b) ``bench.rtt``      ``x = 1`` broadcast round trip at 2, 8 and 16 tasks (no TF) and at 2 TF
    workers (from ``bench.startup``) vs ``DirectView.execute(block=True)``, silent=True and
    silent=False; goal at most 1.0x at every size.
(c) ``bench.training`` training step time with telemetry vs plain processes; goal at most 1.05x.
    ``bench.ledger``   beside it: one second of a loop's collective ledger on the wire, rows
    as they were vs completed calls folded into runs (bytes, task and controller cost).
(d) ``bench.flood``    100k lines per task: goal 0 lines lost, controller RSS growth <= 200 MB;
                      written through print, stderr and os.write in turn: 0 lines out of order.
(e) ``bench.detect``   crash detected within 2 s, stall within stall_timeout + 2 s.
(f) ``bench.network``  ``%tfdist_check network``'s all-reduce bus bandwidth vs the same
    all-reduce in plain processes; goal within 0.9x-1.1x at 1, 16 and 64 MB.
(g) ``bench.warm``     restart and resize from spare kernels, to a new MWMS strategy: restart
    <= 0.15x of the cluster's cold start and <= 0.1x of ipyparallel's restart + import TF,
    resize 2 -> 1 <= 0.2x of a cold start, a training step after it <= 1.02x of a cold task's.
(h) ``bench.fleet``    32 and 64 tasks (no TF): start and ``x = 1`` round trip vs ipyparallel with
    as many engines, each <= 1.0x; 64 tasks stepping every 10 ms with the dashboard on: newest
    telemetry sample <= 2 s old, 0 steps lost, controller under half a core.
(i) ``bench.hangs``    a task that raised, finished early, or entered another collective, named
    by the hang rules within 2 s of the fact, vs the stall detector alone (about the stall timeout).
(j) ``bench.memory``   a default 2-worker cluster's memory (PSS of the fork server, tasks, spares)
    vs two plain processes importing TF; goal at most 1.0x (forked tasks share TF's pages).

Each part runs in its own Python process (a fresh controller, so one part's leftovers cannot
weigh on the next; a part that fails is reported and the others still run) and is runnable alone:
``python -m bench.<part> --help``. ``--quick`` is a short smoke version; its numbers are indicative
only. The summary table marks each goal met / NOT MET.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PARTS: dict[str, tuple[list[str], list[str]]] = {  # part -> (full args, --quick args)
    "startup": (["--workers", "2", "4", "--repeat", "3", "--rtt", "50"],
                ["--workers", "2", "--quick"]),
    "rtt": (["--tasks", "2", "8", "16", "--repeat", "3", "--rtt", "50"],
            ["--tasks", "2", "4", "--quick"]),
    "training": (["--workers", "2", "--steps", "300", "--repeat", "7"], ["--quick"]),
    "ledger": (["--repeat", "20"], ["--quick"]),
    "flood": (["--workers", "2", "--lines", "100000"], ["--quick"]),
    "detect": (["--repeat", "3", "--stall-timeout", "10"], ["--quick"]),
    "network": (["--workers", "2", "--repeat", "3"], ["--quick"]),
    "warm": (["--repeat", "3", "--step-repeat", "5", "--steps", "300"], ["--quick"]),
    "fleet": (["--tasks", "32", "64", "--repeat", "2", "--rtt", "20"], ["--quick"]),
    "hangs": (["--repeat", "2", "--stall-timeout", "60"], ["--quick"]),
    "memory": (["--workers", "2"], ["--quick"]),
}
BANDWIDTH_GOAL = (0.9, 1.1)
START_GOAL = 0.5
RTT_GOAL = 1.0
TRAIN_GOAL = 1.05
RSS_GOAL_MB = 200.0
DETECT_GOAL_S = 2.0
COLUMNS = ["goal", "measure", "tfdist_nb", "alternative", "ratio", "target", "result"]


def run_part(part: str, args: list[str], workdir: Path) -> dict[str, Any]:
    """``python -m bench.<part> ARGS --json FILE`` in a fresh process; its output goes to ours."""
    out = workdir / f"{part}.json"
    here = str(Path(__file__).parent.parent)  # where this bench (and its tfdist_nb) lives
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", f"bench.{part}", *args, "--json", str(out)]
    print(f"\n=== {part}: {' '.join(cmd[1:])}", flush=True)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    proc = subprocess.run(cmd, env=env, check=False)
    ran = {"wall_s": time.perf_counter() - t0, "load1_before": load0,
           "load1_after": os.getloadavg()[0]}  # > ~2.5 on 2 cores: something else ran too
    if proc.returncode != 0 or not out.exists():
        return {"error": f"exit status {proc.returncode}", **ran}
    return {**json.loads(out.read_text()), **ran}


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def _row(goal: str, measure: str, ours: str, alt: str, ratio: str, target: str,
         ok: bool | None) -> dict[str, str]:
    return dict(zip(COLUMNS, [goal, measure, ours, alt, ratio, target,
                              "-" if ok is None else _verdict(ok)], strict=True))


def rows_startup(res: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for run in res["runs"]:
        s, n = run["start_s"], run["workers"]
        ratio = s["tfdist_nb"] / s["ipyparallel"]
        rows.append(_row("(a)", f"start to TF-ready, {n} workers (s)", f"{s['tfdist_nb']:.2f}",
                         f"ipyparallel {s['ipyparallel']:.2f}", f"{ratio:.2f}x",
                         f"<= {START_GOAL:.2f}x", ratio <= START_GOAL))
        if "jupyter_client" in s:
            rows.append(_row("", "  same, vs hand-rolled jupyter_client", "",
                             f"jupyter_client {s['jupyter_client']:.2f}",
                             f"{s['tfdist_nb'] / s['jupyter_client']:.2f}x", "", None))
    return rows + _failures(res, "(a)")


def _rtt_rows(label: str, run: dict[str, Any], goal: str = "(b)") -> list[dict[str, str]]:
    med, p90 = run["rtt_ms"], run["rtt_p90_ms"]
    ours = f"{med['tfdist_nb']:.1f} (p90 {p90['tfdist_nb']:.1f})"
    rows = []
    for key, what in (("ipyparallel", "silent=True"), ("ipyparallel_silent_false",
                                                       "silent=False")):
        ratio = med["tfdist_nb"] / med[key]
        rows.append(_row(goal, f"{label}, vs {what}", ours,
                         f"ipyparallel {med[key]:.1f} (p90 {p90[key]:.1f})",
                         f"{ratio:.2f}x (p90 {p90['tfdist_nb'] / p90[key]:.2f}x)",
                         f"<= {RTT_GOAL:.2f}x", ratio <= RTT_GOAL))
    if "jupyter_client" in med:
        rows.append(_row("", "  same, vs hand-rolled jupyter_client", "",
                         f"jupyter_client {med['jupyter_client']:.1f} "
                         f"(p90 {p90['jupyter_client']:.1f})",
                         f"{med['tfdist_nb'] / med['jupyter_client']:.2f}x", "", None))
    return rows


def _failures(res: dict[str, Any], goal: str) -> list[dict[str, str]]:
    failed = [f for run in res["runs"] for f in run.get("start_failures", [])]
    return [_row(goal, f"  start failed, retried: {f}", "", "", "", "", None) for f in failed]


def rows_rtt(res: dict[str, Any]) -> list[dict[str, str]]:
    return [r for run in res["runs"]
            for r in _rtt_rows(f"x = 1 round trip, {run['tasks']} tasks, no TF (ms)", run)
            ] + _failures(res, "(b)")


def rows_startup_rtt(res: dict[str, Any]) -> list[dict[str, str]]:
    return [r for run in res["runs"] if "rtt_ms" in run
            for r in _rtt_rows(f"x = 1 round trip, {run['workers']} TF workers (ms)", run)]


def rows_training(res: dict[str, Any]) -> list[dict[str, str]]:
    med, ratio = res["median_ms"], res["ratio"]
    return [_row("(c)", f"median step time, {res['workers']} workers, {res['steps']} steps (ms)",
                 f"{med['tfdist_nb']:.2f}", f"plain TF_CONFIG {med['plain']:.2f}",
                 f"{ratio:.3f}x", f"<= {TRAIN_GOAL:.2f}x", ratio <= TRAIN_GOAL)]


def rows_ledger(res: dict[str, Any]) -> list[dict[str, str]]:
    rows, runs, ratio = res["rows"], res["runs"], res["ratio"]
    what = f"  ledger, 1 s at {res['steps_per_s']} steps/s x {res['ops']} collectives"
    cpu = (runs["task_ms"] + runs["controller_ms"]) / (rows["task_ms"] + rows["controller_ms"])
    return [_row("", f"{what}: bytes on the wire", f"{runs['bytes']:.0f}",
                 f"row by row {rows['bytes']:.0f}", f"{ratio['bytes']:.3f}x", "", None),
            _row("", f"{what}: task + controller CPU (ms)",
                 f"{runs['task_ms']:.1f} + {runs['controller_ms']:.1f}",
                 f"row by row {rows['task_ms']:.1f} + {rows['controller_ms']:.1f}",
                 f"{cpu:.3f}x", "", None)]


def rows_flood(res: dict[str, Any]) -> list[dict[str, str]]:
    ours, alt = res["tfdist_nb"], res.get("ipyparallel", {})
    what = f"{res['lines']} lines x {res['workers']} tasks"
    rows = [_row("(d)", f"{what}: lines lost", str(ours["lines_lost"]),
                 f"ipyparallel {alt.get('lines_lost', '-')}", "", "0",
                 ours["lines_lost"] == 0),
            _row("(d)", f"{what}: controller peak RSS growth (MB)",
                 f"{ours['peak_rss_growth_mb']:.0f}",
                 f"ipyparallel {alt['peak_rss_growth_mb']:.0f}" if alt else "", "",
                 f"<= {RSS_GOAL_MB:.0f}", ours["peak_rss_growth_mb"] <= RSS_GOAL_MB)]
    mixed = res.get("interleaved")
    if mixed:
        rows.append(_row("(d)", f"{what}, print / stderr / os.write in turn: lines out of "
                         "order", str(mixed["out_of_order"]),
                         f"lost {mixed['lines_lost']}, times back {mixed['time_back']}, "
                         f"controller CPU {mixed['controller_cpu_s']:.2f} s", "", "0",
                         mixed["out_of_order"] == 0 and mixed["lines_lost"] == 0))
    if alt:
        rows.append(_row("", f"  {what}: wall (s) / controller CPU (s)",
                         f"{ours['wall_s']:.2f} / {ours['controller_cpu_s']:.2f}",
                         f"ipyparallel {alt['wall_s']:.2f} / {alt['controller_cpu_s']:.2f}",
                         f"{ours['wall_s'] / alt['wall_s']:.2f}x", "", None))
    return rows


def rows_detect(res: dict[str, Any]) -> list[dict[str, str]]:
    c, s, st = res["crash"], res["stall"], res["stall_timeout_s"]
    return [_row("(e)", "crash: process exit to cell end (s)",
                 f"{c['median_s']:.2f} (max {c['max_s']:.2f})", "", "",
                 f"<= {DETECT_GOAL_S:.0f} s", c["max_s"] <= DETECT_GOAL_S),
            _row("(e)", f"stall: cell end beyond stall_timeout={st:.0f} s (s)",
                 f"{s['median_s']:.2f} (max {s['max_s']:.2f})", "", "",
                 f"<= {DETECT_GOAL_S:.0f} s", s["max_s"] <= DETECT_GOAL_S)]


def rows_network(res: dict[str, Any]) -> list[dict[str, str]]:
    low, high = BANDWIDTH_GOAL
    return [_row("(f)", f"all-reduce bus bandwidth, {res['workers']} workers, {r['size_mb']:g} MB "
                        "(GB/s)", f"{r['tfdist_nb']:.3f}", f"plain TF_CONFIG {r['plain']:.3f}",
                 f"{r['ratio']:.2f}x", f"{low:.1f}-{high:.1f}x", low <= r["ratio"] <= high)
            for r in res["rows"]] + [
        _row("(f)", f"private network vs host's: all-reduce {r['size_mb']:g} MB (GB/s)",
             f"{r['tfdist_nb']:.3f}", f"host network {r['host']:.3f}",
             f"{r['private_vs_host']:.2f}x", f"{low:.1f}-{high:.1f}x",
             low <= r["private_vs_host"] <= high)
        for r in res["rows"] if "host" in r] + ([
            _row("(f)", "cold start, private network vs host's (s)",
                 f"{res['start_s']['private']:.2f}", f"host network {res['start_s']['host']:.2f}",
                 f"{res['start_s']['private'] / res['start_s']['host']:.2f}x", "", None)]
        if "start_s" in res else [])


def rows_warm(res: dict[str, Any]) -> list[dict[str, str]]:
    from bench.warm import IPP_GOAL, RESIZE_GOAL, RESTART_GOAL, STEP_GOAL

    m, r = res["median"], res["ratio"]
    return [
        _row("(g)", "restart to a new MWMS strategy, 2 workers, vs its cold start (s)",
             f"{m['warm_restart_s']:.2f}", f"cold start {m['cold_start_2_s']:.2f}",
             f"{r['restart_vs_cold_start']:.3f}x", f"<= {RESTART_GOAL:.2f}x",
             r["restart_vs_cold_start"] <= RESTART_GOAL),
        _row("(g)", "  same, vs ipyparallel restart engines + import TF (s)", "",
             f"ipyparallel {m['ipyparallel_s']:.2f}", f"{r['restart_vs_ipyparallel']:.3f}x",
             f"<= {IPP_GOAL:.2f}x", r["restart_vs_ipyparallel"] <= IPP_GOAL),
        _row("(g)", "resize 2 -> 1 worker to a new strategy, vs a cold start (s)",
             f"{m['warm_resize_s']:.2f}", f"cold start {m['cold_start_1_s']:.2f}",
             f"{r['resize_vs_cold_start']:.3f}x", f"<= {RESIZE_GOAL:.2f}x",
             r["resize_vs_cold_start"] <= RESIZE_GOAL),
        _row("(g)", "MWMS step after a warm restart vs on cold tasks (ms)",
             f"{m['step_warm_ms']:.2f}", f"cold {m['step_cold_ms']:.2f}",
             f"{r['step_warm_vs_cold']:.3f}x", f"<= {STEP_GOAL:.2f}x",
             r["step_warm_vs_cold"] <= STEP_GOAL),
        *[_row("(g)", f"restart {what}, spares not waited for, vs cold start (s)",
               f"{m[f'{key}_s']:.2f}", f"cold start {m['cold_start_2_s']:.2f}",
               f"{r[f'{key}_vs_cold_start']:.3f}x", f"<= {RESTART_GOAL:.2f}x",
               r[f"{key}_vs_cold_start"] <= RESTART_GOAL)
          for key, what in (("usual_restart", "2 s after the strategy's cell"),
                            ("after_hang_restart", "right after a named hang"))
          if m.get(f"{key}_s") and f"{key}_vs_cold_start" in r],
    ]


def rows_fleet(res: dict[str, Any]) -> list[dict[str, str]]:
    from bench.fleet import CPU_GOAL, LAG_GOAL_S

    rows = []
    for run in res["runs"]:
        n, start = run["tasks"], run["start_s"]
        rows.append(_row("(h)", f"start, {n} tasks, no TF (s)", f"{start['tfdist_nb']:.1f}",
                         f"ipyparallel {start['ipyparallel']:.1f}",
                         f"{run['start_ratio']:.2f}x", "<= 1.00x", run["start_ratio"] <= 1.0))
        rows += _rtt_rows(f"x = 1 round trip, {n} tasks, no TF (ms)", run, "(h)")
    t = res["telemetry"]
    what = f"{t['tasks']} tasks stepping every 10 ms, dashboard on"
    rows += [_row("(h)", f"{what}: newest sample age, max (s)", f"{t['lag_max_s']:.2f}",
                  f"median {t['lag_median_s']:.2f}", "", f"<= {LAG_GOAL_S:.0f} s",
                  t["lag_max_s"] <= LAG_GOAL_S),
             _row("(h)", f"{what}: steps lost", f"{t['steps_lost']}",
                  f"of {t['steps_made']}", "", "0", t["steps_lost"] == 0),
             _row("(h)", f"{what}: controller CPU (share of a core)",
                  f"{t['controller_cpu_share']:.2f}",
                  f"dashboard refresh {t['dashboard_refresh_median_ms']:.0f} ms", "",
                  f"<= {CPU_GOAL:.2f}", t["controller_cpu_share"] <= CPU_GOAL)]
    return rows + _failures(res, "(h)")


def rows_hangs(res: dict[str, Any]) -> list[dict[str, str]]:
    from bench.hangs import GOAL_S

    st = res["stall_timeout_s"]
    return [_row("(i)", f"hang rule '{rule}': fact to cell end, stall_timeout={st:.0f} s (s)",
                 f"{r['rules_s']:.2f} (max {r['rules_max_s']:.2f})",
                 f"stall detector alone {r['stall_only_s']:.2f}", f"{r['ratio']:.3f}x",
                 f"<= {GOAL_S:.0f} s", r["rules_max_s"] <= GOAL_S)
            for rule, r in res["rules"].items()]


def rows_memory(res: dict[str, Any]) -> list[dict[str, str]]:
    plain = res["plain"]["pss_mb"]
    rows = []
    for key, what in (("default", "default (spares on)"), ("no_spares", "warm=False"),
                      ("no_fork_no_spares", "warm=False, TFDIST_FORK=off")):
        if key in res:
            r = res[key]
            goal = key == "default"
            rows.append(_row("(j)" if goal else "",
                             f"{'' if goal else '  '}{res['workers']} workers, {what}: PSS of "
                             f"{r['processes']} processes (MB; {r['spares_ready']} spares ready)",
                             f"{r['pss_mb']:.0f}", f"plain processes {plain:.0f}",
                             f"{r['pss_mb'] / plain:.2f}x", "<= 1.00x" if goal else "",
                             r["pss_mb"] <= plain if goal else None))
    return rows


ROWS: dict[str, list[Callable[[dict[str, Any]], list[dict[str, str]]]]] = {
    "startup": [rows_startup, rows_startup_rtt], "rtt": [rows_rtt], "training": [rows_training],
    "ledger": [rows_ledger],
    "flood": [rows_flood], "detect": [rows_detect], "network": [rows_network],
    "warm": [rows_warm], "fleet": [rows_fleet], "hangs": [rows_hangs], "memory": [rows_memory],
}
LETTER = {"startup": "(a)", "rtt": "(b)", "training": "(c)", "ledger": "(c)", "flood": "(d)",
          "detect": "(e)",
          "network": "(f)", "warm": "(g)", "fleet": "(h)",
          "hangs": "(i)", "memory": "(j)"}


def summary(parts: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """The table's rows, in goal order ((b) gathers the round trips of startup and rtt)."""
    rows: list[dict[str, str]] = []
    for part, res in parts.items():
        if "error" in res:
            rows.append(_row(LETTER[part], f"bench.{part} failed: {res['error']}", "", "", "",
                             "", False))
            continue
        for make in ROWS[part]:
            try:
                rows.extend(make(res))
            except (KeyError, ZeroDivisionError, TypeError) as exc:
                rows.append(_row(LETTER[part], f"bench.{part}: no result ({exc!r})", "", "",
                                 "", "", False))
    order = {letter: i for i, letter in enumerate(sorted(set(LETTER.values())))}
    goal = ""
    for r in rows:  # continuation rows sort with the goal above them
        goal = r["goal"] or goal
        r["_key"] = goal
    rows.sort(key=lambda r: order.get(r["_key"], 9))
    for r in rows:
        del r["_key"]
    return rows


def format_table(rows: list[dict[str, str]], markdown: bool = False) -> str:
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(r[c] for c in COLUMNS) + " |" for r in rows]
        return "\n".join(lines)
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in COLUMNS}
    fmt = "  ".join(f"{{{c}:{widths[c]}}}" for c in COLUMNS)
    lines = [fmt.format(**{c: c for c in COLUMNS}).rstrip(), fmt.format(**{c: "-" * widths[c]
                                                                   for c in COLUMNS})]
    lines += [fmt.format(**r).rstrip() for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke version of each part")
    parser.add_argument("--json", type=Path, help="write every part's results and the summary")
    parser.add_argument("--only", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--markdown", action="store_true", help="the summary as a Markdown table")
    args = parser.parse_args(argv)
    from bench.startup import machine

    workdir = Path(tempfile.mkdtemp(prefix="bench_all_"))
    runs_dir = workdir / "tfdist_runs"
    os.environ.setdefault("TFDIST_RUNS_DIR", str(runs_dir))
    began = time.time()
    info = machine()
    parts = {}
    try:
        for part in args.only:
            full, quick = PARTS[part]
            parts[part] = run_part(part, quick if args.quick else full, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = summary(parts)
    met = sum(r["result"] == "met" for r in rows)
    missed = sum(r["result"] == "NOT MET" for r in rows)
    print(f"\n=== summary{' (--quick: indicative only)' if args.quick else ''}: {met} goal(s) "
          f"met, {missed} not met; {time.time() - began:.0f} s; load average at the end "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(format_table(rows, markdown=args.markdown))
    results = {"machine": info, "command": " ".join(["python -m bench",
                                                *(sys.argv[1:] if argv is None else argv)]),
               "quick": args.quick, "parts": parts, "summary": rows,
               "load_avg_end": os.getloadavg()}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
