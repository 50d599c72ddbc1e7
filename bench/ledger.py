"""What one second of a training loop's collective ledger costs on the wire: rows vs runs.

    python -m bench.ledger [--steps-per-s 200] [--ops 3] [--repeat 20] [--json PATH]

A 5 ms step under MultiWorkerMirroredStrategy issues a few collectives, so each task's ledger
grows by hundreds of rows a second. They travel with the telemetry samples: encoded on the task
(on the cores the training uses), decoded, written and indexed on the controller. This part
measures one second's drain, side by side: every row as it is (how the ledger travelled before
``tfdist_nb/ledger_runs.py``) and completed calls folded into runs (how it travels now), with the
bytes, the task's cost (drain + JSON encode) and the controller's (JSON decode + the ledger view's
update, which unfolds the runs). Process-free: the real Ledger and LedgerView, no cluster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from tfdist_nb.ledger_runs import fold
from tfdist_nb.store.collectives import LedgerView
from tfdist_nb.worker.ledger import Ledger, Op


def _second(steps: int, ops: int) -> Ledger:
    """A ledger holding one second of a loop of ``steps`` calls of a traced step."""
    step = tuple(Op("all_reduce", 2, 1 + (j % 2), "float32", (128, 256 // (j + 1)),
                    131072 // (j + 1), f"cell 3 line {9 + j}") for j in range(ops))
    ledger = Ledger()
    for call in range(1, steps + 1):
        ledger.close(ledger.enter(step, "train_step", call=call, called_at="cell 3 line 20"))
    return ledger


def _one(steps: int, ops: int, folded: bool) -> dict[str, float]:
    ledger = _second(steps, ops)
    t0 = time.perf_counter()
    if folded:
        message: Any = ledger.drain()
    else:  # as before: the same rows, every one whole
        rows = ledger.recent()
        message = {"rows": rows, "issued": len(rows), "counts": {}, "more": False}
    text = json.dumps(message)
    t1 = time.perf_counter()
    view = LedgerView()
    view.update(json.loads(text))
    t2 = time.perf_counter()
    assert len(view.recent()) == steps * ops
    return {"bytes": len(text), "task_ms": (t1 - t0) * 1e3, "controller_ms": (t2 - t1) * 1e3}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps-per-s", type=int, default=200)
    parser.add_argument("--ops", type=int, default=3, help="collectives per step")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat = 3
    # the two forms carry the same rows (checked once, not timed)
    ledger = _second(args.steps_per_s, args.ops)
    drained = json.loads(json.dumps(ledger.drain()))
    assert len(fold(ledger.recent())[1]) >= 1 and drained["runs"]
    results: dict[str, Any] = {"steps_per_s": args.steps_per_s, "ops": args.ops}
    for name, folded in (("rows", False), ("runs", True)):
        runs = [_one(args.steps_per_s, args.ops, folded) for _ in range(args.repeat)]
        results[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    rows, runs = results["rows"], results["runs"]
    results["ratio"] = {k: runs[k] / rows[k] for k in rows}
    print(f"one second at {args.steps_per_s} steps/s, {args.ops} collectives a step "
          f"({args.steps_per_s * args.ops} rows)")
    print("                    rows (before)    runs (now)    ratio")
    for key, label in (("bytes", "bytes"), ("task_ms", "task: drain + encode (ms)"),
                       ("controller_ms", "controller: decode + update (ms)")):
        print(f"{label:34s} {rows[key]:10.1f} {runs[key]:12.1f} {results['ratio'][key]:8.3f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
