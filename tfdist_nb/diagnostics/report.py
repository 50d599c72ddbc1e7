"""What every check returns (docs/reference.md, Checks): a verdict, one sentence naming the
task(s) and the cause, the evidence as a DataFrame, and each kind's own fields."""

from __future__ import annotations

import html
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pandas as pd

K = TypeVar("K")
V = TypeVar("V", bound=Hashable)


def grouped(values: Mapping[K, V]) -> dict[V, list[K]]:
    """The keys that have each value, in the mapping's order."""
    groups: dict[V, list[K]] = {}
    for key, value in values.items():
        groups.setdefault(value, []).append(key)
    return groups


@dataclass
class CheckReport:
    kind: str
    ok: bool
    summary: str
    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    details: list[str] = field(default_factory=list)  # further lines: causes, fixes, notes
    fields: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getattr__(self, name: str) -> Any:
        # kind-specific fields read as attributes: report.errors, report.overlap, ...
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(f"a {self.__dict__.get('kind', '?')} CheckReport has no {name!r}")

    def __str__(self) -> str:
        mark = "OK" if self.ok else "PROBLEM"
        parts = [f"[{self.kind}] {mark}: {self.summary}", *self.details]
        if not self.table.empty:
            parts.append(self.table.to_string())
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"<CheckReport {self.kind} ok={self.ok}: {self.summary}>"

    def _repr_html_(self) -> str:
        colour = "#2e7d32" if self.ok else "#c62828"
        mark = "OK" if self.ok else "PROBLEM"
        head = (f"<p><b>{html.escape(self.kind)}</b> <span style='color:white;background:"
                f"{colour};padding:1px 6px;border-radius:8px'>{mark}</span> "
                f"{html.escape(self.summary)}</p>")
        extra = "".join(f"<div>{html.escape(line)}</div>" for line in self.details)
        table = "" if self.table.empty else self.table.to_html(na_rep="", border=0)
        return f"<div class='tfdist-check'>{head}{extra}{table}</div>"


def combine(reports: list[CheckReport]) -> CheckReport:
    """``%tfdist_check all``: every report's verdict in one, the failing ones first."""
    failing = [r for r in reports if not r.ok]
    table = pd.DataFrame([{"check": r.kind, "ok": r.ok, "summary": r.summary} for r in reports])
    summary = ("every preflight check passed" if not failing else
               "; ".join(f"{r.kind}: {r.summary}" for r in failing))
    return CheckReport("all", not failing, summary, table,
                       fields={"reports": {r.kind: r for r in reports}})
