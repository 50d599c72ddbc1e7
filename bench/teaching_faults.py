"""How often the workshop's two fragile moments go as the text promises, over N runs each: the
profiler capture of notebook 05 (TensorFlow's profiler can kill a task while collecting) and the
OOM injection of notebook 09 (the task must die in the training cell, named as out of memory,
never while idle before it).

    python -m bench.teaching_faults [--runs 20] [--only profile oom] [--json PATH]

Each part uses the notebook's own cells (read from examples/), on one 2-worker cluster restarted
between runs, through the ``Cluster`` API the magics call.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def cells(name: str) -> list[str]:
    nb = json.loads((EXAMPLES / name).read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def body(cell: str) -> str:
    """A ``%%tfcluster`` cell without its magic line."""
    return cell.split("\n", 1)[1] if cell.startswith("%%tfcluster") else cell


def said(result: Any) -> str:
    """What the cell's output says: the summary and each failed task's explanation."""
    return "\n".join([result.summary(), *(t.explanation or "" for t in result.failed)])


def profile_runs(runs: int) -> dict[str, Any]:
    from tfdist_nb import Cluster

    code = cells("05_input_pipeline.ipynb")
    setup = body(next(c for c in code if "def pipeline" in c))
    armed = code.index(next(c for c in code if c.startswith("%tfdist_profile")))
    training = body(code[armed + 1])
    crashes, named, ok, took, seen = 0, 0, 0, [], []
    with Cluster(workers=2) as c:
        assert c.run(setup).ok
        for _ in range(runs):
            t0 = time.perf_counter()
            c.profile(duration_ms=1500)
            r = c.run(training)
            took.append(time.perf_counter() - t0)
            if r.ok:
                ok += 1
                continue
            crashes += 1
            named += "TensorFlow's profiler" in said(r)
            seen.append(said(r)[:600])
            c.restart()
            assert c.run(setup).ok
    return {"runs": runs, "ok": ok, "task_killed": crashes, "said_to_be_the_profiler": named,
            "median_s": sorted(took)[len(took) // 2], "what_was_said": seen}


def oom_runs(runs: int) -> dict[str, Any]:
    from tfdist_nb import Cluster

    code = cells("09_crash_oom_recovery.ipynb")
    script = next(c for c in code if c.startswith("%%writefile")).split("\n", 1)[1]
    outcomes: dict[str, int] = {"died_in_training_named_oom": 0, "died_other": 0,
                                "survived": 0, "dead_before_the_cell": 0}
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "train.py").write_text(script.replace("tfdist-09-backup",
                                                        str(Path(tmp, "backup"))))
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            with Cluster(workers=2, env={"TF_USE_LEGACY_KERAS": "1"}) as c:
                for _ in range(runs):
                    shutil.rmtree(Path(tmp, "backup"), ignore_errors=True)  # as 09 starts
                    c.inject("clear", on="all")
                    c.restart()
                    c.inject("oom", on=1, limit_mb=600, at_step=12)
                    time.sleep(1.0)  # a student reading the next cell: idle, must not die
                    if any(t.state == "dead" for t in c.snapshot().tasks):
                        outcomes["dead_before_the_cell"] += 1
                        continue
                    r = c.run("%run train.py")
                    text = said(r)
                    if r.ok:
                        outcomes["survived"] += 1
                    elif "worker:1" in text and "out of memory" in text:
                        outcomes["died_in_training_named_oom"] += 1
                    else:
                        outcomes["died_other"] += 1
        finally:
            os.chdir(cwd)
    return {"runs": runs, **outcomes}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--only", nargs="+", choices=["profile", "oom"], default=["profile", "oom"])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {}
    for part in args.only:
        out[part] = (profile_runs if part == "profile" else oom_runs)(args.runs)
        print(part, json.dumps(out[part]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
