"""Simulated tasks (tests/support/simulated_task.py): processes that speak the worker kernel's
protocol, the agent's RPC, telemetry and the collective ledger without TensorFlow, many to an OS
process, so the controller is measured at 1,024 tasks (bench/scale.py, issue 40). They keep the
launcher contract, and the controller's hang rules judge them as they judge real tasks."""

from __future__ import annotations

import pytest

from tests.support.contract import FAKE, check_launcher_contract
from tests.support.sim_launcher import SimulatedLauncher
from tfdist_nb import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def test_simulated_tasks_keep_the_launcher_contract() -> None:
    with Cluster(workers=2, launcher=SimulatedLauncher(per_process=2), preload=(),
                 warm=False) as c:
        check_launcher_contract(c, FAKE)


def test_a_hang_among_64_simulated_tasks_is_named_with_its_culprit() -> None:
    with Cluster(workers=64, launcher=SimulatedLauncher(), preload=(), warm=False,
                 start_timeout=180) as c:
        healthy = c.run("steps 20 5", timeout=60)
        assert healthy.ok and healthy.hang is None, healthy.summary()
        assert not any(a.level in ("WARNING", "ERROR") for a in c.hub.alerts), \
            [str(a) for a in c.hub.alerts]  # a healthy run: no detector speaks
        result = c.run("steps 3 5\nworker:37> raise ValueError: bad batch\nwait", timeout=60)
        assert result.hang is not None, result.summary()
        assert (result.hang.rule, result.hang.culprit) == ("failed", "worker:37")
        assert result.tasks["worker:37"].status == "error"
        assert {r.status for n, r in result.tasks.items() if n != "worker:37"} == {"aborted"}, \
            result.summary()
        assert "worker:37" in str(result.cause)
