"""The workshop's exercises (docs/workshop.md) work when done as written (issue 41): each runs in
a notebook kernel as a student runs it, the notebook's cells up to where the exercise says to
start (or the whole notebook, as after "Run All"), then the exercise's own code, taken from the
code boxes under its heading in docs/workshop.md, and shows what the facilitator's guide
(docs/facilitator.md) gives as its answer. The mystery round's faults, from the guide's table,
are found as the guide says. Each test prints the exercise cells' wall times: how the plan's
exercise minutes were checked."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.notebooks import cell_html, cell_seconds, cell_text, errors_of, run_notebook

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[1]
WORKSHOP = (REPO / "docs" / "workshop.md").read_text()
FACILITATOR = (REPO / "docs" / "facilitator.md").read_text()
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def code(name: str) -> list[str]:
    """The code cells of ``examples/<name>.ipynb``, in order."""
    nb = nbformat.read(REPO / "examples" / f"{name}.ipynb", as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def cell(name: str, needle: str) -> str:
    found = [src for src in code(name) if needle in src]
    assert len(found) == 1, (name, needle, len(found))
    return found[0]


def boxes(exercise: str) -> list[str]:
    """The code boxes under ``### Exercise <exercise> (`` in docs/workshop.md, in order."""
    start = WORKSHOP.index(f"### Exercise {exercise} (")
    end = WORKSHOP.find("\n#", start + 1)
    found = [b.rstrip("\n") for b in FENCE.findall(WORKSHOP[start:end if end > 0 else None])]
    assert found, exercise
    return found


def changed(source: str, old_line: str, new_line: str) -> str:
    """``source`` with its line containing ``old_line`` replaced by ``new_line`` (one line, as a
    student edits it)."""
    lines = source.splitlines()
    hits = [i for i, line in enumerate(lines) if old_line in line]
    assert len(hits) == 1, (old_line, source)
    lines[hits[0]] = new_line
    return "\n".join(lines)


def run(cells: list[str], tmp_path: Path, first: int) -> list[Any]:
    """Run ``cells`` (errors kept) in a notebook kernel, the cluster stopped at the end; the
    executed code cells. Prints the wall time of the cells from ``first`` on (the exercise's)."""
    nb = run_notebook([*cells, "%tfdist_stop"], tmp_path)
    done = [c for c in nb.cells if c.cell_type == "code"][:-1]
    took = sum(cell_seconds(c) for c in done[first:])
    print(f"exercise cells: {took:.1f} s; all cells: {sum(cell_seconds(c) for c in done):.1f} s")
    for c in done[first:]:  # what the student sees (pytest -s shows it)
        print(f"----- {cell_seconds(c):.1f} s: {c.source.splitlines()[0]}\n{cell_text(c, True)}")
    return done


def text(c: Any) -> str:
    return cell_text(c, errors=True)


def answer(needle: str) -> None:
    """What the test finds is what the facilitator's guide gives as the answer."""
    assert needle in " ".join(FACILITATOR.split()), needle


@pytest.mark.timeout(240)
def test_exercise_1_resize(tmp_path: Path) -> None:
    nb = code("01_quickstart")
    three = boxes("1")[0]
    setup = nb[1]
    resized = changed(setup, "%%tfcluster 2 workers", three)
    out = run([nb[0], setup, resized], tmp_path, 2)
    said = text(out[-1])
    assert not errors_of(out[-1]), said
    assert "resized: 2 workers -> 3 workers" in said
    for task in ("worker:0", "worker:1", "worker:2"):
        assert f"[{task}] replicas in sync: 3" in said
    answer("resized: 2 workers -> 3 workers")


@pytest.mark.timeout(120)
def test_exercise_2_tf_configs(tmp_path: Path) -> None:
    nb = code("02_tf_config_errors")
    out = run([nb[0], nb[1], boxes("2")[0]], tmp_path, 2)
    said = text(out[-1])
    for needle in ("task.index: 1 is out of range for chief (it has 1)",
                   "cluster.ps: ps tasks without workers (add 'worker' addresses)",
                   "task.index: '1' must be a non-negative integer"):
        assert needle in said, said
        answer(needle)


@pytest.mark.timeout(240)
def test_exercise_3_one_more_variable(tmp_path: Path) -> None:
    name = "03_environment_mismatch"
    fix = cell(name, "%%tfcluster 2 workers --env TF_USE_LEGACY_KERAS=1")
    out = run([code(name)[0], fix, boxes("3")[0], "%tfdist_env", "%tfdist_check env"],
              tmp_path, 2)
    env, check = text(out[-2]), text(out[-1])
    assert re.search(r"\$TF_FORCE_GPU_ALLOW_GROWTH\s+true\s+NaN\s+True", env), env
    assert "1 difference(s): $TF_FORCE_GPU_ALLOW_GROWTH" in check, check
    answer("1 difference(s): $TF_FORCE_GPU_ALLOW_GROWTH")


@pytest.mark.timeout(240)
def test_exercise_4_bad_shard_on_the_other_task(tmp_path: Path) -> None:
    name = "04_data_sharding"
    nb = code(name)
    again = nb[-3:-1]  # section 4's last two cells
    assert "by_data = distributed" in again[0] and "%tfdist_check sharding by_data" in again[1]
    out = run([*nb[:-1], boxes("4")[0], *again], tmp_path, len(nb) - 1)
    alert, table = text(out[-2]), out[-1]
    assert "[worker:0] tfdist_nb: input not sharded" in alert, alert
    assert "[worker:1] tfdist_nb: input not sharded" not in alert, alert
    assert "examples per task: {'worker:0': 64, 'worker:1': 32}" in text(table)
    rows = {t: r for r in cell_html(table).split("<tr")
            for t in ("worker:0", "worker:1") if f">{t}<" in r}
    assert ">OFF<" in rows["worker:0"] and ">DATA<" in rows["worker:1"], rows
    answer("{'worker:0': 64, 'worker:1': 32}")


@pytest.mark.timeout(240)
def test_exercise_5_the_nan_on_the_other_task_after_run_all(tmp_path: Path) -> None:
    """After "Run All" (the last cell stopped the cluster): the first line starts one."""
    name = "08_nan_and_divergence"
    nb = code(name)
    restart, record = boxes("5")
    setup = changed(nb[1], "y[75] = -1.0", record)
    out = run([*nb, restart, setup, "%tfdist_numerics on",
               cell(name, "%%tfcluster --stall-timeout 6")], tmp_path, len(nb))
    said = text(out[-1])
    assert "NaN/Inf first produced on worker:1 by op Log" in said, said
    answer("NaN/Inf first produced on worker:1 by op Log")


@pytest.mark.timeout(240)
def test_exercise_5b_a_post_mortem_finds_the_record(tmp_path: Path) -> None:
    """Exercise 5 (from a cell up to its setup), then the debugger in the task that raised."""
    name = "08_nan_and_divergence"
    nb = code(name)
    restart, record = boxes("5")
    setup = changed(nb[1], "y[75] = -1.0", record)
    out = run([nb[0], restart, setup, "%tfdist_numerics on",
               cell(name, "%%tfcluster --stall-timeout 6"), *boxes("5b")], tmp_path, 5)
    said = text(out[-1])
    assert not errors_of(out[-1]), said
    for needle in ("[worker:1] ipdb> p step\n[worker:1] 6\n",
                   "[worker:1] ipdb> p int(tf.argmin(yb.values[0][:, 0]))\n[worker:1] 7\n"):
        assert needle in said, said
    answer("step `6`, row `7`, record 215")


@pytest.mark.timeout(240)
def test_exercise_6_a_straggler_in_its_step(tmp_path: Path) -> None:
    name = "07_straggler"
    nb = code(name)
    inject, clear = boxes("6")
    training = "%%tfcluster\ntrain(30)"
    assert training in nb
    out = run([*nb[:-1], inject, training, clear], tmp_path, len(nb) - 1)
    said = text(out[-2])
    lag = re.search(r"\[worker:0\] tfdist_nb: worker:0 is a straggler: the others wait (\d+) ms",
                    said)
    assert lag and 60 <= int(lag.group(1)) <= 250, said
    took = {t: float(s) for t, s in re.findall(r"\[(worker:[01])\] 30 steps in ([\d.]+) s", said)}
    assert min(took.values()) >= 2.5, took  # 30 x 0.1 s: worker:1 too, which has no delay
    answer("worker:0 is a straggler")


@pytest.mark.timeout(360)
def test_exercise_7_the_slow_reader_on_the_other_task(tmp_path: Path) -> None:
    name = "05_input_pipeline"
    nb = [src for src in code(name) if not src.startswith("%tfdist_profile")]  # see test_05
    restart, slow = boxes("7")
    setup = changed(nb[1], 'slow_disk = tw.task == ("worker", 1)', slow)
    out = run([*nb[:-1], restart, setup, "%%tfcluster\ntrain(pipeline())"], tmp_path,
              len(nb) - 1)
    said = text(out[-1])
    assert "[worker:0] tfdist_nb: worker:0 is a straggler" in said, said
    assert "cause: its input pipeline" in said
    answer("worker:0 is a straggler")


@pytest.mark.timeout(240)
def test_exercise_8_the_other_task_raises(tmp_path: Path) -> None:
    """Cell by cell: section 1, the exercise, then on with section 2 as the notebook goes."""
    name = "06_deadlock_stall"
    nb = code(name)
    training = cell(name, "%%tfcluster 2 workers --stall-timeout 120")
    assert nb[2] == training and nb[3].startswith("%tfdist_collectives")
    out = run([*nb[:4], boxes("8")[0], training, *nb[4:8]], tmp_path, 4)
    said = text(out[5])
    assert re.search(r"worker:0 failed \(InjectedFault: tfdist_nb injected fault: this task "
                     r"raised at step 5\)", said), said
    assert "worker:1 aborted" in said
    assert cell_seconds(out[5]) < 30
    assert "[worker:0] done 20 steps" in text(out[-1])  # section 2's fix, after the exercise
    answer("worker:0 failed (InjectedFault")


@pytest.mark.timeout(300)
def test_exercise_8b_even_steps_then_a_branch_in_the_traced_function(tmp_path: Path) -> None:
    name = "06_deadlock_stall"
    nb = code(name)
    uneven = cell(name, "for batch in tw.timed(local):")
    at = nb.index(uneven)
    again, loop, clear, branch = boxes("8b")
    assert nb[at - 1].splitlines()[1] == again.splitlines()[1]  # the same fault as section 3's
    even = changed(uneven, "for batch in tw.timed(local):", loop)
    out = run([*nb[:at + 1], again, even, clear, branch], tmp_path, at + 1)
    said = text(out[-3])
    assert not errors_of(out[-3]), said
    assert "[worker:0] done 6 steps" in said and "[worker:1] done 6 steps" in said
    said = text(out[-1])
    assert "tf.function 'train_step' issues different collectives on different tasks" in said, said
    answer("issues different collectives on different tasks")


@pytest.mark.timeout(300)
def test_exercise_9_a_later_crash_resumes_later_after_run_all(tmp_path: Path) -> None:
    """After "Run All": the last cell deleted the script; the %%writefile cell writes it again."""
    name = "09_crash_oom_recovery"
    nb = code(name)
    script = cell(name, "%%writefile tfdist-09-train.py")
    training = "%%tfcluster\n%run tfdist-09-train.py"
    inject, restart = boxes("9")
    out = run([*nb, script, inject, training, restart, training], tmp_path, len(nb))
    crashed, resumed = text(out[-3]), text(out[-1])
    assert "worker:1 killed by SIGKILL" in crashed and "[worker:0] Epoch 5/6" in crashed, crashed
    assert "Epoch 6/6" not in crashed
    assert "[worker:0] Epoch 5/6" in resumed and "Epoch 4/6" not in resumed, resumed
    assert "[worker:0] this run trained epochs 5-6 of 6" in resumed
    answer("Epoch 5/6")


@pytest.mark.timeout(300)
def test_exercise_10_the_bad_element_in_the_other_share(tmp_path: Path) -> None:
    name = "11_isolate"
    nb = code(name)
    bug = cell(name, "x == 14")
    moved = changed(bug, "x == 14", boxes("10")[0])
    at = nb.index(bug)
    out = run([*nb[:at + 2], moved, nb[at + 1]], tmp_path, at + 2)
    said = text(out[-1])
    assert "fails on worker:0's share alone" in said, said
    assert (tmp_path / "repro-data" / "launch.sh").exists()
    answer("fails on worker:0's share alone")


@pytest.mark.timeout(240)
def test_exercise_11_a_parameter_server_job_loses_the_other_worker(tmp_path: Path) -> None:
    name = "10_parameter_server"
    nb = code(name)
    out = run([*nb[:-1], boxes("11")[0], "%%tfcluster\ntrain(10)"], tmp_path, len(nb) - 1)
    said = text(out[-1])
    assert "Worker /job:worker/replica:0/task:0 failed" in said, said
    assert "[chief:0] round 10: loss" in said
    answer("Worker /job:worker/replica:0/task:0 failed")


# The mystery round (docs/facilitator.md): before each, fresh kernels and the setup cell; the
# hidden line; then the training cell. (fault line, the cell that trains, what gives it away)
TRAIN = "%%tfcluster --stall-timeout 6\n"
MYSTERIES = [
    ("%tfdist_inject straggler --on 1 --seconds 0.3", "train(30)",
     [r"worker:1 is a straggler: the others wait [23]\d\d ms"]),
    ("%tfdist_inject hang --on 0 --at-step 10", "train(30)",
     [r"worker:0 made no progress .* running Python code .*inject\.py",
      r"collectives: worker:0 never entered all_reduce .*; worker:1 in all_reduce"]),
    ("%tfdist_inject crash --on 1 --at-step 10", "train(30)",
     [r"worker:1 killed by SIGKILL", r"worker:0 aborted"]),
    ("%tfdist_inject oom --on 0 --limit-mb 300 --at-step 10", "train(30)",
     [r"worker:0 killed by SIGKILL: likely out of memory \(its last RSS was \d+ MB against its "
      r"own limit"]),
    ("%tfdist_inject bad-shard --on 1",
     "ds = strategy.experimental_distribute_dataset(tf.data.Dataset.range(10**6).batch(4))\n"
     "train(30)",
     [r"\[worker:1\] tfdist_nb: input not sharded"]),
]


@pytest.mark.timeout(420)
def test_the_mystery_round(tmp_path: Path) -> None:
    name = "07_straggler"
    nb = code(name)
    cells = [nb[0], nb[1]]
    assert TRAIN + "train(30)" in FACILITATOR
    for line, train, _ in MYSTERIES:
        assert line in FACILITATOR and train.splitlines()[0] in FACILITATOR, line
        cells += ["%tfdist_restart", nb[1], line, TRAIN + train]
    out = run(cells, tmp_path, 2)
    trained = out[5::4]
    assert len(trained) == len(MYSTERIES)
    for (line, _, gives_away), c in zip(MYSTERIES, trained, strict=True):
        said = text(c)
        for needle in gives_away:
            assert re.search(needle, said), (line, said)
