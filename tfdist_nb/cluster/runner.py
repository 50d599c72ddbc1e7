"""Running one cell on several tasks at once, with every way it can end bounded in time: a run
that ends early (a crash, a detector, ``timeout``, an interrupt) interrupts the remaining tasks
and gives them ``grace_s`` to answer before they are left behind. While a task waits at an input
prompt the run waits for a person: no detector ends it (docs/reference.md, Input from the tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfdist_nb.cluster.early_words import explain_early, stack_targets, who_waits
from tfdist_nb.cluster.state import TaskEvent, TaskState
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.diagnostics.crash import crash_report, describe_exit, likely_oom
from tfdist_nb.diagnostics.explain import explain
from tfdist_nb.diagnostics.hangs import Ended, hang_said, judge, ledger_overview, release_waiters
from tfdist_nb.diagnostics.stall import StallWatch
from tfdist_nb.ledger_runs import LedgerRow
from tfdist_nb.results import Hang, RemoteError, TaskResult, TaskStatus, error_site
from tfdist_nb.strenum import StrEnum
from tfdist_nb.transport.channel import Execution, Prompt
from tfdist_nb.worker.memory_limits import read_oom_kills
from tfdist_nb.worker.replies import Stacks

if TYPE_CHECKING:  # what the runner may ask of the cluster about a task while it is busy
    from tfdist_nb.cluster.inspector import Inspector

POLL_S = 0.2
_THIS_HOST = {"localhost", "127.0.0.1", socket.gethostname()}
#: wait for a task's idle status after its reply (its last output comes before it); a loaded
#: host can delay it past 2 s
IDLE_AFTER_REPLY_S = 5.0
STALL_SLACK_S = 2.0
CRASH_LEDGER_WAIT_S = 1.0
ABORT_ANSWER_S = 5.0


class RunEnd(StrEnum):
    """Why a run ended before every task answered."""

    TIMEOUT = "timeout"  # the cell's --timeout
    STALL = "stall"  # the stall detector
    CRASH = "crash"  # a task's process ended
    HANG = "hang"  # the hang rules proved a hang (``RunControl.hang``)
    INTERRUPT = "interrupt"  # the user's interrupt
    STOPPED = "stopped"  # the cluster is being stopped


S = TaskStatus

#: Ends that a detector decided: the tasks' collectives are aborted to release them.
_DETECTED = (RunEnd.STALL, RunEnd.CRASH, RunEnd.HANG)


@dataclass(eq=False)
class RunControl:
    """Set from the caller's thread (through the loop) to end a run early."""

    reason: RunEnd | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stalled: set[str] = field(default_factory=set)
    hang: Hang | None = None  # what the hang rules proved (diagnostics/hangs.py)

    def stop(self, reason: RunEnd) -> None:
        self.reason = self.reason or reason
        self.wake.set()


async def run_cell(tasks: list[TaskRuntime], code: str, cell: int | None, timeout: float | None,
                   control: RunControl, grace_s: float = 5.0, inspector: Inspector | None = None,
                   stall_timeout: float | None = None,
                   on_prompt: Callable[[Prompt], None] | None = None,
                   silent: bool = False) -> dict[str, TaskResult]:
    """Run ``code`` on ``tasks`` until each replied or the run ends early. ``on_prompt`` gets
    the tasks' questions (on this loop); ``silent``: not a user's cell (a debugger)."""
    by_name = {rt.name: rt for rt in tasks}

    def asked(prompt: Prompt) -> None:  # the state says so before anyone is asked
        if by_name[prompt.task].state in (TaskState.BUSY, TaskState.STALLED):
            by_name[prompt.task].transition(TaskEvent.PROMPTED)
        assert on_prompt is not None
        on_prompt(prompt)

    execs = {rt.name: rt.live_channel.execute(code, cell, silent=silent,
                                              on_prompt=asked if on_prompt else None)
             for rt in tasks}
    for rt in tasks:
        if rt.state is not TaskState.DEAD:  # found dead just now: reported as crashed below
            rt.transition(TaskEvent.RUN)
    results: dict[str, TaskResult] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    watch = StallWatch(stall_timeout) if stall_timeout and inspector else None
    while len(results) < len(tasks) and control.reason is None:
        pending = [n for n in by_name if n not in results]
        await _wait_any([execs[n].reply for n in pending] + [control.wake]
                        + [by_name[n].live_handle.exit_future() for n in pending], POLL_S)
        for name in pending:
            rt, ex = by_name[name], execs[name]
            if ex.reply.done():
                results[name] = await _finished(rt, ex)
            elif (exit_code := await rt.live_handle.check_exit()) is not None:
                results[name] = _crashed(rt, ex, exit_code, inspector)
                control.stop(RunEnd.CRASH)
        prompting = track_prompts(by_name, execs, results)
        if inspector is not None:
            busy = [by_name[n] for n in by_name if n not in results]
            if control.reason is None and busy and not prompting and (
                    hang := find_hang(inspector, by_name, results, cell or 0)) is not None:
                control.hang = hang
                control.stop(RunEnd.HANG)
                inspector.hang_named(hang)  # said now: releasing the waiters takes a while
                break
            ended = {n: r.status for n, r in results.items()}
            for rt in busy:
                inspector.heartbeat_gap(rt, busy, ended, execs[rt.name].started)
            if prompting:  # a person is asked: nothing is stalled meanwhile (module docstring)
                if watch is not None:
                    watch.hold([rt.name for rt in busy], time.time())
                for rt in busy:
                    if rt.name not in prompting:
                        inspector.waits_for_prompt(rt, prompting)
            elif watch is not None:
                _watch_stalls(watch, inspector, busy, control)
        if deadline is not None and time.monotonic() >= deadline:
            control.stop(RunEnd.TIMEOUT)
    if control.reason is not None:
        results.update(await _end_early(by_name, execs, results, control, grace_s, inspector,
                                        stall_timeout, cell or 0))
    return {rt.name: results[rt.name] for rt in tasks}


def track_prompts(by_name: dict[str, TaskRuntime], execs: dict[str, Execution],
                  results: dict[str, TaskResult]) -> list[str]:
    """Move running tasks between ``busy`` and ``prompt``; returns those at a prompt now."""
    prompting = []
    for name, rt in by_name.items():
        if name in results:
            continue
        if execs[name].prompt is not None or rt.at_breakpoint:
            prompting.append(name)
            if rt.state in (TaskState.BUSY, TaskState.STALLED):
                rt.transition(TaskEvent.PROMPTED)
        elif rt.state is TaskState.PROMPT:
            rt.transition(TaskEvent.ANSWERED)
    return prompting


def find_hang(inspector: Inspector, by_name: dict[str, TaskRuntime],
              results: dict[str, TaskResult], cell: int) -> Hang | None:
    """Ask the hang rules whether the ledgers prove a hang now (docs/reference.md,
    "Collectives and hangs")."""
    members = inspector.members()
    ledgers = {name: inspector.ledger(name) for name in members | set(by_name)}
    ended = {name: Ended(name, r.status, _said(r),
                         error_site(r.error, cell), inspector.cell_steps(by_name[name]))
             for name, r in results.items() if r.status in (S.OK, S.ERROR, S.CRASHED)}
    busy = {name: ledgers[name] for name in by_name if name not in results}
    steps = {name: inspector.cell_steps(rt) for name, rt in by_name.items()}
    return judge(ended, busy, ledgers, members, members - set(by_name), steps, time.time())


def _said(r: TaskResult) -> str | None:
    if r.error is None:
        return None
    if r.status is S.CRASHED:  # "worker:1 killed by SIGKILL" -> "killed by SIGKILL"
        return r.error.evalue.removeprefix(f"{r.task} ")
    return r.error.short()


def _watch_stalls(watch: StallWatch, inspector: Inspector, busy: list[TaskRuntime],
                  control: RunControl) -> None:
    now = time.time()
    found = [rt for rt in busy if watch.observe(rt.name, inspector.progress(rt), now)]
    if not found:
        return
    # Others quiet for about as long stalled too: heartbeats are a second apart, so which task
    # crosses the line first is chance.
    slack = watch.stall_timeout - STALL_SLACK_S
    for rt in busy:
        if rt in found or watch.quiet_for(rt.name, now) >= slack:
            control.stalled.add(rt.name)
            if rt.state is TaskState.BUSY:
                rt.transition(TaskEvent.NO_PROGRESS)
    control.stop(RunEnd.STALL)


async def _wait_any(futures: list, timeout: float) -> None:
    waiters = [asyncio.ensure_future(f.wait()) if isinstance(f, asyncio.Event) else f
               for f in futures]
    await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for w, f in zip(waiters, futures, strict=False):
        if isinstance(f, asyncio.Event) and not w.done():
            w.cancel()


async def _finished(rt: TaskRuntime, ex: Execution,
                    status: TaskStatus | None = None) -> TaskResult:
    if ex.reply.cancelled():  # the channel closed under us: the cluster is being stopped
        rt.live_channel.abandon(ex)
        result = _result(rt, ex, status or S.INTERRUPTED, None)
        result.explanation = "the cluster was stopped while the cell ran"
        return result
    reply = ex.reply.result()
    # the reply can overtake the last output on iopub; idle says all of it is in
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(ex.idle), IDLE_AFTER_REPLY_S)
    rt.live_channel.abandon(ex)
    rt.finish_run()
    error = None
    if reply.get("status") == "error":
        error = RemoteError(reply.get("ename", ""), reply.get("evalue", ""),
                            list(reply.get("traceback", [])))
    elif reply.get("status") == "aborted":
        error = RemoteError("Aborted", "the kernel aborted this request", [])
    if status is None:  # a KeyboardInterrupt is the user's interrupt, not a bug in the cell
        status = (S.OK if error is None else
                  S.INTERRUPTED if error.ename == "KeyboardInterrupt" else S.ERROR)
    result = _result(rt, ex, status, error)
    if error is not None:
        result.explanation = explain(error.ename, error.evalue, rt.info.get("keras_flavour"))
    return result


def _crashed(rt: TaskRuntime, ex: Execution, code: int,
             inspector: Inspector | None) -> TaskResult:
    rt.live_channel.abandon(ex)
    rt.transition(TaskEvent.EXITED)
    last, lines = inspector.last_words(rt) if inspector else (None, [])
    what = rt.handle.describe_exit(code) if rt.handle else describe_exit(code)
    after = _memory_after_death(rt, last)
    oom = likely_oom(code, last, after)
    error = RemoteError("TaskCrashed", f"{rt.name} {what}" + (" (likely out of memory)"
                                                              if oom else ""), [])
    result = _result(rt, ex, S.CRASHED, error)
    result.explanation = crash_report(rt.name, code, last, lines, rt.kernel_log_tail(15),
                                      what=what, after=after)
    return result


def _memory_after_death(rt: TaskRuntime,
                        last: dict[str, Any] | None) -> dict[str, int | None] | None:
    """The dead task's memory cgroup read now, when it is on this machine: an OOM kill count
    that rose since its last sample shows an allocation that outran the sampling."""
    cgroup = (last or {}).get("mem_cgroup")
    if not cgroup or rt.handle is None or rt.handle.host not in _THIS_HOST:
        return None
    return {"oom_kills": read_oom_kills(cgroup)}


async def _end_early(by_name: dict[str, TaskRuntime], execs: dict[str, Execution],
                     done: dict[str, TaskResult], control: RunControl, grace_s: float,
                     inspector: Inspector | None, stall_timeout: float | None,
                     cell: int = 0) -> dict[str, TaskResult]:
    """Release and report the tasks still running: stacks first (they show where each task
    stood), then collectives aborted (stall, crash), then SIGINT, then ``grace_s`` to answer."""
    reason = control.reason or RunEnd.INTERRUPT
    rest = [by_name[n] for n in by_name if n not in done]
    # tasks the hang rules know hold the GIL (a strategy's start-up), and tasks whose process
    # has ended too (a job cancelled ends them all at once): nothing they would answer
    frozen = control.hang.frozen if control.hang is not None else set()
    ended = await asyncio.gather(*(rt.live_handle.check_exit() for rt in rest))
    reachable = [rt for rt, code in zip(rest, ended, strict=True)
                 if rt.name not in frozen and code is None]
    stacks: dict[str, Stacks | None] = {}
    asked = stack_targets([rt.name for rt in reachable],
                          set(control.hang.waiting) if control.hang is not None else None)
    if inspector is not None and (reason is RunEnd.TIMEOUT or reason in _DETECTED):
        found = await asyncio.gather(*(inspector.stacks(by_name[n]) for n in asked))
        stacks = dict(zip(asked, found, strict=True))
    ledgers = ({n: inspector.ledger(n) for n in by_name} if inspector is not None else {})
    # where each task stood, read before the abort below moves the open rows to "aborted"
    stood = (ledger_overview(ledgers, time.time())
             if reason in (RunEnd.STALL, RunEnd.TIMEOUT) else "")
    if inspector is not None and reason is RunEnd.CRASH and control.hang is None:
        control.hang = await _hang_after_crash(inspector, by_name, done, cell, stacks)
        if control.hang is not None:
            inspector.hang_named(control.hang)
    if inspector is not None and reason in _DETECTED:
        why = f"{control.hang.rule} task {control.hang.culprit}" if control.hang else str(reason)
        # an aborted collective raises TensorFlow's error at once; a SIGINT landing while that
        # error is built (pybind11's "MISMATCH of original and normalized active exception
        # types" on TF 2.16) or its traceback formatted (IPython takes 1-2 s over TensorFlow's
        # frames) replaces it or empties the traceback: a task inside one answers first
        inside = [execs[rt.name].reply for rt in reachable if ledgers[rt.name].open_rows()]
        await inspector.abort_collectives(reachable, f"{why} in the cluster")
        if inside:
            await asyncio.wait(inside, timeout=ABORT_ANSWER_S)
    await asyncio.gather(*(rt.live_handle.interrupt() for rt in reachable
                           if not execs[rt.name].reply.done()), return_exceptions=True)
    grace_s = 0.0 if reason is RunEnd.STOPPED else grace_s
    if reachable:
        await asyncio.wait([execs[rt.name].reply for rt in reachable], timeout=grace_s)
    hang = control.hang
    overview = "" if hang else who_waits(stacks)
    if stood:
        overview = f"{overview}\n{stood}" if overview else stood
    aborted = ({rt.name for rt in reachable} if inspector is not None and reason in _DETECTED
               else set())
    ends = await asyncio.gather(*(  # each waits for its own idle: at once, not one by one
        _early_result(rt, execs[rt.name], S.ABORTED if hang is not None and rt.name in hang.waiting
                      else S.TIMEOUT if reason is RunEnd.TIMEOUT
                      else S.STALLED if rt.name in control.stalled else S.INTERRUPTED,
                      reason, grace_s, inspector) for rt in rest))
    out = {rt.name: r for rt, r in zip(rest, ends, strict=True)}
    if hang is not None and inspector is not None:
        await _released(hang, inspector, {**done, **out}, execs, aborted)
    for rt in rest:
        if hang is not None and out[rt.name].status is not S.CRASHED:
            out[rt.name].explanation = hang_said(hang, out[rt.name])
        explain_early(out[rt.name], stacks.get(rt.name), reason in _DETECTED, stall_timeout,
                      skipped=rt.name not in stacks and rt.name in aborted)
        if overview and (said := out[rt.name].explanation):
            out[rt.name].explanation = f"{said}\n{overview}"
    return out


async def _released(hang: Hang, inspector: Inspector, results: dict[str, TaskResult],
                    execs: dict[str, Execution], aborted: set[str]) -> None:
    """Every task released because of the hang's culprit ends ``aborted`` naming it
    (hangs.release_waiters); its rows may come a moment after its reply: up to a second."""
    def rows(name: str) -> list[LedgerRow]:  # this cell's
        return [r for r in inspector.ledger(name).recent(50)
                if r.get("entered", 0.0) >= execs[name].started - 1.0]

    deadline = time.monotonic() + CRASH_LEDGER_WAIT_S
    while release_waiters(hang, results, rows, inspector.ledger(hang.culprit),
                          inspector.members(), aborted, time.time()):
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(POLL_S / 2)


async def _hang_after_crash(inspector: Inspector, by_name: dict[str, TaskRuntime],
                            done: dict[str, TaskResult], cell: int,
                            stacks: dict[str, Stacks | None]) -> Hang | None:
    """The crash as a hang rule sees it (the others released as ``aborted``, naming the dead
    task). A task whose stack is inside a TensorFlow op but whose ledger row has not arrived
    yet (rows that stay open go out within half a second) is waited for, up to a second."""
    deadline = time.monotonic() + CRASH_LEDGER_WAIT_S
    while True:
        hang = find_hang(inspector, by_name, done, cell)
        inside = any(s and s.get("main", {}).get("kind") == "tensorflow"
                     for s in stacks.values())
        if hang is not None or not inside or time.monotonic() >= deadline:
            return hang
        await asyncio.sleep(POLL_S / 2)


async def _early_result(rt: TaskRuntime, ex: Execution, status: TaskStatus, reason: RunEnd,
                        grace_s: float, inspector: Inspector | None) -> TaskResult:
    if ex.reply.done():
        return await _finished(rt, ex, status)
    if (code := await rt.live_handle.check_exit()) is not None:
        return _crashed(rt, ex, code, inspector)
    rt.live_channel.abandon(ex)  # no one answers its prompt now: it is busy, left behind
    if rt.state is TaskState.PROMPT:
        rt.transition(TaskEvent.ANSWERED)
    res = _result(rt, ex, status, None)
    if reason is RunEnd.STOPPED:
        res.explanation = "the cluster was stopped while the cell ran"
    elif inspector is not None and (stopped := inspector.stopped(rt)):
        res.explanation = f"{rt.name} cannot answer: its {stopped}."
    else:
        res.explanation = (
            f"{rt.name} did not answer within {grace_s:.0f}s and is still busy "
            "(a thread blocked in a TensorFlow op holds no Python frame to interrupt); "
            "restart it with %tfdist_restart.")
    return res


def _result(rt: TaskRuntime, ex: Execution, status: TaskStatus,
            error: RemoteError | None) -> TaskResult:
    return TaskResult(task=rt.name, status=status, stdout="".join(ex.stdout),
                      stderr="".join(ex.stderr), error=error,
                      duration_s=time.time() - ex.started, outputs=list(ex.outputs),
                      error_at=ex.error_at)
