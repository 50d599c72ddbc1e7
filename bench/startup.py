"""Start-to-TF-ready time and broadcast round trip: tfdist_nb vs ipyparallel vs hand-rolled
jupyter_client kernels, in the same run.

    python -m bench.startup [--workers 2 4] [--repeat 3] [--rtt 50] [--quick] [--json PATH]
                            [--tools tfdist_nb ipyparallel jupyter_client]

"TF-ready" means every task has finished ``import tensorflow``: for tfdist_nb that is what
``Cluster.start()`` returns after; for ipyparallel it is ``Cluster.start_and_connect_sync()`` plus
``DirectView.execute("import tensorflow", block=True)``; for jupyter_client it is N
``AsyncKernelManager`` kernels started in parallel, ``wait_for_ready`` and an
``import tensorflow`` execute request answered by each (see ``bench.tools``). The round trip is a
trivial cell (``x = 1``) sent to every task and waited for. Runs rotate the tools' order so drift on
the machine hits all alike. Per-phase times say where each tool's start-up goes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.tools import TOOLS, percentile, rotated, start

ALT = "ipyparallel"


def warm_up() -> None:
    """One untimed import of what every tool loads, so the first timed start does not pay for a
    cold page cache alone (whichever tool happens to go first)."""
    subprocess.run([sys.executable, "-c", "import tensorflow, ipykernel.kernelapp, ipyparallel"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def measure(n: int, repeat: int, rtt: int, tools: list[str]) -> dict[str, Any]:
    starts: dict[str, list[float]] = {k: [] for k in tools}
    phases: dict[str, dict[str, list[float]]] = {k: {} for k in tools}
    rtt_keys = [*tools] + (["ipyparallel_silent_false"] if ALT in tools else [])
    rtts: dict[str, list[float]] = {k: [] for k in rtt_keys}
    failures: list[str] = []
    for i in range(repeat):
        for name in rotated(tools, i):
            tool = TOOLS[name]
            started = start(name, n, True, failures)
            starts[name].append(started.took_s)
            for phase, t in started.phases.items():
                phases[name].setdefault(phase, []).append(t)
            try:
                if rtt:
                    tool.rtt(started.handle)  # warm-up
                    rtts[name].extend(tool.rtt(started.handle) for _ in range(rtt))
                    if name == ALT:
                        rtts["ipyparallel_silent_false"].extend(
                            tool.rtt_loud(started.handle) for _ in range(rtt))
            finally:
                tool.stop(started.handle)
    out: dict[str, Any] = {
        "workers": n,
        "start_s": {k: statistics.median(v) for k, v in starts.items()},
        "start_all_s": starts,
        "start_failures": failures,
        "phases_s": {k: {p: statistics.median(v) for p, v in ph.items()}
                     for k, ph in phases.items()},
    }
    if rtt:
        out["rtt_ms"] = {k: 1000 * statistics.median(v) for k, v in rtts.items()}
        out["rtt_p90_ms"] = {k: 1000 * percentile(v, 0.9) for k, v in rtts.items()}
    return out


def report(res: dict[str, Any]) -> str:
    s = res["start_s"]
    names = list(s)
    lines = [f"{res['workers']} workers".ljust(28) + "".join(f"{k:>16}" for k in names)]
    lines.append("start to TF-ready (s)".ljust(28) + "".join(f"{s[k]:16.2f}" for k in names))
    if ALT in s and "tfdist_nb" in s:
        lines.append(f"  ratio tfdist_nb / {ALT}: {s['tfdist_nb'] / s[ALT]:.2f}x"
                     + "".join(f"; / {k}: {s['tfdist_nb'] / s[k]:.2f}x" for k in names
                               if k not in ("tfdist_nb", "tfdist_nb_next", ALT)))
    if ALT in s and "tfdist_nb_next" in s:
        lines.append(f"  ratio tfdist_nb_next (its fork server up) / {ALT}: "
                     f"{s['tfdist_nb_next'] / s[ALT]:.2f}x")
    for name, ph in res["phases_s"].items():
        steps = ", ".join(f"{p} at {t:.2f}s" for p, t in ph.items())
        lines.append(f"  {name}: {steps}")
    if "rtt_ms" in res:
        r, p = res["rtt_ms"], res["rtt_p90_ms"]
        lines.append("'x = 1' round trip (ms)".ljust(28)
                     + "".join(f"{r[k]:16.1f}" for k in names) + "   median")
        lines.append("".ljust(28) + "".join(f"{p[k]:16.1f}" for k in names) + "   p90")
        if "ipyparallel_silent_false" in r:
            lines.append(f"  ipyparallel silent=False (history + execute_result, as a notebook "
                         f"cell): {r['ipyparallel_silent_false']:.1f} ms median, "
                         f"{p['ipyparallel_silent_false']:.1f} ms p90")
        if ALT in r and "tfdist_nb" in r:
            lines.append(f"  ratio tfdist_nb / {ALT}: {r['tfdist_nb'] / r[ALT]:.2f}x "
                         f"(silent=True, its default), "
                         f"{r['tfdist_nb'] / r['ipyparallel_silent_false']:.2f}x (silent=False)")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import psutil

    versions = {}
    for dist in ("tensorflow", "ipykernel", "jupyter_client", "ipyparallel", "pyzmq"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = None
    return {"python": sys.version.split()[0], "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(), "versions": versions,
            "load_avg": os.getloadavg()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rtt", type=int, default=50, help="round trips per cluster (0: none)")
    parser.add_argument("--tools", nargs="+", choices=list(TOOLS), default=list(TOOLS))
    parser.add_argument("--quick", action="store_true", help="1 repeat, 5 round trips (CI smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.rtt = 1, 5
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    results: dict[str, Any] = {"machine": machine(), "runs": []}
    if not args.quick:
        warm_up()
    for n in args.workers:
        res = measure(n, args.repeat, args.rtt, args.tools)
        print(report(res), flush=True)
        results["runs"].append(res)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
