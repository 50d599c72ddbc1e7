"""Training step time with full telemetry vs the same code in plain processes with TF_CONFIG.

    python -m bench.training [--workers 2] [--steps 300] [--repeat 3] [--quick] [--json PATH]

The same script (a small MLP under MultiWorkerMirroredStrategy, a custom loop with
``tw.step()``) runs (a) on a tfdist_nb cluster — worker kernels, telemetry thread, step records,
the live dashboard refreshing — and (b) as plain ``python -c`` processes given the same kind of
TF_CONFIG, which is what a user runs without the tool. Each task reports the median of its own
step times after a warm-up; runs alternate so machine drift hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tfdist_nb.cluster.tfconfig import build_tf_config
from tfdist_nb.launchers import ports
from tfdist_nb.topology import ClusterSpec

TRAIN = """
import json, statistics, time
import tensorflow as tf
import tfdist_nb.worker as tw
strategy = tf.distribute.MultiWorkerMirroredStrategy()
STEPS, WARMUP, BATCH = {steps}, 20, 256
x = tf.random.stateless_normal((BATCH * 8, 128), seed=(1, 2))
y = tf.random.stateless_normal((BATCH * 8, 1), seed=(3, 4))
ds = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH))
with strategy.scope():
    model = [tf.Variable(tf.random.normal((128, 256), seed=5) * 0.05,
                         aggregation=tf.VariableAggregation.MEAN),
             tf.Variable(tf.random.normal((256, 1), seed=6) * 0.05,
                         aggregation=tf.VariableAggregation.MEAN)]

@tf.function
def train_step(x, y):
    def step_fn(x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(x @ model[0])
            loss = tf.reduce_mean(tf.square(h @ model[1] - y))
        grads = tape.gradient(loss, model)
        for v, g in zip(model, grads):
            v.assign_sub(0.01 * g)
        return loss
    return strategy.reduce("MEAN", strategy.run(step_fn, args=(x, y)), axis=None)

times = []
for x_, y_ in tw.timed(ds):
    t0 = time.perf_counter()
    with tw.step():
        train_step(x_, y_)
    times.append(time.perf_counter() - t0)
    if len(times) == STEPS:
        break
print("BENCH", json.dumps({{"median_ms": 1000 * statistics.median(times[WARMUP:])}}))
"""


def _medians(outputs: list[str]) -> list[float]:
    vals = []
    for out in outputs:
        line = next(x for x in out.splitlines() if x.startswith("BENCH "))
        vals.append(json.loads(line[6:])["median_ms"])
    return vals


def run_tfdist(n: int, steps: int) -> float:
    from tfdist_nb import Cluster

    with Cluster(workers=n) as cluster:
        dashboard = cluster.dashboard()  # the view a user has open while training
        result = cluster.run(TRAIN.format(steps=steps), timeout=600)
        dashboard.stop()
        assert result.ok, result.summary()
        return max(_medians([r.stdout for r in result.tasks.values()]))


def run_plain(n: int, steps: int) -> float:
    spec = ClusterSpec(workers=n)
    chosen = ports.reserve(n)
    try:
        addresses = {t: f"localhost:{p}" for t, p in zip(spec.tasks, chosen, strict=True)}
        procs = []
        for task in spec.tasks:
            env = {**os.environ, "TF_CONFIG": build_tf_config(task, addresses)}
            env.pop("PYTEST_CURRENT_TEST", None)
            procs.append(subprocess.Popen([sys.executable, "-c", TRAIN.format(steps=steps)],
                                          env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True))
        outs = [p.communicate(timeout=600)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        return max(_medians(outs))
    finally:
        ports.release(chosen)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repeat, 60 steps (CI smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.steps = 1, 60
    os.environ.setdefault("TFDIST_RUNS_DIR", tempfile.mkdtemp(prefix="tfdist_bench_"))
    runs: dict[str, list[float]] = {"tfdist_nb": [], "plain": []}
    for i in range(args.repeat):
        order = ["tfdist_nb", "plain"] if i % 2 == 0 else ["plain", "tfdist_nb"]
        for name in order:
            fn = run_tfdist if name == "tfdist_nb" else run_plain
            runs[name].append(fn(args.workers, args.steps))
    med = {k: statistics.median(v) for k, v in runs.items()}
    # Each repeat runs both back to back, so the machine's drift (its step time moves by 20%
    # between minutes on 2 shared cores) hits the two of a pair alike: the median of the
    # pairs' ratios is the figure; the ratio of the medians is kept beside it.
    pairs = [t / p for t, p in zip(runs["tfdist_nb"], runs["plain"], strict=True)]
    ratio = statistics.median(pairs)
    print(f"{args.workers} workers, {args.steps} steps   tfdist_nb   plain TF_CONFIG   ratio")
    print(f"median step time (ms)    {med['tfdist_nb']:9.2f}   {med['plain']:15.2f}   "
          f"{ratio:5.3f}x (pairs {min(pairs):.3f}-{max(pairs):.3f}x; ratio of medians "
          f"{med['tfdist_nb'] / med['plain']:.3f}x)")
    results = {"workers": args.workers, "steps": args.steps, "runs": runs, "median_ms": med,
               "ratio": ratio, "pair_ratios": pairs,
               "ratio_of_medians": med["tfdist_nb"] / med["plain"]}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
