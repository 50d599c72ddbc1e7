"""``%tfdist_isolate`` / ``Cluster.isolate()`` (docs/reference.md, Isolate): re-run a failing cell,
with the cells that set its tasks up, in fresh kernels under smaller variants, and name the
smallest variant that still fails.

Which variant comes next and what the outcomes mean is decided by the pure walk
(:mod:`tfdist_nb.diagnostics.isolate`); this module runs each variant as a cluster of its own
(the user's cluster is left as it was), bounded by the time budget, and builds the report. Each
variant starts with a prelude cell (``tfdist_nb/worker/isolate_prelude.py``) that applies it:
the strategy in place of MultiWorkerMirroredStrategy, eager functions, a collective timeout. With
spare kernels the variants take the pool of their kernel key from the session (the user's
cluster's, if it has one) and keep it for the next variant, as a resize does.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tfdist_nb.cluster.export import ExportError, restart_times
from tfdist_nb.cluster.export import export as export_reproducer
from tfdist_nb.cluster.session import SESSION
from tfdist_nb.debuglog import swallowed
from tfdist_nb.diagnostics.cell_edits import (
    LoopBound,
    implementation_named,
    loop_bound,
    prelude_code,
    with_bound,
)
from tfdist_nb.diagnostics.isolate import Walk
from tfdist_nb.diagnostics.isolate_report import IsolateReport, Ran
from tfdist_nb.diagnostics.isolate_variants import (
    Outcome,
    Row,
    Variant,
    failure_of,
    judge,
    share_alone,
)
from tfdist_nb.errors import ClusterStartError, SpecError, TfdistError
from tfdist_nb.events import CellRecord
from tfdist_nb.results import RunResult, TaskStatus
from tfdist_nb.topology import ClusterSpec, Targets

if TYPE_CHECKING:
    from tfdist_nb.cluster.hub import EventHub
    from tfdist_nb.cluster.task import TaskRuntime
    from tfdist_nb.gpu_plan import GpuRequest
    from tfdist_nb.launchers.base import Launcher
    from tfdist_nb.store.rundir import RunDirectory
    from tfdist_nb.store.tails import LiveStore
    from tfdist_nb.topology import TaskId

logger = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 300.0
#: A variant is not started with less than this left of the budget.
MIN_VARIANT_S = 8.0
#: A cell of a variant may take this much longer than the failing cell took (and at least
#: MIN_CELL_S): enough for a fresh strategy and the first traces, short of a hang.
CELL_FACTOR, CELL_EXTRA_S, MIN_CELL_S = 3.0, 15.0, 30.0
PROBE_S = 10.0
#: Kept from a variant's time for stopping its cluster, so the whole call ends within budget.
STOP_RESERVE_S = 3.0
STEPS_PROBE = "import tfdist_nb.worker as _tw; print('tfdist_isolate_steps', _tw.steps_done())"


class Cluster(Protocol):
    """What isolating uses of the user's cluster and a variant's: the facade's ``Cluster``,
    named by what is used so that this module sits below the facade."""

    id: str
    running: bool
    rundir: RunDirectory | None
    hub: EventHub | None
    live: LiveStore
    tasks: dict[TaskId, TaskRuntime]
    stall_timeout: float
    launcher_options: dict[str, Any]
    gpu_request: GpuRequest
    spec: ClusterSpec
    launcher: Launcher
    python: str
    preload: tuple[str, ...]
    extra_env: dict[str, str]
    start_timeout: float

    @property
    def warm(self) -> int: ...
    @property
    def run_dir(self) -> Path | None: ...
    @property
    def failed_cells(self) -> dict[int, tuple[RunResult, str]]: ...
    @property
    def passed_cells(self) -> set[int]: ...
    def start(self, *, announce: bool = True) -> object: ...
    def stop(self, *, keep_spares: bool = False) -> object: ...
    def run(self, code: str, on: Targets = None, timeout: float | None = None) -> RunResult: ...


class Isolation:
    """One ``isolate()`` call: the failing cell, the cells before it, the walk and the budget."""

    def __init__(self, cluster: Cluster, make: Callable[..., Cluster], cell: int | None = None,
                 budget_s: float = DEFAULT_BUDGET_S, warm: bool | None = None,
                 on_progress: Callable[[str], None] | None = None) -> None:
        if not budget_s > 0 or budget_s == float("inf"):
            raise SpecError(f"the budget is a positive number of seconds, not {budget_s!r}")
        if cluster.launcher.remote:
            raise SpecError(f"isolate starts its variants on this machine with the local "
                            f"launcher; this cluster's tasks run elsewhere "
                            f"({cluster.launcher.name}): "
                            "%tfdist_export its reproducer and shrink it there "
                            "(docs/shrink-and-isolate.md)")
        spec = cluster.spec
        if spec.ps or spec.evaluator:
            raise SpecError(f"isolate shrinks clusters of workers (and a chief) that run "
                            f"MultiWorkerMirroredStrategy; {spec} has ps or evaluator tasks: "
                            "shrink it by hand (docs/shrink-and-isolate.md)")
        self.cluster, self.make = cluster, make
        self.budget_s = float(budget_s)
        self.warm = cluster.warm > 0 if warm is None else bool(warm)
        self.progress = on_progress or (lambda text: None)
        self.cell, result, self.code = self._failing(cell)
        assert cluster.rundir is not None  # it ran the failing cell
        self.history = cluster.rundir.cells()
        #: the failing cell's record in the run directory (when and where it ran)
        self.failed_rec = next((c for c in self.history if c["cell"] == self.cell), None)
        self.setup = self._setup_cells()
        self.failure = failure_of(result)
        self.bound: LoopBound | None = loop_bound(self.code, [c["code"] for c in self.setup])
        # what the tasks showed: their strategies' own word (Finding.STRATEGY), else the code
        made = list(cluster.hub.strategies.values()) if cluster.hub is not None else []
        self.walk = Walk(spec, self.failure, bound=self.bound.value if self.bound else None,
                         bound_counts_steps=self.bound is None or self.bound.counts_steps,
                         gpus=any(cluster.live.view(rt.name).latest.get("gpus")
                                  for rt in cluster.tasks.values())
                         or any(f.get("device") == "GPU" for f in made),
                         implementation_used=next(
                             (str(f["implementation"]).lower() for f in made
                              if f.get("implementation")),
                             implementation_named([c["code"] for c in self.setup] + [self.code])))
        self.ran: dict[str, Ran] = {}
        self.template = (importlib.resources.files("tfdist_nb.worker")
                         / "isolate_prelude.py").read_text()

    # ------------------------------------------------------------------ what is isolated
    def _failing(self, cell: int | None) -> tuple[int, RunResult, str]:
        failed = self.cluster.failed_cells
        if cell is None:
            if not failed:
                raise SpecError("no cell has failed on this cluster: isolate re-runs a failing "
                                "cell (give --cell N for an earlier one)")
            cell = max(failed)
        if cell not in failed:
            said = ", ".join(str(n) for n in sorted(failed)) or "none"
            raise SpecError(f"cell {cell} did not fail on this cluster (failing cells: {said})")
        result, code = failed[cell]
        return cell, result, code

    def _setup_cells(self) -> list[CellRecord]:
        """The cells that set the tasks up: those that passed before the failing cell, since
        every task was last restarted (fresh kernels forgot the cells before)."""
        assert self.cluster.rundir is not None
        at = self.failed_rec["time"] if self.failed_rec else time.time()
        every = map(str, self.cluster.spec.tasks)
        restarts = [t for t in restart_times(self.cluster.rundir.iter_events(), every) if t < at]
        since = restarts[-1] if restarts else 0.0
        return [c for c in self.history if since < c["time"] < at and c["cell"] < self.cell
                and c["cell"] in self.cluster.passed_cells]

    # ------------------------------------------------------------------ the walk
    def run(self) -> IsolateReport:
        started = time.monotonic()
        deadline = started + self.budget_s
        try:
            while (variant := self.walk.next()) is not None:
                left = deadline - time.monotonic()
                if left < MIN_VARIANT_S:
                    self.walk.stopped = f"the budget of {self.budget_s:.0f}s was spent"
                    break
                self.progress(f"isolate: variant {self.walk.variants_run + 1} of at most "
                              f"{self.walk.at_most()}: {variant.title} "
                              f"(elapsed {time.monotonic() - started:.0f}s)")
                began = time.monotonic()
                try:
                    rows = self._run_variant(variant, deadline)
                except KeyboardInterrupt:  # outside a cell's run (which ends it as interrupted)
                    rows = [Row(variant, Outcome.INTERRUPTED, time.monotonic() - began,
                                "interrupted")]
                self.walk.record(rows)
                for r in rows:
                    why = f": {r.error}" if r.error else ""
                    self.progress(f"isolate: {r.title}: {r.outcome} in {r.seconds:.1f}s{why}")
        except KeyboardInterrupt:
            self.walk.stopped = "interrupted"
        finally:
            if self.warm:  # the variants kept the pool: it serves the user's cluster, or ends
                SESSION.end_idle()
        return IsolateReport(
            cell=self.cell, failure=self.failure, rows=list(self.walk.rows),
            verdict=self.walk.verdict(), finding=self.walk.finding(),
            smallest=self.walk.smallest(),
            seconds=time.monotonic() - started, budget_s=self.budget_s,
            setup_cells=[c["cell"] for c in self.setup], notes=self.walk.not_tried(),
            _ran=dict(self.ran),
            _export=self._write_export)

    def _run_variant(self, variant: Variant, deadline: float) -> list[Row]:
        began = time.monotonic()
        cells = self._cells_for(variant)
        self.ran[variant.key] = Ran(variant.spec, cells)
        if variant.shares:  # each row exports as that task alone
            for task in (str(t) for t in variant.spec.tasks):
                alone = share_alone(self.cluster.spec, task)
                self.ran[alone.key] = Ran(alone.spec, self._cells_for(alone))
        with self._variant_cluster(variant, deadline) as (side, why):
            if side is None:
                return [Row(variant, Outcome.NO_START, time.monotonic() - began, why)]
            return self._run_cells(side, variant, cells, deadline, began)

    @contextlib.contextmanager
    def _variant_cluster(self, variant: Variant,
                         deadline: float) -> Iterator[tuple[Cluster | None, str]]:
        user = self.cluster
        side = self.make(
            workers=variant.spec.workers, chief=bool(variant.spec.chief), launcher="local",
            env=user.extra_env, python=user.python, preload=user.preload,
            stall_timeout=min(user.stall_timeout, self._cell_cap(deadline)),
            run_dir=Path(str(user.run_dir)) / "isolate",
            start_timeout=max(1.0, min(user.start_timeout,
                                       deadline - STOP_RESERVE_S - time.monotonic())),
            launcher_options=user.launcher_options,
            warm=len(user.spec.tasks) if self.warm else False,
            gpus=user.gpu_request.choice, gpus_per_task=user.gpu_request.per_task)
        try:
            try:
                side.start(announce=False)
            except ClusterStartError as exc:
                yield None, str(exc).splitlines()[0]
                return
            yield side, ""
        finally:
            with swallowed(logger):
                side.stop(keep_spares=self.warm)
            if user.running:
                SESSION.clusters.set_current(user)

    def _full_cap(self) -> float:
        return max(MIN_CELL_S, CELL_FACTOR * self.failure.seconds + CELL_EXTRA_S)

    def _cell_cap(self, deadline: float) -> float:
        return max(1.0, min(self._full_cap(), deadline - STOP_RESERVE_S - time.monotonic()))

    def _run_cells(self, side: Cluster, variant: Variant, cells: list[CellRecord],
                   deadline: float, began: float) -> list[Row]:
        def row(outcome: Outcome, error: str = "", *, task: str | None = None,
                steps_done: int | None = None) -> Row:
            return Row(variant, outcome, time.monotonic() - began, error, task=task,
                       run_dir=str(side.run_dir), steps_done=steps_done)

        *before, failing = cells
        for rec in before:
            result = side.run(rec["code"], on=_on(rec), timeout=self._cell_cap(deadline))
            if not result.ok:
                outcome, line = judge(self.failure, result.tasks.values(), _timed_out(result))
                if outcome in (Outcome.INTERRUPTED, Outcome.TIMEOUT):
                    return [row(outcome, line)]
                what = "the prelude" if rec["cell"] == 0 else f"cell {rec['cell']}"
                return [row(Outcome.SETUP, f"{what}: {result.summary()}")]
        steps_before = self._steps(side) if self.bound else {}
        result = side.run(failing["code"], on=_on(failing),
                          timeout=self._cell_cap(deadline))
        timed_out = _timed_out(result)
        if variant.shares:
            rows = []
            for name, one in result.tasks.items():
                outcome, line = judge(self.failure, [one], timed_out)
                rows.append(row(outcome, line, task=name))
            done = self._steps(side, [name for name, one in result.tasks.items()
                                      if not one.ok], steps_before)
            for each in rows:
                each.steps_done = done.get(str(each.task))
            return rows
        outcome, line = judge(self.failure, result.tasks.values(), timed_out)
        done = (self._steps(side, [r.task for r in result.failed], steps_before)
                if outcome is Outcome.FAILS else {})
        return [row(outcome, line, steps_done=min(done.values(), default=None))]

    def _steps(self, side: Cluster, tasks: list[str] | None = None,
               before: dict[str, int] | None = None) -> dict[str, int]:
        """Steps each task has completed (``tw.steps_done()``), less ``before``; tasks that
        do not answer within PROBE_S are left out."""
        if self.bound is None:
            return {}
        targets = [rt.name for rt in side.tasks.values() if rt.agent is not None]
        if tasks is not None:
            targets = [t for t in targets if t in tasks]
        if not targets:
            return {}
        try:  # a task stalled in the failing cell cannot take the probe
            result = side.run(STEPS_PROBE, on=",".join(targets), timeout=PROBE_S)
        except TfdistError:
            return {}
        found: dict[str, int] = {}
        for name, r in result.tasks.items():
            for line in r.stdout.splitlines():
                if line.startswith("tfdist_isolate_steps "):
                    found[name] = int(line.split()[1]) - (before or {}).get(name, 0)
        return found

    # ------------------------------------------------------------------ cells of a variant
    def _cells_for(self, variant: Variant) -> list[CellRecord]:
        """The prelude, the set-up cells and the failing cell as this variant runs them."""
        prelude = dict(variant.prelude)
        if prelude["strategy"] == "multi_worker":
            prelude["collective_timeout_s"] = max(10, int(self._full_cap() - 5))
        code = self.code
        if variant.steps is not None and self.bound is not None:
            code = with_bound(code, self.bound, variant.steps)
        cells: list[CellRecord] = [{"cell": 0, "time": 0.0, "targets": None,
                                    "code": prelude_code(self.template, prelude)}]
        given = self.failed_rec["targets"] if self.failed_rec else None
        failing: CellRecord = {"cell": self.cell, "time": 0.0, "code": code,
                               "targets": list(given or []) or None}
        for rec in [*self.setup, failing]:
            targets = self._targets_for(variant, rec.get("targets"))
            if targets is False and rec is failing:
                targets = None  # its tasks are not in this variant: it runs on every task
            elif targets is False:
                continue
            cells.append({"cell": rec["cell"], "time": 0.0, "targets": targets,
                          "code": rec["code"]})
        return cells

    def _targets_for(self, variant: Variant,
                     targets: list[str] | None) -> list[str] | Literal[False] | None:
        """A cell's targets in ``variant``: None for every task, a list, or False to leave it
        out (it ran only on tasks the variant does not have)."""
        every = [str(t) for t in self.cluster.spec.tasks]
        if not targets or set(targets) >= set(every):
            return None
        if variant.as_task is not None:
            return None if variant.as_task in targets else False
        have = [str(t) for t in variant.spec.tasks]
        if variant.prelude["strategy"] == "mirrored":
            return None if every[0] in targets else False
        kept = [t for t in targets if t in have]
        return kept or False

    # ------------------------------------------------------------------ export
    def _write_export(self, ran: Ran, directory: str | os.PathLike[str], force: bool) -> Path:
        try:
            return export_reproducer(
                directory, cluster_id=f"{self.cluster.id} (isolate, cell {self.cell})",
                spec=ran.spec, cells=ran.cells, env=self.cluster.extra_env,
                python=self.cluster.python, force=force)
        except ExportError as exc:
            raise SpecError(str(exc)) from None


def _on(rec: CellRecord) -> str:
    """Where a variant's cell runs: its targets, already those of the variant's tasks
    (``_cells_for``), or every task."""
    return ",".join(rec["targets"]) if rec["targets"] else "all"


def _timed_out(result: RunResult) -> bool:
    return any(r.status is TaskStatus.TIMEOUT for r in result.tasks.values())
