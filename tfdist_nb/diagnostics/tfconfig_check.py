"""``%tfdist_check tfconfig``: every problem of the TF_CONFIGs the tasks see, each naming the
task and the field (pure: the facts come from each task's probe). Beyond the launcher's own
rules (:func:`tfdist_nb.topology.validate_tf_config`), what only the running tasks can tell:
ports in use on their host, host names that do not resolve there, tasks that disagree."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from tfdist_nb.diagnostics.report import CheckReport, grouped
from tfdist_nb.topology import validate_tf_config
from tfdist_nb.worker.ops import PortState
from tfdist_nb.worker.replies import Failure, TfConfigView


def load_config(config: str | Mapping[str, Any] | Path) -> tuple[str, list[str]]:
    """A user-given TF_CONFIG (JSON text, a dict or a file path) as JSON text, and the errors
    of reading it."""
    if isinstance(config, Mapping):
        return json.dumps(config), []
    text = str(config)
    json_like = text.lstrip().startswith(("{", "[", '"'))
    path_like = not json_like and ("/" in text or text.endswith(".json") or Path(text).exists())
    if isinstance(config, Path) or path_like:
        try:
            return Path(text).read_text(), []
        except OSError as exc:
            return "", [f"TF_CONFIG file {text}: {exc.strerror or exc}"]
    return text, []


def structure_errors(text: str | None, who: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The parsed config and its structural problems, each starting with ``who``."""
    if not text:
        return None, [f"{who}: TF_CONFIG is not set"]
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        return None, [f"{who}: TF_CONFIG is not valid JSON ({exc})"]
    if not isinstance(cfg, dict):
        return None, [f"{who}: TF_CONFIG must be a JSON object with 'cluster' and 'task'"]
    return cfg, [f"{who}: {e}" for e in validate_tf_config(cfg)]


def analyse(views: Mapping[str, TfConfigView | Failure],
            expected: Mapping[str, str] | None = None) -> CheckReport:
    """``views``: per task (or ``"given"``) what its probe saw. ``expected``: the task each
    controller-side name should be (``worker:1``), to catch a task that sees itself as
    another."""
    errors: list[str] = []
    rows = []
    clusters: dict[str, str] = {}
    for who, view in views.items():
        if "error" in view:  # its probe failed: nothing is known of its TF_CONFIG
            errors.append(f"{who}: did not answer the check ({view['error']})")
            rows.append({"task": who, "host": None, "task_in_tf_config": None, "cluster": None,
                         "own_port": None})
            continue
        cfg, problems = structure_errors(view.get("tf_config"), who)
        errors += problems
        errors += [f"{who}: host {host!r} {said} on {view.get('host')}"
                   for host, said in (view.get("resolve") or {}).items() if said != "ok"]
        errors += [f"{who}: {addr} is in use on {view.get('host')} by another process: "
                   "TensorFlow's server cannot bind it"
                   for addr, state in (view.get("ports") or {}).items()
                   if state == PortState.IN_USE]
        me = None
        if cfg is not None and isinstance(cfg.get("task"), dict):
            me = f"{cfg['task'].get('type')}:{cfg['task'].get('index')}"
            if expected and who in expected and expected[who] != me:
                errors.append(f"{who}: task: TF_CONFIG says this task is {me}")
            clusters[who] = json.dumps(cfg.get("cluster"), sort_keys=True)
        rows.append({"task": who, "host": view.get("host"),
                     "task_in_tf_config": me,
                     "cluster": (_brief(cfg.get("cluster")) if cfg else None),
                     "own_port": ", ".join(f"{a} {s}" for a, s in
                                           (view.get("ports") or {}).items()) or None})
    if len(set(clusters.values())) > 1:
        sides = " vs ".join(f"{', '.join(ws)} see {_brief(json.loads(c))}"
                            for c, ws in grouped(clusters).items())
        errors.append(f"tasks disagree about the cluster: {sides}")
    summary = (f"{len(views)} TF_CONFIG(s) valid and consistent" if not errors else
               f"{len(errors)} problem(s): {errors[0]}" + (" ..." if len(errors) > 1 else ""))
    return CheckReport("tfconfig", not errors, summary, pd.DataFrame(rows), details=errors,
                       fields={"errors": errors})


def _brief(cluster: object) -> str:
    if not isinstance(cluster, dict):
        return repr(cluster)
    return "; ".join(f"{role}: {', '.join(map(str, addrs)) if isinstance(addrs, list) else addrs}"
                     for role, addrs in cluster.items())
