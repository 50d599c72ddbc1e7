"""A typed client for the worker agent (:mod:`tfdist_nb.worker.rpc`): JSON both ways.

Each call is a silent execute request whose only user expression is
``tfdist_nb.worker.rpc.call(<request as a JSON string>)``; the answer comes back as the
expression's ``application/json`` data. ``inspect=True`` sends it to the task's inspection
subshell, which answers while the main thread is blocked inside a TensorFlow op, and bounds the
wait by ``INSPECT_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tfdist_nb.errors import AgentError
from tfdist_nb.transport.channel import KernelChannel

INSPECT_TIMEOUT_S = 5.0
_MODULE = "tfdist_nb.worker.rpc"


class AgentClient:
    """Calls into one task's worker agent over its kernel channel."""

    def __init__(self, task: str, channel: KernelChannel, subshell: str | None = None) -> None:
        self.task = task
        self.channel = channel
        self.subshell = subshell

    async def call(self, op: str, *, inspect: bool = False, timeout: float | None = None,
                   **args: Any) -> Any:
        """The result of ``op(**args)`` in the task; AgentError when it raised there,
        asyncio.TimeoutError past ``timeout`` (``INSPECT_TIMEOUT_S`` for ``inspect``)."""
        request = json.dumps({"op": op, "args": args})
        # json.dumps of the request text is a valid Python string literal: the worker sees
        # exactly the JSON it is given, and nothing here is built with repr().
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

    async def describe(self, preload: list[str]) -> dict[str, Any]:
        """Who and where the task is, after importing ``preload`` (the start-up handshake)."""
        return dict(await self.call("describe", preload=list(preload)))

    async def set_environment(self, env: dict[str, str]) -> None:
        await self.call("set_environment", env=env)

    async def stacks(self) -> dict[str, Any]:
        return dict(await self.call("stacks", inspect=True))

    async def abort_collectives(self, reason: str) -> str:
        return str(await self.call("abort_collectives", inspect=True, reason=reason))

    async def inject(self, kind: str, params: dict[str, Any]) -> str:
        return str(await self.call("inject", inspect=True, kind=kind, params=params))

    async def set_log_level(self, level: str) -> str:
        return str(await self.call("set_log_level", level=level))

    async def start_tf_server(self) -> str:
        return str(await self.call("start_tf_server"))
