"""``%tfdist_isolate`` to its verdict on the teaching notebook's three bugs, with spare kernels
vs cold starts, side by side in one run (issue 23).

    python -m bench.isolate [--repeat 1] [--bugs data function collective] [--json PATH]

For each bug a 2-worker cluster runs the failing cell, then ``cluster.isolate()`` is timed to
its verdict: with spares (``warm=True``: the cluster's ready spares are lent to the variants,
which pass them on as a resize does, and the pool refills when the host has CPU to spare) and
with every variant started cold (``warm=False``). The two modes alternate in order across
repeats. Reported: seconds to the verdict, variants run, seconds per variant, and the ratio
warm / cold. Spares are waited for (untimed) before the warm isolation, as a cluster that has
been up a while has them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.startup import machine, warm_up

STRATEGY = ("import tensorflow as tf, tfdist_nb.worker as tw\n"
            "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n")
BUGS = {
    # element 14 is NaN: in worker:1's share (it gets [2, 3], [6, 7], ... of each global batch)
    "data": STRATEGY + """
data = tf.data.Dataset.range(32).map(
    lambda x: tf.where(x == 14, float("nan"), tf.cast(x, tf.float32)))
batches = iter(strategy.experimental_distribute_dataset(data.batch(4)))

@tf.function
def step(x):
    return strategy.run(lambda v: tf.debugging.check_numerics(tf.reduce_sum(v), "loss"),
                        args=(x,))

for i in range(8):
    with tw.step():
        strategy.reduce("SUM", step(next(batches)), axis=None)
""",
    # .numpy() inside a tf.function: fine eagerly, an error when traced
    "function": STRATEGY + """
@tf.function
def step(x):
    return strategy.run(lambda v: tf.reduce_sum(v) * float(v.numpy().max()), args=(x,))

for i in range(6):
    with tw.step():
        strategy.reduce("SUM", step(tf.constant([1.0, 2.0])), axis=None)
""",
    # worker:1 all-reduces 3 numbers, worker:0 two
    "collective": STRATEGY + """
n = 3 if tw.task[1] == 1 else 2

@tf.function
def step():
    return strategy.run(lambda: tf.ones([n]))

for i in range(4):
    with tw.step():
        strategy.reduce("SUM", step(), axis=None)
""",
}
SPARES_TIMEOUT_S = 300.0


def one(bug: str, warm: bool) -> dict[str, Any]:
    from tfdist_nb import Cluster

    with Cluster(workers=2, warm=2 if warm else False, stall_timeout=60) as c:
        if warm:  # a cluster up for a while: its spares are ready (untimed)
            deadline = time.monotonic() + SPARES_TIMEOUT_S
            while c.spares()["ready"] < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
        failed = c.run(BUGS[bug], timeout=120)
        assert not failed.ok, f"the {bug} bug did not fail: {failed.summary()}"
        began = time.monotonic()
        report = c.isolate(budget_s=600, warm=warm)
        took = time.monotonic() - began
    variants = len({r.variant.key for r in report.rows})
    return {"bug": bug, "warm": warm, "seconds": took, "variants": variants,
            "per_variant_s": took / max(1, variants), "verdict": report.verdict,
            "smallest": report.smallest.title if report.smallest else None}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.isolate", description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--bugs", nargs="+", choices=sorted(BUGS), default=list(BUGS))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    warm_up()
    runs = []
    for i in range(args.repeat):
        for bug in args.bugs:
            for warm in ((True, False) if i % 2 == 0 else (False, True)):
                runs.append(one(bug, warm))
                r = runs[-1]
                print(f"{bug:10s} {'warm' if warm else 'cold'}: {r['seconds']:6.1f}s, "
                      f"{r['variants']} variants ({r['per_variant_s']:.1f}s each): "
                      f"{r['verdict'][:90]}", flush=True)
    summary = {}
    for bug in args.bugs:
        warm_s = statistics.median(r["seconds"] for r in runs if r["bug"] == bug and r["warm"])
        cold_s = statistics.median(r["seconds"] for r in runs
                                   if r["bug"] == bug and not r["warm"])
        summary[bug] = {"warm_s": warm_s, "cold_s": cold_s, "ratio": warm_s / cold_s}
        print(f"{bug:10s} to the verdict: warm {warm_s:.1f}s, cold {cold_s:.1f}s, "
              f"ratio warm / cold: {warm_s / cold_s:.2f}x")
    results = {"machine": machine(), "runs": runs, "summary": summary}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
