"""TF_CONFIG is generated, never typed: build it from the spec and the addresses the tasks got.

Pure: no sockets, no TensorFlow. ``validate_tf_config`` names the field that is wrong, so the same
code serves the launcher (self-check before starting) and ``%tfdist_check tfconfig``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from tfdist_nb.topology import ROLES, TaskId


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
    """The TF_CONFIG JSON string for one task of the cluster.

    The evaluator is not part of the training cluster (TensorFlow's convention): it gets the
    cluster of the others and its own task entry.
    """
    training = {t: a for t, a in addresses.items() if t.role != "evaluator"}
    cfg = {"cluster": cluster_dict(training), "task": {"type": task.role, "index": task.index}}
    problems = validate_tf_config(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    return json.dumps(cfg, sort_keys=True)


def validate_tf_config(cfg: object) -> list[str]:
    """Every structural problem of one TF_CONFIG, each naming its field; empty when valid."""
    if not isinstance(cfg, Mapping):
        return ["TF_CONFIG: must be a JSON object with 'cluster' and 'task'"]
    errors: list[str] = []
    cluster = cfg.get("cluster")
    task = cfg.get("task")
    if not isinstance(cluster, Mapping) or not cluster:
        errors.append("cluster: missing or empty (expected {'worker': ['host:port', ...]})")
        cluster = {}
    seen: dict[str, str] = {}
    for role, addrs in cluster.items():
        if role not in ROLES:
            errors.append(f"cluster.{role}: unknown role (expected one of {', '.join(ROLES)})")
        if not isinstance(addrs, list) or not addrs:
            errors.append(f"cluster.{role}: must be a non-empty list of 'host:port'")
            continue
        for i, addr in enumerate(addrs):
            where = f"cluster.{role}[{i}]"
            errors.extend(_address_problems(where, addr))
            if isinstance(addr, str) and addr in seen:
                errors.append(f"{where}: duplicate address {addr} (also {seen[addr]})")
            seen[str(addr)] = where
    if "chief" in cluster and isinstance(cluster["chief"], list) and len(cluster["chief"]) > 1:
        errors.append("cluster.chief: at most one chief")
    if not isinstance(task, Mapping):
        errors.append("task: missing (expected {'type': 'worker', 'index': 0})")
        return errors
    ttype, index = task.get("type"), task.get("index")
    if ttype not in ROLES:
        errors.append(f"task.type: {ttype!r} is not a role (expected one of {', '.join(ROLES)})")
    elif ttype != "evaluator" and ttype not in cluster:
        errors.append(f"task.type: {ttype!r} has no entry in cluster")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        errors.append(f"task.index: {index!r} must be a non-negative integer")
    elif ttype in cluster and isinstance(cluster[ttype], list) and index >= len(cluster[ttype]):
        errors.append(
            f"task.index: {index} is out of range for {ttype} (has {len(cluster[ttype])})"
        )
    return errors


def _address_problems(where: str, addr: object) -> list[str]:
    if not isinstance(addr, str) or ":" not in addr:
        return [f"{where}: {addr!r} is not 'host:port'"]
    host, _, port = addr.rpartition(":")
    if not host:
        return [f"{where}: {addr!r} has no host"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        return [f"{where}: port {port!r} is not a port number (1-65535)"]
    return []
