"""The controller's calls into the worker agent: one JSON request in, one JSON reply out.

The controller evaluates ``tfdist_nb.worker.rpc.call("<json>")`` as a user expression of a silent
execute request (on the main shell, or on the task's inspection subshell while the main thread is
busy). The reply object renders as ``application/json``, so the result travels as JSON in the
execute reply: nothing on either side is built from or parsed as Python source (docs/design.md,
"Calls into the worker agent").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tfdist_nb.worker import adopt, agent, consistency, numerics, probes, profiling


class JsonReply:
    """What ``call`` returns: IPython's display formatter sends ``value`` as application/json."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def _repr_json_(self) -> Any:
        return {"result": self.value}

    def __repr__(self) -> str:
        return json.dumps(self.value)


def _describe(preload: list[str]) -> dict[str, Any]:
    return agent.describe(preload)


def _stacks() -> dict[str, Any]:
    return json.loads(agent.stacks_json())


def _set_environment(env: dict[str, str]) -> str:
    return agent.set_environment(json.dumps(env))


def _inject(kind: str, params: dict[str, Any]) -> str:
    return agent.inject(kind, json.dumps(params))


OPERATIONS: dict[str, Callable[..., Any]] = {
    "describe": _describe,
    "stacks": _stacks,
    "set_environment": _set_environment,
    "inject": _inject,
    "abort_collectives": agent.abort_collectives,
    "set_log_level": agent.set_log_level,
    "start_tf_server": agent.start_tf_server,
    # spare kernels (docs/design.md, Spare kernels): warm up, then become a task
    "warm": adopt.warm,
    "adopt": adopt.adopt,
    # the checks (docs/reference.md, Checks)
    "tf_config_view": probes.tf_config_view,
    "open_stand_in": probes.open_stand_in,
    "close_stand_ins": probes.close_stand_ins,
    "connect_peers": probes.connect_peers,
    "allreduce_bandwidth": probes.allreduce_bandwidth,
    "env_report": probes.env_report,
    "sharding_describe": consistency.sharding_describe,
    "sharding_fingerprints": consistency.sharding_fingerprints,
    "variable_checksums": consistency.variable_checksums,
    "set_numerics": numerics.set_numerics,
    "profiler_server": profiling.start_server,
    "profile_capture": profiling.start_capture,
    "profile_state": profiling.capture_state,
    "profile_summary": profiling.summary,
}


def call(request: str) -> JsonReply:
    """Run ``{"op": NAME, "args": {...}}``; an unknown op or bad arguments raise here, and the
    controller reports the exception by name."""
    req = json.loads(request)
    op = OPERATIONS.get(req.get("op"))
    if op is None:
        raise ValueError(f"unknown worker operation {req.get('op')!r}")
    return JsonReply(op(**req.get("args", {})))
