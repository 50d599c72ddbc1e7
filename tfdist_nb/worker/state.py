"""The worker side's private state and its one bus to the controller: the task's identity, the
telemetry sender, what could not be instrumented, and the current step's accounting. Imports
nothing of TensorFlow, Keras or the rest of the worker side, so any worker module may use it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

MAX_SYNCS = 16
SPARE_ENV = "TFDIST_SPARE"

telemetry: Any = None  # set by tfdist_nb.worker.agent when running inside a worker kernel
#: what could not be instrumented on this task, "part" -> "ExcType: message" (agent.describe
#: and every telemetry sample carry it, so the controller can flag the task)
instrumentation_errors: dict[str, str] = {}

adopted = False  # a spare kernel became a task (worker/adopt.py)
steps = 0
input_wait_s: float | None = None  # the batch this step got through tw.timed took this long
input_entry: float | None = None  # wall time at which the step's batch was asked for
_fetch_s = 0.0  # this step's local tf.data fetch time so far (see worker._tfdata)
_fetch_done: float | None = None  # wall time at which the last local fetch returned
_syncs: list[float] = []  # when this step's eager collectives were entered (see _collectives)


def task_from_env() -> tuple[str, int] | None:
    """This process's ``(role, index)``: from TFDIST_TASK (set by every launcher) or TF_CONFIG."""
    named = os.environ.get("TFDIST_TASK")
    if named and ":" in named:
        role, _, index = named.partition(":")
        return role, int(index)
    try:
        cfg = json.loads(os.environ.get("TF_CONFIG", ""))
        return cfg["task"]["type"], int(cfg["task"]["index"])
    except (ValueError, KeyError, TypeError):
        return None


# Read once, when tfdist_nb.worker is first imported (it imports this module); later changes of
# the environment count only through set_task (a spare adopted, an attached worker told its task).
_task: tuple[str, int] | None = task_from_env()


def get_task() -> tuple[str, int] | None:
    """This task's ``(role, index)``, None while it has none (a spare): ``tw.task``."""
    return _task


def set_task(task: tuple[str, int] | None) -> None:
    """This process becomes ``task``: what ``tw.task`` and the worker side read from now on."""
    global _task
    _task = task


def task_name() -> str | None:
    """This task as ``"worker:1"``, None while it has none."""
    return f"{_task[0]}:{_task[1]}" if _task else None


def is_spare() -> bool:
    """Whether this kernel is (still) a spare: started as one and not yet adopted."""
    return os.environ.get(SPARE_ENV) == "1" and not adopted


def note(text: str, level: str = "INFO", finding: str | None = None,
         facts: dict[str, object] | None = None) -> None:
    """Tell the controller something this task found (it becomes an alert for WARNING);
    ``finding``: its kind (``tfdist_nb.events.Finding``), said once for the cluster; ``facts``:
    what it saw, as values the controller reads instead of the text."""
    if telemetry is not None:
        telemetry.note(text, level, finding, facts)


def instrumentation_failed(part: str, stops: str, exc: BaseException) -> None:
    """A patch of TensorFlow or Keras could not be installed (a private name moved in another
    release): said once per task and part, as a WARNING note (an alert in the controller), since
    the detection that needs it silently stops otherwise (docs/design.md, "Findings from inside
    the task")."""
    if part in instrumentation_errors:
        return
    error = f"{type(exc).__name__}: {exc}"
    instrumentation_errors[part] = error
    note(f"tfdist_nb could not instrument {part} on this task ({error}); not available on this "
         f"task: {stops} (training itself is unaffected)", "WARNING")


def local_fetch(seconds: float) -> None:
    """A distributed iterator took this task's batch from its own pipeline in ``seconds``."""
    global _fetch_s, _fetch_done
    _fetch_s += seconds
    _fetch_done = time.time()


def entered_collective(at: float) -> None:
    if len(_syncs) < MAX_SYNCS:
        _syncs.append(at)


def record_step(begin: float, duration_s: float, input_wait_s: float | None = None,
                entry: float | None = None) -> None:
    """``entry``: when this task reached the step's first synchronisation point (the straggler
    arrives last): it asked for the batch or began the step, or, after a distributed iterator's
    fetch, when the local fetch returned (the all-reduce follows it)."""
    global steps, _fetch_s, _fetch_done, _syncs
    steps += 1
    fetch_s, fetch_done, syncs = _fetch_s, _fetch_done, _syncs
    _fetch_s, _fetch_done, _syncs = 0.0, None, []
    if telemetry is not None:
        arrival = fetch_done if fetch_done is not None else (entry or begin)
        telemetry.record_step(begin, duration_s, input_wait_s, arrival,
                              fetch_s if fetch_done is not None else None, syncs)
