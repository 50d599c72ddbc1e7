"""TF_CONFIG is generated, never typed: build it from the spec and the addresses the tasks got.

Pure: no sockets, no TensorFlow. Each one built is checked by :func:`tfdist_nb.topology.
validate_tf_config`, the rules ``%tfdist_check tfconfig`` applies too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from tfdist_nb.topology import ROLES, TaskId, validate_tf_config

__all__ = ["build_tf_config", "cluster_dict", "validate_tf_config"]


def cluster_dict(addresses: Mapping[TaskId, str]) -> dict[str, list[str]]:
    """``{"worker": ["host:port", ...], ...}`` in index order, as TensorFlow expects."""
    out: dict[str, list[str]] = {}
    for role in ROLES:
        tasks = sorted(t for t in addresses if t.role == role)
        if tasks:
            if [t.index for t in tasks] != list(range(len(tasks))):
                raise ValueError(f"{role} indices must be 0..{len(tasks) - 1}, got {tasks}")
            out[role] = [addresses[t] for t in tasks]
    return out


def build_tf_config(task: TaskId, addresses: Mapping[TaskId, str]) -> str:
    """The TF_CONFIG JSON string for one task; the evaluator is not part of the training
    cluster (TensorFlow's convention), so it gets the others' cluster and its own task."""
    training = {t: a for t, a in addresses.items() if t.role != "evaluator"}
    cfg = {"cluster": cluster_dict(training), "task": {"type": task.role, "index": task.index}}
    problems = validate_tf_config(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    return json.dumps(cfg, sort_keys=True)
