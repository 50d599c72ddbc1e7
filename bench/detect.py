"""Detection latency: how long after a task dies, or stops progressing, the cell ends.

    python -m bench.detect [--repeat 3] [--stall-timeout 10] [--quick] [--json PATH]

Crash: worker:1 writes the time to a file and SIGKILLs itself mid-training; latency is the cell's
end minus that time. Stall: worker:1 writes the time and sleeps before the all-reduce; latency is
the cell's end minus (that time + stall_timeout). Goals (issue 6): crash within 2 s, stall within
stall_timeout + 2 s.
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

BODY = """
import os, signal, time, tensorflow as tf, tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy()
for step in range(100000):
    if tw.task[1] == 1 and step == 20:
        open({mark!r}, "w").write(repr(time.time()))
        {action}
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
"""
ACTIONS = {"crash": "os.kill(os.getpid(), signal.SIGKILL)", "stall": "time.sleep(3600)"}


def once(kind: str, stall_timeout: float) -> float:
    mark = Path(tempfile.mkdtemp()) / "t"
    with Cluster(workers=2, preload=(), stall_timeout=stall_timeout) as c:
        result = c.run(BODY.format(mark=str(mark), action=ACTIONS[kind]), timeout=600)
        ended = time.time()
        status = result.tasks["worker:1"].status
        assert status == ("crashed" if kind == "crash" else "stalled"), result.summary()
    began = float(mark.read_text())
    return ended - began - (stall_timeout if kind == "stall" else 0.0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stall-timeout", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="1 repeat, stall_timeout 5 s (smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.stall_timeout = 1, 5.0
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    out: dict[str, Any] = {"stall_timeout_s": args.stall_timeout}
    for kind in ("crash", "stall"):
        runs = [once(kind, args.stall_timeout) for _ in range(args.repeat)]
        out[kind] = {"median_s": statistics.median(runs), "max_s": max(runs), "runs": runs}
        extra = f" after stall_timeout={args.stall_timeout:.0f}s" if kind == "stall" else ""
        print(f"{kind} detected {out[kind]['median_s']:.2f}s{extra} (median of {args.repeat},"
              f" max {out[kind]['max_s']:.2f}s)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
