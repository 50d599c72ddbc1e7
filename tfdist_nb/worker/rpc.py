"""The controller's calls into the worker agent: one JSON request in, one JSON reply out.

``call("<json>")`` is a silent execute request's user expression (on the task's inspection
subshell while the main thread is busy) whose reply renders as ``application/json``: nothing on
either side is built from or parsed as Python source (docs/design.md, "Calls into the worker
agent").
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from tfdist_nb.worker import (
    adopt,
    agent,
    consistency,
    gpu_probe,
    numerics,
    postmortem,
    probes,
    profiling,
    variables_probe,
)
from tfdist_nb.worker.ops import Op


@dataclasses.dataclass
class JsonReply:
    """What ``call`` returns: IPython's display formatter sends ``value`` as application/json."""

    value: object

    def _repr_json_(self) -> dict[str, object]:
        return {"result": self.value}

    def __repr__(self) -> str:
        return json.dumps(self.value)


OPERATIONS: dict[Op, Callable[..., Any]] = {
    Op.DESCRIBE: agent.describe,
    Op.STACKS: agent.stacks,
    Op.SET_ENVIRONMENT: agent.set_environment,
    Op.INJECT: agent.inject,
    Op.ABORT_COLLECTIVES: agent.abort_collectives,
    Op.SET_LOG_LEVEL: agent.set_log_level,
    Op.START_TF_SERVER: agent.start_tf_server,
    # spare kernels (docs/design.md, Spare kernels): warm up, then become a task
    Op.WARM: adopt.warm,
    Op.ADOPT: adopt.adopt,
    # the checks (docs/reference.md, Checks)
    Op.TF_CONFIG_VIEW: probes.tf_config_view,
    Op.OPEN_STAND_IN: probes.open_stand_in,
    Op.CLOSE_STAND_INS: probes.close_stand_ins,
    Op.CONNECT_PEERS: probes.connect_peers,
    Op.ALLREDUCE_BANDWIDTH: probes.allreduce_bandwidth,
    Op.ENV_REPORT: probes.env_report,
    Op.GPU_READINGS: gpu_probe.gpu_readings,
    Op.SHARDING_DESCRIBE: consistency.sharding_describe,
    Op.SHARDING_FINGERPRINTS: consistency.sharding_fingerprints,
    Op.VARIABLE_CHECKSUMS: variables_probe.variable_checksums,
    Op.SET_NUMERICS: numerics.set_numerics,
    Op.PROFILER_SERVER: profiling.start_server,
    Op.PROFILE_CAPTURE: profiling.start_capture,
    Op.PROFILE_STATE: profiling.capture_state,
    Op.PROFILE_SUMMARY: profiling.summary,
    Op.LAST_EXCEPTION: postmortem.last_exception,
}


def call(request: str) -> JsonReply:
    """Run ``{"op": NAME, "args": {...}}``; an unknown op or bad arguments raise here, and the
    controller reports the exception by name."""
    req = json.loads(request)
    try:
        op = OPERATIONS[Op(req.get("op"))]
    except ValueError:
        raise ValueError(f"unknown worker operation {req.get('op')!r}") from None
    return JsonReply(op(**req.get("args", {})))
