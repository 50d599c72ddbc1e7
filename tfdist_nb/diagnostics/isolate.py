"""Which variant of a failing cell to run next, and what the outcomes say (docs/reference.md,
Isolate; docs/shrink-and-isolate.md). Pure: no process is started here.

The walk answers three questions in the order that answers them fastest, and stops when the
answer is clear:

1. Does the cell fail again, unchanged, in fresh kernels? If not, it is flaky.
2. Does it fail on one task? If not, and a task other than task 0 failed on its own in the
   cell's run, does it fail on that task's share alone (1 worker runs as task 0: what another
   task's index picks, its data or its code path, never runs there)? If so, that task's data.
   If not, it needs several: a distributed bug (the fewest workers it needs, by bisection, and
   whether it also fails with the job's replicas in one process without multi-worker
   collectives, eagerly, or with another collective implementation).
3. If it does: on which task's share of the data (each task alone, without multi-worker
   collectives), and does it fail eagerly (a traced-function bug if not)?

At the end the smallest failing variant is run once more with fewer steps when the cell's loop
bound can be found (``for step in range(N)``, ``epochs=N``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tfdist_nb.diagnostics.isolate_variants import (
    Failure,
    Finding,
    Outcome,
    Row,
    Variant,
    eager,
    fewer,
    fewer_steps,
    implementation,
    mirrored,
    same,
    share_alone,
    share_alone_key,
    shares,
)
from tfdist_nb.topology import ClusterSpec

NOT_RUN = "the next variant did not run"  # why a verdict is unknown


# ---------------------------------------------------------------------------- the walk
@dataclass
class Walk:
    """The variants to run, one at a time: ``next()`` says which (None: done), ``record()`` takes
    its rows, ``verdict`` says what they show. ``gpus``: the tasks have GPUs (NCCL is an
    alternative implementation; on CPUs AUTO is RING and there is none)."""

    spec: ClusterSpec
    failure: Failure
    bound: int | None = None  # the failing cell's loop bound, when found
    bound_counts_steps: bool = True  # False: epochs, which tw.steps_done() does not count
    gpus: bool = False
    implementation_used: str | None = None
    rows: list[Row] = field(default_factory=list)
    stopped: str | None = None  # why the walk ended early (budget, interrupt)
    _done: dict[str, list[Row]] = field(default_factory=dict)

    # ---- state
    def outcome(self, key: str) -> Outcome | None:
        rows = self._done.get(key)
        if not rows:
            return None
        return Outcome.FAILS if any(r.outcome is Outcome.FAILS for r in rows) else rows[0].outcome

    def record(self, rows: list[Row]) -> None:
        self.rows.extend(rows)
        self._done[rows[0].variant.key] = rows
        if any(r.outcome is Outcome.INTERRUPTED for r in rows):
            self.stopped = "interrupted"

    @property
    def tasks(self) -> int:
        return len(self.spec.tasks)

    @property
    def variants_run(self) -> int:
        return len(self._done)

    def needs(self) -> int | None:
        """The fewest tasks with which it was seen to fail, if any."""
        return next((n for n in range(1, self.tasks + 1) if self.outcome(
            "same" if n == self.tasks else f"tasks={n}") is Outcome.FAILS), None)

    def failing_shares(self) -> list[Row]:
        return [r for r in self._done.get("shares", []) if r.outcome is Outcome.FAILS]

    def failing_alone(self) -> str | None:
        """The task whose identity and share run alone when 1 worker does not fail the same
        way: the first, in task order, that failed on its own in the cell's run (``ON_ITS_OWN``;
        a task released from a hang another task caused never counts). None when none did, or
        when that is task 0: 1 worker already ran as task 0 (reading all the data), and when
        task 0 fails on its own too, as both sides of a mismatched collective do, how the tasks
        work together is the likelier cause. Only the first is run, not each: every share alone
        costs a fresh task before the distributed questions, and one task's bad data leaves the
        others released, not failing on their own; its share failing is the answer, passing
        sends the walk on to the distributed questions."""
        own = set(self.failure.on_its_own)
        first = next((str(t) for t in self.spec.tasks if str(t) in own), None)
        return None if first is None or first == str(self.spec.tasks[0]) else first

    def fails_alone(self) -> bool:
        """Whether the task that failed on its own fails on its share alone (TASK_DATA)."""
        task = self.failing_alone()
        return task is not None and self.outcome(share_alone_key(task)) is Outcome.FAILS

    # ---- what to run
    def next(self) -> Variant | None:
        if self.stopped:
            return None
        for variant in self._path():
            if variant is None:
                return None
            if variant.key not in self._done:
                return variant
        return None

    def at_most(self) -> int:
        """Variants this walk runs at most, those run included (for the progress line): the
        longest path over every outcome the variants still to run could have."""
        variant = self.next()
        if variant is None:
            return len(self._done)
        longest = 0
        for rows in _hypotheses(variant):
            branch = replace(self, rows=list(self.rows), stopped=None, _done=dict(self._done))
            branch.record(rows)
            longest = max(longest, branch.at_most())
        return longest

    def _path(self) -> Iterable[Variant | None]:
        """The variants in the order they answer, given what is known; None ends the walk."""
        spec = self.spec
        yield same(spec)
        if self.outcome("same") is not Outcome.FAILS:
            yield None
            return
        if self.tasks > 1:
            yield fewer(spec, 1)
            if self.outcome("tasks=1") is Outcome.FAILS:
                yield from self._on_one_task()
            else:
                yield from self._distributed()
        else:
            yield eager(same(spec))
        yield from self._shorter()

    def _on_one_task(self) -> Iterable[Variant | None]:
        spec = self.spec
        yield shares(spec)
        shared = self._done["shares"]
        failing = self.failing_shares()
        if failing and len(failing) < len(shared):
            return  # one task's share: the answer
        if failing:  # every share fails: is it the traced function?
            yield eager(share_alone(spec, str(failing[0].task)))
            return
        yield eager(fewer(spec, 1))  # no share alone fails: the traced function,
        if self.outcome(eager(fewer(spec, 1)).key) is not Outcome.PASSES:
            yield mirrored(spec)  # the data as a whole, or the strategy

    def _distributed(self) -> Iterable[Variant | None]:
        spec = self.spec
        task = self.failing_alone()
        if task is not None:  # 1 worker ran as task 0: what this task's index picks never ran
            yield share_alone(spec, task)
            if self.fails_alone():
                return  # that task's share: the answer, as when one share fails in shares
        passes, fails = 1, self.tasks  # bisect: the fewest workers it fails with
        while fails - passes > 1:
            middle = (passes + fails) // 2
            yield fewer(spec, middle)
            if self.outcome(f"tasks={middle}") is Outcome.FAILS:
                fails = middle
            else:
                passes = middle
        at = same(spec) if fails == self.tasks else fewer(spec, fails)
        yield mirrored(spec)
        if self.outcome("mirrored") is Outcome.FAILS:
            return
        yield eager(at)
        if self.outcome(eager(at).key) is Outcome.PASSES:
            return
        other = self._other_implementation()
        if other is not None:
            yield implementation(at, other)

    def not_tried(self) -> list[str]:
        """Variants the walk would have run here but cannot, and why (said in the report)."""
        distributed = (self.tasks > 1 and self.outcome("tasks=1") not in (None, Outcome.FAILS)
                       and not self.fails_alone())
        if distributed and not self.gpus and self.outcome("mirrored") is not Outcome.FAILS:
            used = (self.implementation_used or "auto").upper()
            runs = {"RING": "RING was used", "AUTO": "AUTO runs RING"}.get(used, f"{used} falls "
                                                                          "back to RING")
            return [f"another collective implementation was not tried: the tasks showed no GPU, "
                    f"and on CPUs {runs} and NCCL needs GPUs"]
        return []

    def _other_implementation(self) -> str | None:
        """NCCL against the RING that AUTO or RING ran on GPUs (TensorFlow picks NCCL only when
        asked: docs/design.md, Facts), RING against NCCL; on CPUs there is no other."""
        return ("ring" if self.implementation_used == "nccl" else "nccl") if self.gpus else None

    def _shorter(self) -> Iterable[Variant | None]:
        smallest = self.smallest()
        if smallest is None or self.bound is None or smallest.variant.steps is not None:
            return
        steps = self.shorter_bound(smallest)
        if steps is not None:
            yield fewer_steps(self.exportable(smallest), steps)

    def shorter_bound(self, row: Row) -> int | None:
        """The loop bound to try: the steps the failing task entered (``tw.step()`` counts the
        step that raised), when known and fewer than the bound; half the bound otherwise."""
        assert self.bound is not None
        done = row.steps_done if row.steps_done is not None else self.failure.steps_done
        if done is not None and self.bound_counts_steps and 1 <= done < self.bound:
            return done
        return self.bound // 2 if self.bound >= 2 else None

    # ---- what it shows
    def smallest(self) -> Row | None:
        """The failing row with the fewest tasks, then the least data (a share), then the
        fewest steps, then the earliest."""
        failing = [r for r in self.rows if r.outcome is Outcome.FAILS]
        if not failing:
            return None

        def size(r: Row) -> tuple[int, int, int]:
            alone = r.task is not None or r.variant.as_task is not None
            return (r.tasks, 0 if alone else 1, r.variant.steps or 1 << 30)
        return min(failing, key=size)

    def exportable(self, row: Row) -> Variant:
        """The variant that reruns ``row`` alone: a share row becomes that task alone."""
        if row.task is not None:
            return share_alone(self.spec, row.task)
        return row.variant

    def verdict(self) -> str:
        """The one sentence the outcomes support, with the evidence in brackets."""
        said = self._headline()[1]
        if self.stopped and self.stopped != "done":
            said += f" ({self.stopped} after {len(self._done)} variant(s))"
        return said

    def finding(self) -> Finding:
        return self._headline()[0]

    def _headline(self) -> tuple[Finding, str]:
        got = self.outcome
        first = got("same")
        if first is None:
            return Finding.NO_ANSWER, "no answer: no variant ran"
        if first is Outcome.PASSES:
            return Finding.FLAKY, ("flaky: it failed in your run and passed when re-run "
                                   "unchanged in fresh kernels")
        if first is not Outcome.FAILS:
            return Finding.NOT_REPRODUCED, (
                f"not reproduced: re-run unchanged in fresh kernels it {self._said('same')}; "
                "isolate needs a failure that repeats")
        if self.tasks == 1:
            return self._eagerly(eager(same(self.spec)).key, "1 worker")
        if got("tasks=1") is None:
            return Finding.UNKNOWN, f"fails again with {self.spec}; {NOT_RUN}"
        if got("tasks=1") is not Outcome.FAILS:
            return self._distributed_verdict()
        return self._one_task_verdict()

    def _distributed_verdict(self) -> tuple[Finding, str]:
        got = self.outcome
        needs = self.needs() or self.tasks
        with_one = self._said("tasks=1")  # only called once it ran
        alone_said = ""
        task = self.failing_alone()
        if task is not None:  # run before anything distributed (Walk._distributed)
            alone = got(share_alone_key(task))
            if alone is Outcome.FAILS:
                return self._task_alone(task, with_one)
            if alone is None or alone is Outcome.INTERRUPTED:  # stopped before it answered
                ended = "was interrupted" if alone else "did not run"
                return Finding.UNKNOWN, (
                    f"with 1 worker it {with_one}; {task} failed on its own in your run: the "
                    f"next variant, its share alone, {ended}")
            alone_said = f"; {task}'s share alone {self._said(share_alone_key(task))}"
        head = f"needs {needs} or more workers: a distributed bug (with 1 worker it {with_one}"
        if got("mirrored") is Outcome.FAILS:
            return Finding.PER_REPLICA, (
                f"needs {self.tasks} replicas, also in one process without multi-worker "
                "collectives: the per-replica code (how the batch is split, code run in the "
                f"replica context) (with 1 worker it {with_one}; MirroredStrategy on {self.tasks} "
                f"CPU devices fails the same way{alone_said})")
        if got("mirrored") is Outcome.PASSES:
            head += (f"; the {self.tasks} replicas in one process pass: it is in how the tasks "
                     "work together")
        at = same(self.spec) if needs == self.tasks else fewer(self.spec, needs)
        if got(eager(at).key) is Outcome.PASSES:
            return Finding.TRACES_DIFFER, (
                f"needs {needs} or more workers and passes eagerly: the tasks trace different "
                f"functions or collectives (with 1 worker it {with_one}{alone_said})")
        other = self._other_implementation()
        if other and got(implementation(at, other).key) is Outcome.PASSES:
            return Finding.COLLECTIVE_IMPLEMENTATION, (
                f"needs {needs} or more workers and passes with implementation={other.upper()}: "
                f"the collective implementation {(self.implementation_used or 'auto').upper()}"
                f"{' (RING on GPUs)' if other == 'nccl' else ''} (with 1 worker it "
                f"{with_one}{alone_said})")
        return Finding.DISTRIBUTED, head + alone_said + ")"

    def _task_alone(self, task: str, with_one: str) -> tuple[Finding, str]:
        """One task's share fails alone though 1 worker (task 0) does not: its data, as when
        one share of several fails (``_one_task``)."""
        own = [str(t) for t in self.spec.tasks if str(t) in self.failure.on_its_own]
        who = (f"only {task} failed on its own" if own == [task]
               else f"{', '.join(own)} failed on their own")
        return Finding.TASK_DATA, (
            f"fails on {task}'s share alone: that task's data (or its own code path); in your "
            f"run {who}, and with 1 worker (as {self.spec.tasks[0]}) it {with_one}")

    def _one_task_verdict(self) -> tuple[Finding, str]:
        got = self.outcome
        shared = self._done.get("shares")
        if shared is None:
            return Finding.UNKNOWN, f"fails with 1 worker too: not a distributed bug; {NOT_RUN}"
        failing = self.failing_shares()
        if failing and len(failing) < len(shared):
            names = ", ".join(f"{r.task}'s" for r in failing)
            others = "; ".join(f"{r.task}'s {r.outcome}" + (f" ({r.error})" if r.error and
                                                              r.outcome is not Outcome.PASSES
                                                              else "")
                               for r in shared if r.outcome is not Outcome.FAILS)
            return Finding.TASK_DATA, (
                f"fails on {names} share alone: that task's data (or its own code path); alone, "
                f"{others}")
        if failing:
            alone = eager(share_alone(self.spec, str(failing[0].task))).key
            return self._eagerly(alone, "each task's share alone")
        if got(eager(fewer(self.spec, 1)).key) is Outcome.PASSES:
            return self._eagerly(eager(fewer(self.spec, 1)).key, "1 worker")
        if got("mirrored") is Outcome.FAILS:
            return Finding.DATA_AS_A_WHOLE, (
                "fails on one task with MirroredStrategy and all the data, but on no task's "
                "share alone: the data as a whole (an element no single share holds in that "
                "order, or more steps than a share has)")
        return Finding.STRATEGY_CODE_PATH, (
            "fails with MultiWorkerMirroredStrategy even on 1 worker, not with MirroredStrategy: "
            "the multi-worker strategy's own code path")

    def _eagerly(self, key: str, where: str) -> tuple[Finding, str]:
        got = self.outcome(key)
        if got is Outcome.PASSES:
            return Finding.TRACED_FUNCTION, (
                f"passes eagerly: a difference in the traced function (fails on {where} as a "
                "tf.function, passes with tf.config.run_functions_eagerly(True))")
        if got is Outcome.FAILS:
            return Finding.MODEL_OR_PIPELINE, (
                f"fails on {where} without multi-worker collectives, also eagerly: a bug in the "
                "model or the input pipeline, not in distribution")
        if got is None:
            return Finding.UNKNOWN, f"fails on {where}; {NOT_RUN}"
        return Finding.UNKNOWN, f"fails on {where}; eagerly it {self._said(key)}"

    def _said(self, key: str) -> str:
        """How variant ``key`` ended, in a sentence: its outcome's verb, and its first error
        line unless it passed."""
        got = self.outcome(key) or Outcome.PASSES
        line = next((r.error for r in self._done.get(key, []) if r.error), "no error line")
        return got.verb if got is Outcome.PASSES else f"{got.verb} ({line})"

def _hypotheses(variant: Variant) -> list[list[Row]]:
    """The outcomes a variant could have, for the progress line's count: fails or passes (for
    ``shares``: every task, no task, or one task fails)."""
    if not variant.shares:
        return [[Row(variant, o, 0.0)] for o in (Outcome.FAILS, Outcome.PASSES)]
    tasks = [str(t) for t in variant.spec.tasks]
    return [[Row(variant, pick(i), 0.0, task=t) for i, t in enumerate(tasks)]
            for pick in (lambda i: Outcome.FAILS, lambda i: Outcome.PASSES,
                         lambda i: Outcome.FAILS if i == len(tasks) - 1 else Outcome.PASSES)]
