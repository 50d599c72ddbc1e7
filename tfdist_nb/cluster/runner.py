"""Running one cell on several tasks at once, with every way it can end bounded in time.

A run ends when every targeted task replied, or earlier: when a task's process exits (crashed), at
the cell's ``timeout``, or when the user interrupts. Then the remaining tasks are interrupted and
given ``grace_s`` to answer before they are left behind (their late output still reaches the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, field

from tfdist_nb.cluster.results import RemoteError, TaskResult
from tfdist_nb.cluster.state import TaskEvent
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.diagnostics.explain import explain
from tfdist_nb.transport.channel import Execution

POLL_S = 0.2
IDLE_AFTER_REPLY_S = 2.0


@dataclass(eq=False)
class RunControl:
    """Set from the caller's thread (through the loop) to end a run early."""

    reason: str | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.wake.set()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (likely out of memory: the kernel's OOM killer sends SIGKILL)" \
            if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"


async def run_cell(tasks: list[TaskRuntime], code: str, cell: int, timeout: float | None,
                   control: RunControl, grace_s: float = 5.0) -> dict[str, TaskResult]:
    execs = {rt.name: rt.channel.execute(code, cell) for rt in tasks}
    for rt in tasks:
        rt.transition(TaskEvent.RUN)
    by_name = {rt.name: rt for rt in tasks}
    results: dict[str, TaskResult] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    while len(results) < len(tasks) and control.reason is None:
        pending = [n for n in by_name if n not in results]
        await _wait_any([execs[n].reply for n in pending] + [control.wake], POLL_S)
        for name in pending:
            rt, ex = by_name[name], execs[name]
            if ex.reply.done():
                results[name] = await _finished(rt, ex)
            elif (code := await rt.handle.poll()) is not None:
                results[name] = _crashed(rt, ex, code)
                control.stop("crash")
        if deadline is not None and time.monotonic() >= deadline:
            control.stop("timeout")
    if control.reason is not None:
        results.update(await _end_early(by_name, execs, results, control.reason, grace_s))
    return {rt.name: results[rt.name] for rt in tasks}


async def _wait_any(futures: list, timeout: float) -> None:
    waiters = [asyncio.ensure_future(f.wait()) if isinstance(f, asyncio.Event) else f
               for f in futures]
    await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for w, f in zip(waiters, futures, strict=False):
        if isinstance(f, asyncio.Event) and not w.done():
            w.cancel()


async def _finished(rt: TaskRuntime, ex: Execution, status: str | None = None) -> TaskResult:
    if ex.reply.cancelled():  # the channel closed under us: the cluster is being stopped
        rt.channel.abandon(ex)
        result = _result(rt, ex, status or "interrupted", None)
        result.explanation = "the cluster was stopped while the cell ran"
        return result
    reply = ex.reply.result()
    # the reply can overtake the last output on iopub; idle says all of it is in
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(ex.idle), IDLE_AFTER_REPLY_S)
    rt.channel.abandon(ex)
    rt.finish_run()
    error = None
    if reply.get("status") == "error":
        error = RemoteError(reply.get("ename", ""), reply.get("evalue", ""),
                            list(reply.get("traceback", [])))
    elif reply.get("status") == "aborted":
        error = RemoteError("Aborted", "the kernel aborted this request", [])
    result = _result(rt, ex, status or ("ok" if error is None else "error"), error)
    if error is not None:
        result.explanation = explain(error.ename, error.evalue, rt.info.get("keras_flavour"))
    return result


def _crashed(rt: TaskRuntime, ex: Execution, code: int) -> TaskResult:
    rt.channel.abandon(ex)
    rt.exit_code = code
    rt.transition(TaskEvent.EXITED)
    what = describe_exit(code)
    error = RemoteError("TaskCrashed", f"{rt.name} {what}", [])
    result = _result(rt, ex, "crashed", error)
    tail = "\n".join(rt.kernel_log_tail(15))
    result.explanation = f"{rt.name} {what}." + (f"\nLast lines of its process log:\n{tail}"
                                                   if tail else "")
    return result


async def _end_early(by_name: dict[str, TaskRuntime], execs: dict[str, Execution],
                     done: dict[str, TaskResult], reason: str,
                     grace_s: float) -> dict[str, TaskResult]:
    status = "timeout" if reason == "timeout" else "interrupted"
    grace_s = 0.0 if reason == "stopped" else grace_s
    rest = [n for n in by_name if n not in done]
    await asyncio.gather(*(by_name[n].handle.interrupt() for n in rest), return_exceptions=True)
    await _wait_all([execs[n].reply for n in rest], grace_s)
    out: dict[str, TaskResult] = {}
    for name in rest:
        rt, ex = by_name[name], execs[name]
        if ex.reply.done():
            out[name] = await _finished(rt, ex, status)
        elif (code := await rt.handle.poll()) is not None:
            out[name] = _crashed(rt, ex, code)
        else:
            rt.channel.abandon(ex)
            res = _result(rt, ex, status, None)
            res.explanation = (
                "the cluster was stopped while the cell ran" if reason == "stopped" else
                f"{name} did not answer the interrupt within {grace_s:.0f}s and is still busy "
                "(a thread blocked in a TensorFlow op holds no Python frame to interrupt); "
                "restart it with %tfdist_restart.")
            out[name] = res
    return out


async def _wait_all(futures: list, timeout: float) -> None:
    if futures:
        await asyncio.wait(futures, timeout=timeout)


def _result(rt: TaskRuntime, ex: Execution, status: str,
            error: RemoteError | None) -> TaskResult:
    return TaskResult(task=rt.name, status=status, stdout="".join(ex.stdout),
                      stderr="".join(ex.stderr), error=error,
                      duration_s=time.time() - ex.started, outputs=list(ex.outputs))
