"""What the network columns measure: the task's own network namespace, or the host's.

/proc/net/dev counts a network namespace, so the readings are this task's alone only when the
task has a namespace of its own; otherwise they are named host-wide (``net_scope``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import wait_for
from tfdist_nb import Cluster

SAMPLE_SCOPE = ("import json; from tfdist_nb.worker.telemetry import Telemetry\n"
                "sent = []; t = Telemetry(sent.append); t.start(); t.stop(); t.flush()\n"
                "print(json.dumps({k: sent[-1][k] for k in ('net_scope', 'net_rx_mb_s')}))")


def samples(cluster: Any, task: str) -> list[dict[str, Any]]:
    path = cluster.run_dir / "telemetry.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r["data"] for r in rows if r["task"] == task]


def _in_new_netns(argv: list[str]) -> dict[str, Any]:
    """Run ``argv`` in a new network namespace (its JSON output back); skips, saying why,
    where this machine cannot make one."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) on this machine: a process in its own network namespace "
                    "cannot be made here")
    done = subprocess.run([unshare, "--net", *argv], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"cannot make a network namespace here ({done.stderr.strip()}); it needs "
                    "CAP_SYS_ADMIN")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}


@pytest.mark.cluster
def test_a_local_task_on_the_host_network_names_its_network_readings_host_wide() -> None:
    with Cluster(workers=1, preload=(), launcher_options={"net": "host"}) as c:
        assert c.run("print(1)").ok
        found = wait_for(lambda: [s for s in samples(c, "worker:0") if s.get("net_rx_mb_s")
                                  is not None], 10, "a sample with a network rate")
        assert {s["net_scope"] for s in found} == {"host"}


@pytest.mark.cluster
def test_a_task_started_in_a_network_namespace_of_its_own_reads_per_task(tmp_path: Path) -> None:
    """The kernel talks to the controller over ipc sockets (files, not network), so a task in
    its own network namespace works, as one a container runtime started would."""
    _in_new_netns(["true"])  # skips, saying why, where namespaces cannot be made
    wrapper = tmp_path / "python-own-netns"
    wrapper.write_text(f"#!/bin/sh\nexec {shutil.which('unshare')} --net {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    with Cluster(workers=1, python=str(wrapper), preload=(),
                 launcher_options={"net": "host"}) as c:
        assert c.run("print(1)").ok
        found = wait_for(lambda: [s for s in samples(c, "worker:0") if s.get("net_rx_mb_s")
                                  is not None], 10, "a sample with a network rate")
        assert {s["net_scope"] for s in found} == {"task-netns"}


def test_a_process_in_a_network_namespace_of_its_own_reads_per_task() -> None:
    alone = _in_new_netns([sys.executable, "-c", SAMPLE_SCOPE])
    assert alone["net_scope"] == "task-netns"
    # the namespace shared with the process that started it (a shell, a launcher): not its own
    shared = _in_new_netns(["sh", "-c", f"{sys.executable} -c \"$0\"; exit $?", SAMPLE_SCOPE])
    assert shared["net_scope"] == "host"
