"""``%tfdist_report DIR`` (docs/reference.md, Magics): one Markdown file to paste into an issue
(what ``accelerate env`` gives for one machine, for a whole cluster). Tasks are described from
their start-up self-description, so a dead task is still described.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tfdist_nb import redaction
from tfdist_nb.cluster.export import ExportError, ours_or_absent, write_private
from tfdist_nb.errors import SpecError
from tfdist_nb.events import CellRecord
from tfdist_nb.ledger_runs import LedgerRow
from tfdist_nb.redaction import REDACTED
from tfdist_nb.results import RunResult

if TYPE_CHECKING:
    import pandas as pd

    from tfdist_nb.cluster.task import TaskRuntime
    from tfdist_nb.store.tails import LiveStore

REPORT = "report.md"
LAST_LINES = 15
LEDGER_ROWS = 8
HIDDEN = "<hidden>"  # an --env value that is no secret, left out unless show_env


def check_target(directory: Path, force: bool) -> None:
    """SpecError, before anything is written, if ``directory`` holds a report this module did
    not write (unless ``force``): it is kept."""
    path = directory / REPORT
    if not force and not ours_or_absent(path):
        raise SpecError(f"{path} exists and was not written by %tfdist_report: kept (give "
                        "--force, or another directory)")


def write(path: Path, *, cluster_id: str, spec: str, tasks: Collection[TaskRuntime],
          env: Mapping[str, str], alerts: Iterable[str], failure: tuple[RunResult, str] | None,
          logs: pd.DataFrame, live: LiveStore, cells: Iterable[CellRecord],
          show_env: bool = False) -> Path:
    """Write the report of a cluster's ``tasks`` to ``path`` (owner-only); ``cells`` are read
    for secrets to hide. SpecError if it cannot be written."""
    failed, code = failure if failure else (None, None)
    names = [rt.name for rt in tasks]
    last = {n: list(logs[logs["task"] == n]["text"].tail(LAST_LINES)) if len(logs) else []
            for n in names}
    ledger: list[TaskLedgerRow] = [{"task": name, **row} for name in names
                                   for row in live.view(name).ledger.recent(LEDGER_ROWS)]
    text = markdown(
        cluster_id=cluster_id, spec=spec, tasks=[  # as each said of itself at start-up
            {"task": rt.name, "host": rt.host, "pid": rt.pid, "state": str(rt.state),
             "python": rt.info.get("python"), "tensorflow": rt.info.get("tensorflow"),
             "keras": rt.info.get("keras_flavour")} for rt in tasks],
        tf_configs={rt.name: json.dumps(json.loads(rt.tf_config), sort_keys=True)
                    for rt in tasks}, env=env, alerts=alerts, failure=failed,
        failed_code=code, last_lines=last, ledger=ledger, show_env=show_env,
        secrets=redaction.secret_values([c.get("code", "") for c in cells], env))
    try:
        write_private(path, text)
    except ExportError as exc:
        raise SpecError(str(exc)) from None
    return path


class TaskLedgerRow(LedgerRow, total=False):
    """A ledger row in the report's table, with the task it is of."""

    task: str


def markdown(*, cluster_id: str, spec: str, tasks: Sequence[Mapping[str, object]],
             tf_configs: Mapping[str, str], env: Mapping[str, str], alerts: Iterable[str],
             failure: RunResult | None, failed_code: str | None,
             last_lines: Mapping[str, list[str]], ledger: list[TaskLedgerRow],
             secrets: Iterable[str] = (), show_env: bool = False) -> str:
    """The report's text; the whole of it goes through the redaction once it is made, so every
    field does (``secrets``: values to hide wherever they appear)."""
    shown = ("values that look like secrets as" if show_env else "`--env` values as "
             f"`{HIDDEN}` (`--show-env` shows those that are no secret), secrets as")
    out = [f"# tfdist_nb report: cluster {cluster_id} ({spec})", "",
           f"Made {time.strftime('%Y-%m-%d %H:%M:%S %Z')}. In the cells, lines and environment, "
           f"{shown} `{REDACTED}`.", ""]
    out += ["## What failed", ""]
    if failure is None:
        out += ["No cell failed on this cluster.", ""]
    else:
        out += [f"Cell {failure.cell}: {failure.summary().splitlines()[0]}", "",
                "```python", (failed_code or "").rstrip(), "```", "",
                "| task | status | error |", "|---|---|---|"]
        for name, r in failure.tasks.items():
            error = r.error.short() if r.error else ""
            out.append(f"| {name} | {r.status} | {_cell(error)} |")
        out.append("")
        for name, r in failure.tasks.items():
            if r.explanation:
                out += [f"**{name}**: {r.explanation}", ""]
    out += ["## Tasks", "", "| task | host | pid | state | python | TensorFlow | Keras |",
            "|---|---|---|---|---|---|---|"]
    for t in tasks:
        out.append("| " + " | ".join(_cell(str(t.get(k) if t.get(k) is not None else ""))
                                     for k in ("task", "host", "pid", "state", "python",
                                               "tensorflow", "keras")) + " |")
    out += ["", "## TF_CONFIG of each task", ""]
    for name, cfg in tf_configs.items():
        out += [f"- {name}: `{cfg}`"]
    out += ["", "## Environment given to every task (`--env`)", ""]
    out += [f"- `{k}={REDACTED if redaction.secret_setting(k, v) else v if show_env else HIDDEN}`"
            for k, v in env.items()] or ["(none)"]  # values only with show_env, never secrets
    out += ["", "## Alerts", ""]
    out += [f"- {a}" for a in alerts] or ["(none)"]
    out += ["", f"## The last {LAST_LINES} lines of each task", ""]
    for name, lines in last_lines.items():
        out += [f"### {name}", "", "```", *lines, "```", ""]
    if ledger:
        out += ["## Collective ledger (the last rows of each task)", "",
                "| task | kind | tensor | where | state |", "|---|---|---|---|---|"]
        for row in ledger:
            out.append(f"| {row.get('task')} | {row.get('kind')} | "
                       f"{row.get('dtype', '')}{list(row.get('shape') or [])} | "
                       f"{row.get('where')} | {row.get('state')} |")
        out.append("")
    out += ["## Reproduce", "", "`bash launch.sh` beside this file runs the cells the cluster "
            "ran (`train.py`) on the same tasks of one machine.", ""]
    return redaction.redact("\n".join(out), secrets)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
