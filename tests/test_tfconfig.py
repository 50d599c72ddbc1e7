"""TF_CONFIG generation and validation (pure)."""

from __future__ import annotations

import json
import sys

import pytest

from tfdist_nb.cluster.tfconfig import build_tf_config, validate_tf_config
from tfdist_nb.diagnostics.tfconfig_check import analyse
from tfdist_nb.topology import TaskId, parse_spec


def test_every_task_sees_the_same_cluster() -> None:
    spec = parse_spec("1 chief 2 workers 1 ps")
    addresses = {t: f"localhost:{20000 + i}" for i, t in enumerate(spec.tasks)}
    configs = {t: json.loads(build_tf_config(t, addresses)) for t in spec.tasks}
    clusters = {json.dumps(c["cluster"], sort_keys=True) for c in configs.values()}
    assert len(clusters) == 1
    cfg = configs[TaskId("worker", 1)]
    assert cfg["task"] == {"type": "worker", "index": 1}
    assert cfg["cluster"] == {"chief": ["localhost:20000"],
                              "worker": ["localhost:20001", "localhost:20002"],
                              "ps": ["localhost:20003"]}


def test_evaluator_is_outside_the_training_cluster() -> None:
    spec = parse_spec("2 workers 1 evaluator")
    addresses = {t: f"localhost:{21000 + i}" for i, t in enumerate(spec.tasks)}
    cfg = json.loads(build_tf_config(TaskId("evaluator", 0), addresses))
    assert "evaluator" not in cfg["cluster"]
    assert cfg["task"] == {"type": "evaluator", "index": 0}


@pytest.mark.parametrize(("cfg", "needle"), [
    ({"task": {"type": "worker", "index": 0}}, "cluster: missing"),
    ({"cluster": {"worker": ["a:1"]}}, "task: missing"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 2}},
     "task.index: 2 is out of range"),
    ({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}},
     "cluster.worker[1]: duplicate address"),
    ({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker", "index": 0}},
     "cluster.worker[0]: port '99999'"),
    ({"cluster": {"wrker": ["a:1"]}, "task": {"type": "worker", "index": 0}},
     "cluster.wrker: unknown task type"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}},
     "task.type: 'ps' has no entry"),
    ({"cluster": {"worker": ["nohost"]}, "task": {"type": "worker", "index": 0}},
     "is not 'host:port'"),
])
def test_validation_names_the_field(cfg: dict, needle: str) -> None:
    problems = validate_tf_config(cfg)
    assert any(needle in p for p in problems), problems


def test_valid_config_has_no_problems() -> None:
    assert validate_tf_config({"cluster": {"worker": ["h:1", "h:2"]},
                               "task": {"type": "worker", "index": 1}}) == []


def test_a_task_that_did_not_answer_is_said_so_not_called_unset() -> None:
    """A probe that timed out says nothing about TF_CONFIG: the report must not claim it is
    unset (which sends the user to fix the wrong thing)."""
    good = {"tf_config": json.dumps({"cluster": {"worker": ["h:1", "h:2"]},
                                     "task": {"type": "worker", "index": 0}}),
            "host": "h", "resolve": {}, "ports": {}}
    report = analyse({"worker:0": good, "worker:1": {"error": "no answer within 10s"}},
                     {"worker:0": "worker:0", "worker:1": "worker:1"})
    assert not report.ok
    assert report.details == ["worker:1: did not answer the check (no answer within 10s)"]
    assert not any("not set" in d for d in report.details)


def test_a_task_never_inherits_rays_breakpoint_hook() -> None:
    """``ray.init()`` in the notebook's process sets PYTHONBREAKPOINT to Ray's debugger, which
    fails outside a Ray worker: a task's environment leaves it out (its breakpoint() is pdb,
    through the notebook); a user's own hook is kept."""
    from tfdist_nb.cluster.environment import worker_env
    from tfdist_nb.topology import TaskId

    task = TaskId("worker", 0)
    ray_set = {"PYTHONBREAKPOINT": "ray.util.rpdb._driver_set_trace", "PATH": "/bin"}
    env = worker_env(task, "{}", None, sys.executable, base=ray_set)
    assert "PYTHONBREAKPOINT" not in env and env["PATH"] == "/bin"
    own = worker_env(task, "{}", None, sys.executable, base={"PYTHONBREAKPOINT": "ipdb.set_trace"})
    assert own["PYTHONBREAKPOINT"] == "ipdb.set_trace"


def test_heartbeats_slow_down_only_beyond_512_tasks_and_never_against_the_user(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tfdist_nb.cluster.environment import telemetry_env
    from tfdist_nb.worker.telemetry import telemetry_interval

    monkeypatch.delenv("TFDIST_TELEMETRY_INTERVAL", raising=False)
    assert telemetry_env(2, {}) == telemetry_env(512, {}) == {}  # the default 1 s
    said = telemetry_env(1024, {})["TFDIST_TELEMETRY_INTERVAL"]
    assert telemetry_interval(said) == 2.0  # the tasks accept it: 512 samples a second in all
    assert telemetry_env(1024, {"TFDIST_TELEMETRY_INTERVAL": "0.5"}) == {}  # env= wins
    monkeypatch.setenv("TFDIST_TELEMETRY_INTERVAL", "1")
    assert telemetry_env(1024, {}) == {}  # so does the notebook's environment
