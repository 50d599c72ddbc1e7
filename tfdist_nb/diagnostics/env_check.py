"""``%tfdist_env`` / ``Cluster.env()``: every task's environment side by side, what differs
marked (pure: each task's probe read its own environment when asked)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

#: Differences that break a multi-worker job outright; said in a warning at start.
CRITICAL = ("python", "tensorflow", "keras_flavour")
#: Properties that differ between tasks by design, never a mismatch.
_PER_TASK = {"host", "$TF_CONFIG", "$TFDIST_TASK"}


def env_frame(reports: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Index: property (then ``pkg:NAME`` for installed packages whose versions differ),
    a column per task, and a bool ``mismatch`` column. A property one task lacks reads as
    empty there and counts as a difference."""
    tasks = list(reports)
    props = dict.fromkeys(k for rep in reports.values() for k in rep.get("props", {}))
    rows = {p: [reports[t].get("props", {}).get(p) for t in tasks] for p in props}
    names = sorted({n for rep in reports.values() for n in rep.get("packages", {})})
    for name in names:
        versions = [reports[t].get("packages", {}).get(name) for t in tasks]
        if len(set(versions)) > 1:
            rows[f"pkg:{name}"] = versions
    df = pd.DataFrame.from_dict(rows, orient="index", columns=tasks)
    df.index.name = "property"
    differs = df.nunique(axis=1, dropna=False) > 1
    df["mismatch"] = differs & ~df.index.isin(list(_PER_TASK))
    return df


def with_launcher_rows(df: pd.DataFrame,
                       rows: Mapping[str, tuple[str, Mapping[str, str]]]) -> pd.DataFrame:
    """``df`` with what the launcher read (``Launcher.env_rows``): for each property a row of
    the value where each task runs and a row ``PROP (notebook)``, both a mismatch when a task's
    differs from the notebook's (the Ray launcher: Ray's version, docs/remote.md)."""
    tasks = [c for c in df.columns if c != "mismatch"]
    for prop, (here, theirs) in rows.items():
        values = [theirs.get(t) for t in tasks]
        differs = any(v != here for v in values)
        df.loc[prop] = [*values, differs]
        df.loc[f"{prop} (notebook)"] = [*([here] * len(tasks)), differs]
    df["mismatch"] = df["mismatch"].astype(bool)
    return df


def critical_mismatch(df: pd.DataFrame) -> str | None:
    """One sentence when Python, TensorFlow or the Keras flavour differ between tasks."""
    bad = [p for p in CRITICAL if p in df.index and bool(df.loc[p, "mismatch"])]
    if not bad:
        return None
    tasks = [c for c in df.columns if c != "mismatch"]
    return "; ".join(f"{p} differs: " + ", ".join(f"{t} {df.loc[p, t]}" for t in tasks)
                     for p in bad)
