"""The status table of a cluster (columns of docs/reference.md): a pure function of the task
runtimes and the live store."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping

import pandas as pd

from tfdist_nb.cluster.state import TaskState
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.store.tails import LiveStore

STATUS_COLUMNS = ["task", "host", "pid", "state", "step", "step_time_ms", "input_wait_ms",
                  "cpu_percent", "rss_mb", "gpus", "gpu_util_percent", "gpu_mem_mb",
                  "net_rx_mb_s", "net_tx_mb_s", "last_output_s_ago", "flags", "net_scope"]
_NUMERIC = [c for c in STATUS_COLUMNS[5:15] if c != "gpus"]
_SAMPLED = ("cpu_percent", "rss_mb", "gpu_util_percent", "gpu_mem_mb", "net_rx_mb_s",
            "net_tx_mb_s")


def waiting_for_prompt(tasks: Iterable[TaskRuntime], live: LiveStore) -> dict[str, list[str]]:
    """The tasks inside a collective while another task of the group (chief and workers) waits
    at an input prompt, each with those at a prompt: a wait for a person, not a hang
    (docs/reference.md, Input from the tasks)."""
    tasks = list(tasks)
    prompting = [rt.name for rt in tasks
                 if rt.state is TaskState.PROMPT and rt.task.role in ("chief", "worker")]
    if not prompting:
        return {}
    return {rt.name: others for rt in tasks
            if rt.state in (TaskState.BUSY, TaskState.STALLED)
            and (others := [p for p in prompting if p != rt.name])
            and live.view(rt.name).ledger.current() is not None}


def task_flags(rt: TaskRuntime, latest: Mapping[str, object], stragglers: Collection[str],
               waits_for_prompt: bool = False) -> str:
    """Short markers of what is wrong with a task, comma separated (docs/reference.md, Status
    columns)."""
    flags = []
    if rt.name in stragglers:
        flags.append("straggler")
    if waits_for_prompt:
        flags.append("waits-for-prompt")
    if rt.info.get("instrumentation_errors") or latest.get("instrumentation_errors"):
        flags.append("no-instrumentation")
    return ",".join(flags)


def status_frame(tasks: Iterable[TaskRuntime], live: LiveStore,
                 stragglers: Collection[str]) -> pd.DataFrame:
    """One row per task from its own telemetry; no GPU (or no reading yet) is NaN, never 0."""
    rows = []
    now = time.time()
    tasks = list(tasks)
    waiting = waiting_for_prompt(tasks, live)
    for rt in tasks:
        v = live.view(rt.name)
        alive = rt.state not in (TaskState.DEAD, TaskState.STOPPED)
        latest = v.latest if alive else {}
        last_output = v.last_output
        rows.append({
            "task": rt.name, "host": rt.host, "pid": rt.pid, "state": rt.shown_state,
            "step": v.step_count, "step_time_ms": v.step_time_ms(),
            "input_wait_ms": v.input_wait_ms(),
            **{k: latest.get(k) for k in _SAMPLED},
            "gpus": rt.gpus,  # what it was given (docs/reference.md, GPUs)
            "last_output_s_ago": None if last_output is None else round(now - last_output, 1),
            "flags": task_flags(rt, latest, stragglers, rt.name in waiting),
            "net_scope": latest.get("net_scope"),  # "host", "cluster-netns" or "task-netns"
        })
    return pd.DataFrame(rows, columns=STATUS_COLUMNS).astype({c: "float64" for c in _NUMERIC})
