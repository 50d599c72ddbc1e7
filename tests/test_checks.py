"""The preflight checks on real clusters with deliberate bugs, and on TF_CONFIGs with each class
of error (docs/reference.md, Checks)."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from tfdist_nb import Cluster, check_tf_config
from tfdist_nb.cluster.agent_client import AgentClient
from tfdist_nb.cluster.checks import CheckRunner
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.diagnostics.env_check import critical_mismatch, env_frame
from tfdist_nb.errors import AgentError
from tfdist_nb.topology import TaskId

GOOD = {"cluster": {"worker": ["localhost:2222", "localhost:2223"]},
        "task": {"type": "worker", "index": 0}}


def _with(**changes: Any) -> dict[str, Any]:
    cfg = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            cfg[section][field] = value
        else:
            cfg[section] = value
    return cfg


@pytest.mark.parametrize(("config", "needle"), [
    ('{"cluster": {"worker": ["a:1"]}, "task": ', "not valid JSON"),
    ({"task": {"type": "worker", "index": 0}}, "cluster: missing or empty"),
    (_with(task=None), "task: missing"),
    (_with(cluster__gpu=["localhost:2230"]), "cluster.gpu: unknown task type"),
    (_with(task={"type": "worker", "index": 2}), "task.index: 2 is out of range for worker"),
    (_with(task={"type": "trainer", "index": 0}), "task.type: 'trainer' is not a task type"),
    (_with(cluster__worker=["localhost:2222", "localhost:2222"]),
     "cluster.worker[1]: duplicate address localhost:2222 (also cluster.worker[0])"),
    (_with(cluster__chief=["localhost:2224", "localhost:2225"]), "cluster.chief: 2 chiefs"),
    ({"cluster": {"ps": ["localhost:2226"]}, "task": {"type": "ps", "index": 0}},
     "cluster.ps: ps tasks without workers"),
    (_with(cluster__worker=["localhost:2222", "localhost:99999"]),
     "cluster.worker[1]: port '99999' is not a port number"),
    (_with(cluster__worker=["localhost:2222", "no-such-host.invalid:2223"]),
     "host 'no-such-host.invalid' does not resolve"),
])
def test_each_class_of_tf_config_error_is_named(config: Any, needle: str) -> None:
    report = check_tf_config(config)
    assert not report.ok
    assert any(needle in e for e in report.errors), report.errors
    assert needle in str(report) and "PROBLEM" in report._repr_html_()


def test_a_port_in_use_on_this_host_is_named(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        path = tmp_path / "tf_config.json"
        path.write_text(json.dumps(_with(cluster__worker=["localhost:2222",
                                                           f"localhost:{port}"])))
        report = check_tf_config(str(path))  # a file path works too
    assert [e for e in report.errors if f"localhost:{port} is in use" in e], report.errors


def test_a_missing_tf_config_file_is_said_so_not_called_bad_json(tmp_path: Path) -> None:
    report = check_tf_config(str(tmp_path / "nonexistent.json"))
    assert not report.ok
    assert any("nonexistent.json: No such file or directory" in e for e in report.errors)
    assert not any("not valid JSON" in e for e in report.errors), report.errors


OUT_OK = {"ok": True, "ms": 0.4, "error": None}
OUT_GONE = {"ok": False, "ms": None, "error": "Network is unreachable"}
REACH = {"worker:0": {"worker:1": OUT_OK}, "worker:1": {"worker:0": OUT_OK}}


def test_the_way_out_is_checked_and_its_loss_explained_with_the_launchers_cause() -> None:
    from tfdist_nb.diagnostics.network_check import analyse

    healthy = analyse(REACH, {}, None, {"worker:0": OUT_OK, "worker:1": OUT_OK}, "10.0.0.5")
    assert healthy.ok and not [d for d in healthy.details if "no way out" in d]
    assert healthy.table.loc["worker:1", "outside"] == 0.4
    cut = analyse(REACH, {}, None, {"worker:0": OUT_OK, "worker:1": OUT_GONE}, "10.0.0.5",
                  "slirp4netns (pid 7) killed by SIGKILL. Fix: %tfdist_restart")
    assert not cut.ok
    assert cut.summary == ("1 task(s) cannot reach this host's address 10.0.0.5: no outbound "
                           "network (downloads, DNS)")
    assert ("no way out: worker:1 cannot reach 10.0.0.5 (Network is unreachable). Cause: "
            "slirp4netns (pid 7) killed by SIGKILL. Fix: %tfdist_restart") in cut.details
    assert "outside" not in analyse(REACH, {}).table.columns  # remote tasks: not tried


@pytest.mark.parametrize(("evalue", "gone"), [
    ("<urlopen error [Errno 101] Network is unreachable>", True),
    ("URL fetch failure on https://x/mnist.npz: None -- [Errno -3] Temporary failure in name "
     "resolution", True),
    ("<urlopen error [Errno -2] Name or service not known>", True),
    ("<urlopen error [Errno 111] Connection refused>", False),  # a server's answer: not ours
    ("HTTP Error 404: Not Found", False),
])
def test_a_network_error_is_recognised_by_its_errno_not_its_exception_type(
        evalue: str, gone: bool) -> None:
    from tfdist_nb.diagnostics.explain import network_gone

    assert network_gone(evalue) is gone


def test_a_valid_tf_config_passes() -> None:
    report = check_tf_config(GOOD)
    assert report.ok and report.errors == [] and "valid and consistent" in report.summary


def test_environment_mismatch_is_said_for_python_and_tensorflow() -> None:
    df = env_frame({"worker:0": {"props": {"python": "3.11.7", "tensorflow": "2.21.0"}},
                    "worker:1": {"props": {"python": "3.11.7", "tensorflow": "2.20.0"}}})
    assert list(df.index[df["mismatch"]]) == ["tensorflow"]
    assert critical_mismatch(df) == "tensorflow differs: worker:0 2.21.0, worker:1 2.20.0"


class _ScriptedAgent(AgentClient):
    """An agent without a kernel: answers the sharding check's calls as scripted, and keeps the
    requests as they would go on the wire."""

    def __init__(self, task: str, read: str) -> None:
        super().__init__(task, None)  # type: ignore[arg-type]
        self.read, self.sent = read, []  # read: "fails", "waits" (until aborted) or "hangs"
        self.aborted: asyncio.Event | None = None

    async def call(self, op: Any, *, inspect: bool = False, timeout: float | None = None,
                   **args: Any) -> Any:
        self.sent.append((str(op), inspect, args))
        self.aborted = self.aborted or asyncio.Event()
        if str(op) == "abort_collectives":
            self.aborted.set()
            return "aborted"
        if str(op) == "sharding_describe":
            return {"kind": "distributed", "made_by": "experimental_distribute_dataset",
                    "policy": "DATA", "workers": 3, "pipeline": {"file_based": False}}
        return await asyncio.wait_for(self._read(), timeout)

    async def _read(self) -> Any:
        if self.read == "fails":
            await asyncio.sleep(0.05)
            raise AgentError(f"{self.task}: worker agent sharding_fingerprints failed: "
                             "InvalidArgumentError: assertion failed")
        if self.read == "hangs":  # in a collective the abort does not reach in time
            await asyncio.sleep(3600)
        await self.aborted.wait()  # type: ignore[union-attr]
        raise AgentError(f"{self.task}: worker agent sharding_fingerprints failed: "
                         "AbortedError: Collective ops is aborted by: a task failed")


def test_a_task_that_fails_reading_releases_the_others_and_the_report_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner tells the analysis by data which tasks it released (their answers say
    ``"released": True``; one that did not answer in time also ``"answered": False``)."""
    monkeypatch.setattr("tfdist_nb.cluster.checks.READ_MARGIN_S", 0.0)
    agents = {"worker:0": _ScriptedAgent("worker:0", "waits"),
              "worker:1": _ScriptedAgent("worker:1", "fails"),
              "worker:2": _ScriptedAgent("worker:2", "hangs")}
    targets = [TaskRuntime(TaskId.parse(t), f"localhost:{2222 + i}", "", {}, agent=a)
               for i, (t, a) in enumerate(agents.items())]
    report = asyncio.run(CheckRunner(targets).sharding("ds", max_seconds=0.25))
    assert report.summary == (
        "worker:1 could not read the dataset: InvalidArgumentError: assertion failed; "
        "worker:2 could not read the dataset: no answer within 0s; worker:0 waited for it in "
        "a collective and was released (%tfdist_restart gives working collectives again)")
    assert ("collectives were aborted on the tasks still reading, so that none waits forever: "
            "%tfdist_restart gives working collectives again") in report.details
    assert [op for op, _, _ in agents["worker:1"].sent] == ["sharding_describe",
                                                            "sharding_fingerprints"]
    assert [op for op, _, _ in agents["worker:0"].sent][-1] == "abort_collectives"
    # the read goes to the main shell with the same arguments as before the typed client
    assert agents["worker:0"].sent[1] == ("sharding_fingerprints", False, {
        "expr": "ds", "max_elements": 10_000, "max_seconds": 0.25, "unbatch": None,
        "reference": None, "with_reference": True})


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_checks_on_a_real_cluster_with_deliberate_bugs() -> None:
    with Cluster(workers=2) as c:
        assert c.check("all").ok, c.check("all")

        # an environment variable a cell set on one task shows in the live table
        c.run("import os; os.environ['TF_DETERMINISTIC_OPS'] = '1'", on="worker:1")
        env = c.env()
        assert env.loc["$TF_DETERMINISTIC_OPS", "worker:1"] == "1"
        assert bool(env.loc["$TF_DETERMINISTIC_OPS", "mismatch"])
        report = c.check("env")
        assert not report.ok and "$TF_DETERMINISTIC_OPS" in report.summary

        # worker:1's TF port is taken by a socket that never listens: nobody can reach it
        port = int(c.tasks[next(t for t in c.tasks if str(t) == "worker:1")].address
                   .rpartition(":")[2])
        c.run(f"import socket; _blocker = socket.socket(); _blocker.bind(('0.0.0.0', {port}))",
              on="worker:1")
        net = c.check("network")
        assert not net.ok
        assert net.failures == [("worker:0", "worker:1", "refused")]
        assert "worker:0 -> worker:1 (refused)" in net.summary
        assert net.latency_ms.loc["worker:1", "worker:0"] > 0  # the other way works
        tfc = c.check("tfconfig")
        assert f"worker:1: localhost:{port} is in use on" in " ".join(tfc.errors), tfc.errors
        c.run("_blocker.close()", on="worker:1")

        # with the cluster's own strategy, its all-reduce bandwidth is measured
        made = c.run("import tensorflow as tf\nstrategy = tf.distribute."
                     "MultiWorkerMirroredStrategy()")
        assert made.ok, made.summary()
        net = c.check("network")
        assert net.ok, net
        bw = net.bandwidth
        assert list(bw["size_mb"]) == [1.0, 16.0, 64.0]
        assert (bw["algbw_gb_s"] > 0).all()
        # 2 replicas: bus bandwidth = algorithm bandwidth * 2(n-1)/n = the same
        assert (bw["busbw_gb_s"] - bw["algbw_gb_s"]).abs().max() < 1e-9

        # a task whose TF_CONFIG was changed disagrees with the others, and says who it is
        other = json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                            "task": {"type": "worker", "index": 0}})
        c.run(f"import os; os.environ['TF_CONFIG'] = {other!r}", on="worker:1")
        tfc = c.check("tfconfig")
        assert not tfc.ok
        assert "worker:1: task: TF_CONFIG says this task is worker:0" in tfc.errors
        assert any(e.startswith("tasks disagree about the cluster") for e in tfc.errors)
