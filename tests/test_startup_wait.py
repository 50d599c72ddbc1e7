"""Reading MWMS start-up waits from TensorFlow's log lines (pure)."""

from __future__ import annotations

from tfdist_nb.diagnostics.startup import StartupWaitDetector


def test_waiting_lines_name_the_missing_task() -> None:
    d = StartupWaitDetector()
    lines = ["I0000 00:00:1796223040.005886 2629 coordination_service.cc:502] Waiting for 1/2 "
             "tasks to connect.",
             "I0000 00:00:1796223040.005896 2629 coordination_service.cc:505] Example stragglers:",
             "/job:worker/replica:0/task:1"]
    found = [d.feed("worker:0", x) for x in lines]
    assert found[:2] == [None, None]
    wait = found[2]
    assert (wait.task, wait.missing, wait.total, wait.stragglers) == ("worker:0", 1, 2,
                                                                      ["worker:1"])


def test_all_connected_is_not_a_wait() -> None:
    d = StartupWaitDetector()
    assert d.feed("worker:0", "... Waiting for 0/2 tasks to connect.") is None
    assert d.feed("worker:0", "/job:worker/replica:0/task:1") is None
