"""A worker whose TensorFlow instrumentation cannot be installed says so, once.

The broken environment is real: a ``sitecustomize`` on the kernel's PYTHONPATH removes the
private TensorFlow method tfdist_nb stamps (as a TensorFlow release that moved it would) before
the worker agent starts; nothing of tfdist_nb is mocked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.processes import wait_for
from tfdist_nb import Cluster

pytestmark = pytest.mark.cluster

MOVED_IN_ANOTHER_RELEASE = """
from tensorflow.python.ops import collective_ops
del collective_ops.all_reduce_v2
"""
ERROR = "AttributeError: tensorflow.python.ops.collective_ops.all_reduce_v2 not found"


def test_a_failed_instrumentation_is_said_once_and_the_rest_keeps_working(
        tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(MOVED_IN_ANOTHER_RELEASE)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    with Cluster(workers=1, preload=("tensorflow",), env={"PYTHONPATH": path}) as c:
        # in the handshake, for status()
        (task,) = c.tasks.values()
        assert task.info["instrumentation_errors"] == {"collectives": ERROR}
        # as an alert naming what stops working
        said = wait_for(lambda: [a for a in c.alerts() if "could not instrument" in a], 15,
                        "the alert about the failed instrumentation")
        assert said == [f"worker:0: tfdist_nb could not instrument collectives on this task "
                        f"({ERROR}); not available on this task: the collective ledger and "
                        "the hang rules (%tfdist_collectives), straggler detection from "
                        "collective entry times in eager custom loops (training itself is "
                        "unaffected)"]
        # the other instrumentation is in place and steps still count; a second failure of
        # the same part (its install run again) is not said again
        result = c.run("import tfdist_nb.worker as tw\n"
                       "from tfdist_nb.worker import _collectives, _tfdata\n"
                       "from tensorflow.python.distribute import input_lib\n"
                       "_collectives.install()\n"
                       "base = input_lib._SingleWorkerDatasetIteratorBase\n"
                       "print('fetch timed', base.get_next_as_list._tfdist_timed)\n"
                       "with tw.step():\n    pass\n")
        assert result.ok, result.summary()
        assert result.tasks["worker:0"].stdout.strip() == "fetch timed True"
        assert list(c.status()["step"]) == [1]
        assert [a for a in c.alerts() if "could not instrument" in a] == said


def test_a_healthy_worker_reports_no_instrumentation_errors() -> None:
    with Cluster(workers=1, preload=("tensorflow",)) as c:
        (task,) = c.tasks.values()
        assert task.info["instrumentation_errors"] == {}
        assert c.run("print(1)").ok
        assert not [a for a in c.alerts() if "could not instrument" in a]
