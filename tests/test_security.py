"""What protects a worker kernel: owner-only ipc channels and signed messages."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client import BlockingKernelClient

from tfdist_nb import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def client_for(info: dict[str, Any], key: bytes) -> BlockingKernelClient:
    c = BlockingKernelClient()
    c.load_connection_info({**info, "key": key})
    c.start_channels(hb=False)
    return c


def test_a_message_with_a_wrong_key_is_rejected_by_the_worker(tmp_path: Path) -> None:
    proof = tmp_path / "ran"
    code = f"open({str(proof)!r}, 'w').write('x')"
    with Cluster(workers=1, preload=()) as c:
        rt = next(iter(c.tasks.values()))
        info = json.loads((c.run_dir / "tasks" / "worker-0" / "kernel-connection.json")
                          .read_text())
        assert info["transport"] == "ipc" and info["signature_scheme"] == "hmac-sha256"
        shell = Path(f"{info['ip']}-{info['shell_port']}")
        assert stat.S_IMODE(shell.stat().st_mode) & 0o077 == 0  # only this user may connect
        assert stat.S_IMODE(shell.parent.stat().st_mode) & 0o077 == 0
        listening = {s.laddr.ip for s in psutil.Process(rt.pid).net_connections(kind="tcp")
                     if s.status == psutil.CONN_LISTEN}
        assert listening <= {"127.0.0.1"}  # no channel on any network interface

        forger = client_for(info, b"not-the-key")
        try:
            msg_id = forger.execute(code)
            deadline = time.monotonic() + 3
            replies = []
            while time.monotonic() < deadline:
                try:
                    replies.append(forger.get_shell_msg(timeout=0.2))
                except Exception:  # queue.Empty: nothing came back, as it should
                    continue
        finally:
            forger.stop_channels()
        assert not [r for r in replies if r["parent_header"].get("msg_id") == msg_id]
        assert not proof.exists()

        honest = client_for(info, info["key"].encode())
        try:
            reply = honest.execute(code, reply=True, timeout=10)
        finally:
            honest.stop_channels()
        assert reply["content"]["status"] == "ok" and proof.exists()
        log = (c.run_dir / "tasks" / "worker-0" / "kernel.log").read_text()
        assert "Invalid Signature" in log or "Invalid Message" in log


def test_the_controller_rejects_forged_or_replayed_messages_too() -> None:
    """Its faster Session (dates kept as strings) still checks every signature."""
    from jupyter_client.session import Session

    from tfdist_nb.transport.session import FastDateSession, message_time

    ours = FastDateSession(key=b"k1")
    msg = Session(key=b"k1").msg("stream", {"name": "stdout", "text": "hi"})
    frames = Session(key=b"k1").serialize(msg)[1:]  # drop the <IDS|MSG> delimiter
    got = ours.deserialize(list(frames))
    assert got["content"]["text"] == "hi" and isinstance(got["header"]["date"], str)
    assert abs(message_time(got, 0.0) - time.time()) < 60
    with pytest.raises(ValueError, match="Duplicate Signature"):
        ours.deserialize(list(frames))  # replayed
    forged = Session(key=b"k2").serialize(msg)[1:]
    with pytest.raises(ValueError, match="Invalid Signature"):
        FastDateSession(key=b"k1").deserialize(list(forged))
