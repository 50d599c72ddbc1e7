"""A typed client for the worker agent (:mod:`tfdist_nb.worker.rpc`): each call is a silent
execute request whose user expression returns JSON. ``inspect=True`` sends it to the task's
inspection subshell, which answers while the main thread is blocked inside a TensorFlow op.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from tfdist_nb.errors import AgentError
from tfdist_nb.transport.channel import KernelChannel
from tfdist_nb.worker.ops import Op
from tfdist_nb.worker.replies import (  # the replies, typed once for both ends
    Adopted,
    Bandwidth,
    CaptureState,
    Checksums,
    Described,
    EnvReport,
    GpuReadings,
    LastException,
    NumericsState,
    PeerReach,
    ProfileSummary,
    Read,
    Stacks,
    TaskInfo,
    TfConfigView,
    Warmed,
)

INSPECT_TIMEOUT_S = 5.0
_MODULE = "tfdist_nb.worker.rpc"
R = TypeVar("R")


class _Op(Generic[R]):
    """One operation of the agent as a method of the client: its arguments by name (``timeout``
    bounds it), its reply typed ``R``; ``inspect``: sent to the inspection subshell."""

    def __init__(self, op: Op, inspect: bool = False) -> None:
        self.op, self.inspect = op, inspect

    def __get__(self, agent: AgentClient, owner: object = None) -> Callable[..., Awaitable[R]]:
        return functools.partial(agent.call, self.op, inspect=self.inspect)


class AgentClient:
    """Calls into one task's worker agent over its kernel channel."""

    def __init__(self, task: str, channel: KernelChannel, subshell: str | None = None) -> None:
        self.task = task
        self.channel = channel
        self.subshell = subshell

    async def call(self, op: Op, *, inspect: bool = False, timeout: float | None = None,
                   **args: object) -> Any:
        """The result of ``op(**args)`` in the task; AgentError when it raised there,
        asyncio.TimeoutError past ``timeout`` (``INSPECT_TIMEOUT_S`` for ``inspect``)."""
        request = json.dumps({"op": Op(op).value, "args": args})
        # json.dumps of the JSON text is a valid Python string literal: nothing built with repr()
        expr = f"__import__({_MODULE!r}, fromlist=['_']).call({json.dumps(request)})"
        ex = self.channel.execute("", None, silent=True, user_expressions={"out": expr},
                                  subshell_id=self.subshell if inspect else None)
        limit = INSPECT_TIMEOUT_S if inspect and timeout is None else timeout
        try:
            reply = await asyncio.wait_for(asyncio.shield(ex.reply), limit)
        finally:
            self.channel.abandon(ex)
        out = reply.get("user_expressions", {}).get("out", {})
        if out.get("status") != "ok":
            raise AgentError(f"{self.task}: worker agent {op} failed: {out.get('ename')}: "
                             f"{out.get('evalue')}")
        data = out.get("data", {}).get("application/json")
        if not isinstance(data, dict) or "result" not in data:
            raise AgentError(f"{self.task}: worker agent {op} sent no JSON reply (is the same "
                             "tfdist_nb installed in the task's interpreter?)")
        return data["result"]

    async def describe(self, preload: list[str]) -> TaskInfo:
        """Who and where the task is, after importing ``preload`` (the start-up handshake)."""
        return await self.call(Op.DESCRIBE, preload=list(preload))

    async def last_exception(self) -> LastException | None:
        """The exception the task's last failing cell raised (``ename``, ``evalue``,
        ``where``), or None: what ``%tfdist_debug`` would open on."""
        found: LastException | None = await self.call(Op.LAST_EXCEPTION, inspect=True)
        return found or None

    set_environment = _Op[str](Op.SET_ENVIRONMENT)  # env
    stacks = _Op[Stacks](Op.STACKS, inspect=True)
    abort_collectives = _Op[str](Op.ABORT_COLLECTIVES, inspect=True)  # reason
    inject = _Op[str](Op.INJECT, inspect=True)  # kind, params
    set_log_level = _Op[str](Op.SET_LOG_LEVEL)  # level
    start_tf_server = _Op[str](Op.START_TF_SERVER)
    #: a spare imports ``preload`` at nice ``nice`` (docs/design.md, Spare kernels)
    warm = _Op[Warmed](Op.WARM)
    #: a spare becomes ``task`` (``set_env``, ``unset_env``, ``log_path``, ``preload``): answers
    #: like ``describe``, plus ``adopted``
    adopt = _Op[Adopted](Op.ADOPT)
    set_numerics = _Op[NumericsState](Op.SET_NUMERICS)  # on, dump_root
    profiler_server = _Op[int](Op.PROFILER_SERVER, inspect=True)
    #: service_addrs, logdir, duration_ms, delay_ms
    profile_capture = _Op[str](Op.PROFILE_CAPTURE, inspect=True)
    profile_state = _Op[CaptureState](Op.PROFILE_STATE, inspect=True)
    profile_summary = _Op[ProfileSummary](Op.PROFILE_SUMMARY, inspect=True)  # logdir

    # the checks (docs/reference.md, Checks); a failed read answers {"error": why}
    #: TF_CONFIG as the task sees it now, or ``tf_config`` (JSON text) checked there
    tf_config_view = _Op[TfConfigView](Op.TF_CONFIG_VIEW, inspect=True)
    #: listen on the task's TF port until ``close_stand_ins`` if TensorFlow does not serve it
    #: yet: ``served``, ``listening`` or why it could not
    open_stand_in = _Op[str](Op.OPEN_STAND_IN, inspect=True)
    #: close the stand-ins ``open_stand_in`` opened; how many
    close_stand_ins = _Op[int](Op.CLOSE_STAND_INS, inspect=True)
    #: a TCP connect from the task to each of ``addresses`` (name -> host:port)
    connect_peers = _Op[dict[str, PeerReach]](Op.CONNECT_PEERS, inspect=True)
    #: all-reduce timings (``sizes_mb``) through the task's strategy (``replicas`` and
    #: ``rows``, or ``skipped``), with ``implementation`` (RING, NCCL) for these calls when
    #: given; on the main shell, every task at once
    allreduce_bandwidth = _Op[Bandwidth](Op.ALLREDUCE_BANDWIDTH)
    #: the task's GPUs as it was given them, NVML reads them and TensorFlow sees them
    gpu_readings = _Op[GpuReadings](Op.GPU_READINGS, inspect=True)
    env_report = _Op[EnvReport](Op.ENV_REPORT, inspect=True)
    #: what ``expr`` is in the task (kind, auto-shard policy, pipeline), nothing read
    sharding_describe = _Op[Described](Op.SHARDING_DESCRIBE, inspect=True)
    #: the task's read of ``expr``: fingerprint counts, previews, the bound that cut it short,
    #: and ``with_reference`` the undistributed dataset's read (``max_elements``,
    #: ``max_seconds``, ``unbatch``, ``reference``); on the main shell (a distributed
    #: dataset's iterator runs collectives)
    sharding_fingerprints = _Op[Read](Op.SHARDING_FINGERPRINTS)
    #: checksums of ``expr``'s variables as the task holds them (``full_values``), read on the
    #: main shell between cells
    variable_checksums = _Op[Checksums](Op.VARIABLE_CHECKSUMS)
