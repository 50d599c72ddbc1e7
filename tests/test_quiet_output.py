"""The cell shows the tasks' own output; TensorFlow's INFO records are held back, counted, and
kept in the run directory (docs/reference.md, Output in the cell). ``--verbose`` shows them."""

from __future__ import annotations

import io
from typing import Any

import pytest

from tests.support.cells import cell
from tfdist_nb import Cluster
from tfdist_nb.display.printer import LivePrinter
from tfdist_nb.events import OutputLine
from tfdist_nb.store.logs import tensorflow_info

pytestmark = pytest.mark.cluster


def _run(c: Any, verbose: bool) -> tuple[str, LivePrinter]:
    out = io.StringIO()
    printer = LivePrinter(stdout=out, stderr=out, colour=False, verbose=verbose)
    result = c.run(cell("mwms_loop"), on_event=printer, timeout=120)
    assert result.ok, result.summary()
    return out.getvalue(), printer


def test_tensorflow_info_is_held_back_and_kept_and_verbose_shows_it() -> None:
    with Cluster(workers=2) as c:
        quiet, printer = _run(c, verbose=False)
        # the user's own output, all of it
        assert quiet.count("[worker:0] loss ") == 20 and quiet.count("[worker:1] loss ") == 20
        assert "final loss" in quiet
        # TensorFlow's INFO records of strategy start-up are not in the cell ...
        assert "coordination_service" not in quiet and "Started server" not in quiet
        assert printer.held_back > 0
        note = printer.held_back_note()
        assert note is not None and f"{printer.held_back} TensorFlow INFO" in note
        # ... but in the merged log, found by level
        info = c.logs(level="INFO")
        assert info["text"].str.contains("coordination").any()
        assert set(info["level"]) == {"INFO"}
        held = [t for t in c.logs()["text"] if "Started server with target" in t]
        assert len(held) == 2  # one per task, on disk

        c.restart()  # a second MultiWorkerMirroredStrategy needs fresh kernels
        loud, printer = _run(c, verbose=True)
        assert "Started server with target" in loud and "coordination" in loud
        assert printer.held_back == 0 and printer.held_back_note() is None


def test_continuation_lines_of_a_held_record_are_held_with_it() -> None:
    """A C++ record spanning lines arrives in one message; its unprefixed lines go with it,
    while the task's own stderr lines in other messages are shown."""
    out = io.StringIO()
    printer = LivePrinter(stdout=out, stderr=out, colour=False)
    stamp = "0000 00:00:1796286510.381206   10294"
    warning = f"W{stamp} dataset.cc:997] Input will not be optimized"
    lines = [
        (1.0, f"I{stamp} coordination_service.cc:505] Example stragglers:"),
        (1.0, "/job:worker/replica:0/task:1"),
        (1.0, warning),
        (2.0, "/job:worker/replica:0/task:1 is what my own code printed"),
    ]
    for t, text in lines:
        printer(OutputLine(t, "worker:0", "stderr", text, 1))
    shown = out.getvalue().splitlines()
    assert shown == [f"[worker:0] {warning}",
                     "[worker:0] /job:worker/replica:0/task:1 is what my own code printed"]
    assert printer.held_back == 2
    assert tensorflow_info("stdout", "INFO:tensorflow:Using MirroredStrategy")
    assert not tensorflow_info("stdout", "INFO:root:my own record")
    assert not tensorflow_info("stderr", warning)
    # absl's line before the first C++ record (a task's first cell prints it with TF 2.16)
    assert tensorflow_info("stderr", "WARNING: All log messages before absl::InitializeLog() "
                                     "is called are written to STDERR")
    assert not tensorflow_info("stderr", "WARNING: my own warning about absl::InitializeLog()")


def test_known_harmless_lines_are_said_once_per_cluster_not_per_task() -> None:
    """The quickstart's Dataset.from_generator makes every task print TensorFlow's
    GeneratorDatasetOp warning: one closing line names the tasks, once; the task's own
    warning, and a real TensorFlow warning, are shown."""
    out = io.StringIO()
    printer = LivePrinter(stdout=out, stderr=out, colour=False)
    noise = ("2026-12-06 22:59:58.033510: W tensorflow/core/framework/dataset.cc:959] Input of "
             "GeneratorDatasetOp::Dataset will not be optimized because the dataset does not "
             "implement the AsGraphDefInternal() method needed to apply optimizations.")
    real = "W0000 00:00:1.0   1 collective_ops.cc:12] all-reduce group size differs"
    for task in ("worker:1", "worker:0"):
        printer(OutputLine(1.0, task, "stderr", noise, 1))
    printer(OutputLine(2.0, "worker:0", "stderr", real, 1))
    printer(OutputLine(3.0, "worker:0", "stdout", "my own warning: lr too high", 1))
    shown = out.getvalue()
    assert "GeneratorDatasetOp" not in shown
    assert real in shown and "my own warning: lr too high" in shown
    [said] = printer.noise_notes()
    assert said.startswith("tfdist_nb: TensorFlow noted on 2 task(s) (worker:0, worker:1) that "
                           "a Dataset.from_generator input is not graph-optimized: harmless")
    printer(OutputLine(4.0, "worker:0", "stderr", noise, 2))  # the next cell: not said again
    assert printer.noise_notes() == []
