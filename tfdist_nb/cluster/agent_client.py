"""A typed client for the worker agent (:mod:`tfdist_nb.worker.rpc`): each call is a silent
execute request whose user expression returns JSON. ``inspect=True`` sends it to the task's
inspection subshell, which answers while the main thread is blocked inside a TensorFlow op.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

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

    async def set_environment(self, env: dict[str, str]) -> None:
        await self.call(Op.SET_ENVIRONMENT, env=env)

    async def stacks(self) -> Stacks:
        return await self.call(Op.STACKS, inspect=True)

    async def abort_collectives(self, reason: str) -> str:
        return str(await self.call(Op.ABORT_COLLECTIVES, inspect=True, reason=reason))

    async def inject(self, kind: str, params: dict[str, Any]) -> str:
        return str(await self.call(Op.INJECT, inspect=True, kind=kind, params=params))

    async def set_log_level(self, level: str) -> str:
        return str(await self.call(Op.SET_LOG_LEVEL, level=level))

    async def last_exception(self) -> LastException | None:
        """The exception the task's last failing cell raised (``ename``, ``evalue``,
        ``where``), or None: what ``%tfdist_debug`` would open on."""
        found: LastException | None = await self.call(Op.LAST_EXCEPTION, inspect=True)
        return found or None

    async def start_tf_server(self) -> str:
        return str(await self.call(Op.START_TF_SERVER))

    async def warm(self, preload: list[str], nice: int, timeout: float) -> Warmed:
        """A spare imports ``preload`` at nice ``nice`` (docs/design.md, Spare kernels)."""
        return await self.call(Op.WARM, timeout=timeout, preload=list(preload), nice=nice)

    async def adopt(self, task: str, set_env: dict[str, str], unset_env: list[str],
                    log_path: str, preload: list[str], timeout: float) -> Adopted:
        """A spare becomes ``task``: answers like ``describe``, plus ``adopted``."""
        return await self.call(Op.ADOPT, timeout=timeout, task=task, set_env=set_env,
                               unset_env=unset_env, log_path=log_path, preload=list(preload))

    async def set_numerics(self, on: bool, dump_root: str | None,
                           timeout: float) -> NumericsState:
        return await self.call(Op.SET_NUMERICS, timeout=timeout, on=on, dump_root=dump_root)

    async def profiler_server(self, timeout: float) -> int:
        return int(await self.call(Op.PROFILER_SERVER, inspect=True, timeout=timeout))

    async def profile_capture(self, service_addrs: list[str], logdir: str, duration_ms: int,
                              delay_ms: int, timeout: float) -> str:
        return str(await self.call(Op.PROFILE_CAPTURE, inspect=True, timeout=timeout,
                                   service_addrs=service_addrs, logdir=logdir,
                                   duration_ms=duration_ms, delay_ms=delay_ms))

    async def profile_state(self, timeout: float) -> CaptureState:
        return await self.call(Op.PROFILE_STATE, inspect=True, timeout=timeout)

    async def profile_summary(self, logdir: str, timeout: float) -> ProfileSummary:
        return await self.call(Op.PROFILE_SUMMARY, inspect=True, timeout=timeout, logdir=logdir)

    # the checks (docs/reference.md, Checks); a failed read answers {"error": why}

    async def tf_config_view(self, *, tf_config: str | None, timeout: float) -> TfConfigView:
        """TF_CONFIG as the task sees it now, or ``tf_config`` (JSON text) checked there."""
        return await self.call(Op.TF_CONFIG_VIEW, inspect=True, timeout=timeout,
                               tf_config=tf_config)

    async def open_stand_in(self, *, timeout: float) -> str:
        """Listen on the task's TF port until ``close_stand_ins`` if TensorFlow does not serve
        it yet: ``served``, ``listening`` or why it could not."""
        return str(await self.call(Op.OPEN_STAND_IN, inspect=True, timeout=timeout))

    async def close_stand_ins(self, *, timeout: float) -> int:
        """Close the stand-ins ``open_stand_in`` opened; how many."""
        return int(await self.call(Op.CLOSE_STAND_INS, inspect=True, timeout=timeout))

    async def connect_peers(self, *, addresses: dict[str, str],
                            timeout: float) -> dict[str, PeerReach]:
        """A TCP connect from the task to each ``name -> host:port``."""
        return await self.call(Op.CONNECT_PEERS, inspect=True, timeout=timeout,
                               addresses=addresses)

    async def allreduce_bandwidth(self, *, sizes_mb: list[float], timeout: float,
                                  implementation: str | None = None) -> Bandwidth:
        """All-reduce timings through the task's strategy (``replicas`` and ``rows``, or
        ``skipped``), with ``implementation`` (RING, NCCL) for these calls when given; on the
        main shell, every task at once."""
        return await self.call(Op.ALLREDUCE_BANDWIDTH, timeout=timeout,
                               sizes_mb=list(sizes_mb), implementation=implementation)

    async def gpu_readings(self, *, timeout: float) -> GpuReadings:
        """The task's GPUs as it was given them, NVML reads them and TensorFlow sees them."""
        return await self.call(Op.GPU_READINGS, inspect=True, timeout=timeout)

    async def env_report(self, *, timeout: float) -> EnvReport:
        return await self.call(Op.ENV_REPORT, inspect=True, timeout=timeout)

    async def sharding_describe(self, *, expr: str, timeout: float) -> Described:
        """What ``expr`` is in the task (kind, auto-shard policy, pipeline), nothing read."""
        return await self.call(Op.SHARDING_DESCRIBE, inspect=True, timeout=timeout, expr=expr)

    async def sharding_fingerprints(self, *, expr: str, max_elements: int, max_seconds: float,
                                    unbatch: bool | None, reference: str | None,
                                    with_reference: bool, timeout: float) -> Read:
        """The task's read of ``expr``: fingerprint counts, previews, the bound that cut it
        short, and with ``with_reference`` the undistributed dataset's read; on the main
        shell (a distributed dataset's iterator runs collectives)."""
        return await self.call(Op.SHARDING_FINGERPRINTS, timeout=timeout, expr=expr,
                               max_elements=max_elements, max_seconds=max_seconds,
                               unbatch=unbatch, reference=reference,
                               with_reference=with_reference)

    async def variable_checksums(self, *, expr: str, full_values: int,
                                 timeout: float) -> Checksums:
        """Checksums of ``expr``'s variables as the task holds them, read on the main shell
        between cells."""
        return await self.call(Op.VARIABLE_CHECKSUMS, timeout=timeout, expr=expr,
                               full_values=full_values)
