"""What ``%tfdist_isolate`` found, as the user holds it (docs/reference.md, Isolate): the rows,
the verdict, the smallest failing variant and its export. Pure; :mod:`tfdist_nb.cluster.isolate`
runs the variants and fills it in."""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tfdist_nb.diagnostics.isolate_variants import Failure, Finding, Row
from tfdist_nb.errors import SpecError
from tfdist_nb.events import CellRecord
from tfdist_nb.topology import ClusterSpec

TABLE_COLUMNS = ["variant", "tasks", "outcome", "seconds", "first error line", "run_dir"]


@dataclass
class Ran:
    """What a variant ran, to export it: its cluster and its cells, prelude first."""

    spec: ClusterSpec
    cells: list[CellRecord]


@dataclass
class IsolateReport:
    """What ``%tfdist_isolate`` found (docs/reference.md, Isolate): ``table`` (one row per
    variant, or per task of "each task's share alone"), ``smallest`` (the smallest variant that
    still fails, or None), ``verdict`` (one sentence), ``finding`` (what the verdict says, a
    ``Finding``) and ``export(DIR)``."""

    cell: int
    failure: Failure
    rows: list[Row]
    verdict: str
    smallest: Row | None
    seconds: float
    budget_s: float
    setup_cells: list[int]
    notes: list[str] = field(default_factory=list)  # variants not tried, and why
    finding: Finding = Finding.NO_ANSWER
    _ran: dict[str, Ran] = field(default_factory=dict, repr=False)
    _export: Callable[[Ran, str | os.PathLike[str], bool], Path] | None = field(
        default=None, repr=False)

    @property
    def table(self) -> pd.DataFrame:
        return pd.DataFrame([{"variant": r.title, "tasks": r.tasks, "outcome": str(r.outcome),
                              "seconds": round(r.seconds, 1), "first error line": r.error,
                              "run_dir": r.run_dir} for r in self.rows], columns=TABLE_COLUMNS)

    def export(self, directory: str | os.PathLike[str], force: bool = False) -> Path:
        """The smallest failing variant as ``%tfdist_export`` writes it: ``train.py`` (its
        prelude, the set-up cells and the failing cell) and ``launch.sh``."""
        if self.smallest is None:
            raise SpecError(f"no variant failed ({self.verdict}): there is nothing to export")
        key = self.smallest.runs_as
        if key not in self._ran or self._export is None:
            raise SpecError(f"the variant {self.smallest.title!r} cannot be exported")
        return self._export(self._ran[key], directory, force)

    def __str__(self) -> str:
        lines = [f"isolate cell {self.cell}: {self.verdict}"]
        if self.smallest is not None:
            lines.append(f"smallest failing: {self.smallest.title}")
        for r in self.rows:
            why = f": {r.error}" if r.error else ""
            lines.append(f"  {r.title}: {r.outcome} in {r.seconds:.1f}s{why}")
        lines.extend(f"  ({note})" for note in self.notes)
        lines.append(f"{len(self.rows)} row(s) in {self.seconds:.0f}s of a {self.budget_s:.0f}s "
                     "budget")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<IsolateReport cell {self.cell}: {self.verdict}>"

    def _repr_html_(self) -> str:
        smallest = (f"<p>smallest failing: {html.escape(self.smallest.title)}</p>"
                    if self.smallest else "")
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in self.notes)
        return (f"<p><b>isolate cell {self.cell}:</b> {html.escape(self.verdict)}</p>{smallest}"
                + self.table.drop(columns=["run_dir"]).to_html(index=False) + notes)
