"""The launcher contract (tests/support/contract.py) on the local launcher and on the fake one
the process-free tests use; the ssh, attach and SLURM launchers run the same check in their own
modules, on their test hosts, scheduler and nodes."""

from __future__ import annotations

import pytest

from tests.support.contract import FAKE, check_launcher_contract
from tests.support.fake_launcher import FakeLauncher
from tfdist_nb import Cluster

pytestmark = pytest.mark.timeout(240)


@pytest.mark.cluster
def test_the_local_launcher_keeps_the_contract() -> None:
    with Cluster(workers=2, preload=(), warm=False) as c:
        check_launcher_contract(c)


def test_the_fake_launcher_keeps_the_contract() -> None:
    with Cluster(workers=2, launcher=FakeLauncher(), preload=(), warm=False) as c:
        check_launcher_contract(c, FAKE)
