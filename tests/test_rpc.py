"""The worker agent's RPC, both ends on one list of operations (no process: the worker side's
dispatcher is called as the kernel would call it)."""

from __future__ import annotations

import json

import pytest

from tfdist_nb.cluster.agent_client import AgentClient
from tfdist_nb.worker import rpc
from tfdist_nb.worker.ops import Op


def test_every_operation_has_a_worker_function_and_nothing_else_is_answered() -> None:
    assert set(rpc.OPERATIONS) == set(Op)
    with pytest.raises(ValueError, match="unknown worker operation 'format_disk'"):
        rpc.call(json.dumps({"op": "format_disk", "args": {}}))


def test_arguments_travel_as_json_values_not_json_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFDIST_RPC_PROBE", "before")
    reply = rpc.call(json.dumps({"op": "set_environment",
                                 "args": {"env": {"TFDIST_RPC_PROBE": "after \"quoted\""}}}))
    assert reply._repr_json_() == {"result": "ok"}
    import os

    assert os.environ["TFDIST_RPC_PROBE"] == 'after "quoted"'
    stacks = rpc.call(json.dumps({"op": Op.STACKS.value, "args": {}}))._repr_json_()["result"]
    assert set(stacks) == {"threads", "main", "in_tf"}  # a dict, not JSON text to parse again


def test_the_client_sends_only_known_operations() -> None:
    client = AgentClient("worker:0", channel=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        import asyncio

        asyncio.run(client.call("format_disk"))  # type: ignore[arg-type]
