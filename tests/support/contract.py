"""What every launcher must give a user, as one check each launcher's test module runs on its
own cluster (tests/test_launcher_contract.py for local and the fake one; the ssh, attach and
SLURM modules on their test hosts, scheduler and nodes): cells run on every task with their
output attributed, an error and a crash are told apart, an interrupt releases a sleeping cell,
and a restart either gives fresh processes or is refused saying what to do instead."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.errors import TfdistError

#: a cell in the fake launcher's tiny script language (tests/support/fake_launcher.py) and in
#: Python, for each step of the contract
PYTHON = {
    "hello": "import tfdist_nb.worker as tw\nprint('hello from', tw.task[0], tw.task[1])",
    "fail": "raise ValueError('bad batch')",
    "sleep": "import time\ntime.sleep(60)",
    "crash": "import os\nos._exit(3)",
    "ok": "x = 1",
}
FAKE = {
    "hello": "print hello", "fail": "raise ValueError: bad batch", "sleep": "sleep 60",
    "crash": "die 3", "ok": "print ok",
}


def check_launcher_contract(c: Cluster, cells: dict[str, str] = PYTHON) -> None:
    names = [rt.name for rt in c.tasks.values()]
    assert len(names) >= 2, "the contract needs two tasks"
    hello = c.run(cells["hello"], timeout=60)
    assert hello.ok and set(hello.tasks) == set(names), hello.summary()
    if cells is PYTHON:  # each task's output is its own
        for name, r in hello.tasks.items():
            assert r.stdout.strip() == f"hello from {name.replace(':', ' ')}", r.stdout
    failed = c.run(cells["fail"], on=names[1], timeout=60)
    r = failed.tasks[names[1]]
    assert (r.status, r.error.ename if r.error else None) == ("error", "ValueError"), r

    results: list[Any] = []
    sleeper = threading.Thread(target=lambda: results.append(c.run(cells["sleep"],
                                                                   timeout=120)))
    sleeper.start()
    wait_for(lambda: set(c.status()["state"]) == {"busy"}, 30, "the sleeping cell")
    c.interrupt()
    sleeper.join(60)
    assert results and {r.status for r in results[0].tasks.values()} == {"interrupted"}, \
        results and results[0].summary()

    crashed = c.run(cells["crash"], on=names[0], timeout=60)
    assert crashed.tasks[names[0]].status == "crashed", crashed.summary()
    if c.launcher.restartable:
        before = {rt.name: rt.pid for rt in c.tasks.values()}
        c.restart()
        after = {rt.name: rt.pid for rt in c.tasks.values()}
        assert not set(before.values()) & set(after.values())
        assert c.run(cells["ok"], timeout=60).ok
    else:
        with pytest.raises(TfdistError) as err:
            c.restart()
        assert c.launcher.restart_instead in str(err.value)
