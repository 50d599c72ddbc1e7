"""Simulated tasks (tests/support/simulated_task.py): processes that speak the worker kernel's
protocol, the agent's RPC, telemetry and the collective ledger without TensorFlow, many to an OS
process, so the controller is measured at 1,024 tasks (bench/scale.py, issue 40). They keep the
launcher contract, and the controller's hang rules judge them as they judge real tasks."""

from __future__ import annotations

import pytest

from tests.support.contract import FAKE, check_launcher_contract
from tests.support.sim_launcher import SimulatedLauncher
from tfdist_nb import Cluster
from tfdist_nb.events import HANG, TaskNote

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
            [str(a) for a in c.hub.alerts]  # a healthy run: no detector speaks, no hang named
        notes: list[TaskNote] = []  # the hang's alert comes before the waiters are released
        result = c.run("steps 3 5\nworker:37> raise ValueError: bad batch\nwait", timeout=60,
                       on_event=lambda e: notes.append(e) if isinstance(e, TaskNote) else None)
        assert result.hang is not None, result.summary()
        named = [i for i, n in enumerate(notes) if n.topic == HANG]
        released = [i for i, n in enumerate(notes) if "aborted the collectives of" in n.text]
        assert len(named) == 1 and len(released) == 1 and named[0] < released[0], notes
        assert notes[named[0]].task == "worker:37" and "ValueError" in notes[named[0]].text
        alert = next(a for a in c.hub.alerts if a.kind == HANG)
        # by field: the tasks waiting when it was named (others may be released after it)
        assert alert.about and set(alert.about) <= set(result.hang.waiting), alert.about
        assert (result.hang.rule, result.hang.culprit) == ("failed", "worker:37")
        assert result.tasks["worker:37"].status == "error"
        assert {r.status for n, r in result.tasks.items() if n != "worker:37"} == {"aborted"}, \
            result.summary()
        assert "worker:37" in str(result.cause)
