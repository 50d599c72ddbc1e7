"""The tasks' ledgers as one pandas table (``cluster.collectives()``); apart from the ledger
views so that the server extension, which reads those views, never imports pandas."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfdist_nb.store.collectives import LedgerView
from tfdist_nb.topology import task_order

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ["task", "seq", "kind", "function", "dtype", "shape", "bytes", "where", "state",
           "entered", "done", "waited_s", "called_at", "group", "strategy", "index", "call",
           "position"]


def collectives_frame(ledgers: dict[str, LedgerView], last: int | None = 20,
                      now: float | None = None) -> pd.DataFrame:
    """The ledgers side by side (docs/reference.md, ``cluster.collectives``): each task's last
    ``last`` rows, by position so the same collective of every task lines up, then task order."""
    import time

    import pandas as pd

    now = time.time() if now is None else now
    rows = []
    for task in sorted(ledgers, key=task_order):
        for r in ledgers[task].recent(last):
            end = r.get("done") or now
            rows.append({**{c: r.get(c) for c in COLUMNS if c != "task"}, "task": task,
                         "shape": None if (shape := r.get("shape")) is None else tuple(shape),
                         "strategy": 1 + (r.get("strategy") or 0),
                         "waited_s": round(end - r["entered"], 3)})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("entered", "done"):
        frame[col] = pd.to_datetime(frame[col], unit="s", utc=True)
    # stable: at one seq the rows keep the task order they were gathered in
    return frame.sort_values("seq", kind="stable").reset_index(drop=True)
