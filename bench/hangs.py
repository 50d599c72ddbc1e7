"""Time to the named cause of a hang: the hang rules against the stall detector alone.

    python -m bench.hangs [--repeat 2] [--stall-timeout 60] [--quick] [--json PATH]

Each fault runs on a real 2-worker MWMS cluster. worker:1 writes the time of the fact (the
moment it raises, finishes its shorter loop, or enters an all-reduce of another shape) to a
file; the latency is the cell's end minus that time. Side by side, in the same run, the same
fault with the hang rules switched off (``runner.find_hang`` answering None, the controller
this tool had before the ledger) shows what the stall detector alone gives: about the stall
timeout. Goal (docs/reference.md, "Collectives and hangs"): each rule within 2 s of the fact
whatever the stall timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tfdist_nb import Cluster

GOAL_S = 2.0
SETUP = """import time, tensorflow as tf, tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy()
def fact():
    open({mark!r}, "w").write(repr(time.time()))
"""
FAULTS = {  # rule -> the faulty cell
    "failed": """x = strategy.reduce("SUM", tf.constant(1.0), axis=None)
if tw.task[1] == 1:
    fact()
    raise ValueError("bad batch on this task")
y = strategy.reduce("SUM", tf.constant(2.0), axis=None)
""",
    "finished": """steps = 4 if tw.task[1] == 1 else 5   # uneven per-task data
for i in range(steps):
    strategy.reduce("SUM", tf.constant(1.0), axis=None)
if tw.task[1] == 1:
    fact()
""",
    "diverged": """n = 3 if tw.task[1] == 1 else 2    # a per-task shape, eager
if tw.task[1] == 1:
    fact()
strategy.reduce("SUM", tf.ones([n]), axis=None)
""",
}


def once(rule: str, stall_timeout: float, rules_on: bool) -> float:
    from tfdist_nb.cluster import runner

    mark = Path(tempfile.mkdtemp()) / "t"
    real = runner.find_hang
    if not rules_on:
        runner.find_hang = lambda *a, **k: None  # type: ignore[assignment]
    try:
        with Cluster(workers=2, preload=(), stall_timeout=stall_timeout) as c:
            assert c.run(SETUP.format(mark=str(mark))).ok
            result = c.run(FAULTS[rule], timeout=stall_timeout * 3 + 60)
            ended = time.time()
            assert not result.ok, result.summary()
            if rules_on:
                assert result.cause is not None, result.summary()
    finally:
        runner.find_hang = real
    return ended - float(mark.read_text())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--stall-timeout", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true",
                        help="1 repeat, stall_timeout 10 s (smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.stall_timeout = 1, 10.0
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    out: dict[str, Any] = {"stall_timeout_s": args.stall_timeout, "rules": {}}
    for rule in FAULTS:
        on = [once(rule, args.stall_timeout, True) for _ in range(args.repeat)]
        off = [once(rule, args.stall_timeout, False) for _ in range(args.repeat)]
        row = {"rules_s": statistics.median(on), "rules_max_s": max(on),
               "stall_only_s": statistics.median(off), "runs_rules": on, "runs_stall_only": off}
        row["ratio"] = row["rules_s"] / row["stall_only_s"]
        out["rules"][rule] = row
        print(f"{rule}: named {row['rules_s']:.2f}s after the fact (max {row['rules_max_s']:.2f}s)"
              f"; stall detector alone {row['stall_only_s']:.2f}s ({row['ratio']:.3f}x)",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
