"""Runs the checks of docs/reference.md (Checks): each task's probe asked in parallel, every call
bounded, the answers handed to the pure analysis in :mod:`tfdist_nb.diagnostics`."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar, cast

import pandas as pd

from tfdist_nb.cluster.agent_client import AgentClient
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.diagnostics import (
    env_check,
    gpu_check,
    network_check,
    sharding_check,
    tfconfig_check,
    variables_check,
)
from tfdist_nb.diagnostics.report import CheckReport, combine
from tfdist_nb.errors import AgentError, SpecError
from tfdist_nb.launchers.base import Launcher
from tfdist_nb.worker import consistency, probes, variables_probe
from tfdist_nb.worker.replies import Bandwidth, Failure, PeerReach, Read, Released

if TYPE_CHECKING:
    from typing_extensions import Unpack

KINDS = ("tfconfig", "network", "env", "all", "sharding", "variables", "gpu")
#: kinds that take an expression evaluated in each task (docs/reference.md, Checks)
EXPR_KINDS = ("sharding", "variables")
PROBE_TIMEOUT_S = 15.0
BANDWIDTH_TIMEOUT_S = 120.0
BANDWIDTH_SIZES_MB = (1.0, 16.0, 64.0)
READ_MARGIN_S = 60.0  # beyond the sharding check's time bounds: iterator set-up, tracing
VARIABLES_TIMEOUT_S = 60.0
GPU_PROBE_TIMEOUT_S = 60.0  # TensorFlow's first look at its GPUs initialises CUDA
GPU_SIZES_MB = (1.0, 16.0, 256.0)

R = TypeVar("R")
#: one check's call into a task's agent, given the agent and the call's bound in seconds
Ask = Callable[[AgentClient, float], Awaitable[R]]
#: a TF_CONFIG to check: JSON text, a file's path, or the dict itself
TfConfigGiven = str | Mapping[str, object] | Path


class CheckOptions(TypedDict, total=False):
    """The options of the sharding and variables checks, as ``Cluster.check`` takes them."""

    reference: str | None
    max_elements: int
    max_seconds: float
    unbatch: bool | None
    atol: float
    rtol: float
    full_values: int


def check_tf_config(config: TfConfigGiven) -> CheckReport:
    """A TF_CONFIG checked here, without a cluster: structure, roles, indices, duplicate
    addresses, host names that do not resolve and ports of this host that are in use."""
    text = _load(config)
    if isinstance(text, CheckReport):
        return text
    return tfconfig_check.analyse({"given": probes.tf_config_view(text)})


def _load(config: TfConfigGiven) -> str | CheckReport:
    """A TF_CONFIG's JSON text, or the failed check saying why it cannot be read."""
    text, errors = tfconfig_check.load_config(config)
    if errors:
        return CheckReport("tfconfig", False, errors[0], details=errors,
                           fields={"errors": errors})
    return text


def outside_address() -> str | None:
    """This host's address on its default route (the way out a task's download takes), or
    its first address beyond loopback; None: it has none. No packet is sent."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: a route lookup only
        address = str(s.getsockname()[0])
        if not address.startswith("127."):
            return address
    import psutil

    return next((a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                 if a.family == socket.AF_INET and not a.address.startswith("127.")), None)


class CheckRunner:
    def __init__(self, targets: list[TaskRuntime], launcher: Launcher | None = None) -> None:
        self.targets = [rt for rt in targets if rt.agent is not None]
        #: a local launcher: the network check also tries the tasks' way out
        self.launcher = launcher if launcher is not None and not launcher.remote else None

    async def _ask(self, ask: Ask[R], timeout: float = PROBE_TIMEOUT_S,
                   release: bool = False) -> dict[str, R | Failure]:
        """``{task: answer}``, every task at once; a task that fails or does not answer in
        time is ``{"error": ...}`` (``_answer``). ``release``: the op runs collectives, so once
        one task failed, those still running would wait for it forever: their collectives are
        aborted and their answers say ``"released": True``."""
        pending = {asyncio.ensure_future(_answer(ask(_agent(rt), timeout), timeout)): rt
                   for rt in self.targets}
        answers: dict[str, R | Failure] = {}
        released: list[TaskRuntime] = []
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                answers[pending.pop(fut).name] = fut.result()
            if release and not released and _any_failed(answers):
                # those still reading wait in a collective for the failed one
                released = [*pending.values(), *(rt for rt in self.targets
                                                 if _unanswered(answers.get(rt.name)))]
                await asyncio.gather(*(self._abort(rt) for rt in released))
        for rt in released:
            cast("Released", answers[rt.name])["released"] = True
        return {rt.name: answers[rt.name] for rt in self.targets}

    async def run(self, kind: str, expr: TfConfigGiven | None = None,
                  **options: Unpack[CheckOptions]) -> CheckReport:
        if kind in EXPR_KINDS:  # self.sharding, self.variables
            return await getattr(self, kind)(_expression(kind, expr), **options)
        if options:
            raise SpecError(f"the {kind} check takes no options ({', '.join(options)})")
        if kind == "tfconfig":
            return await self.tfconfig(expr)
        if kind == "network":
            return await self.network()
        if kind == "env":
            return env_report(await self.env())
        if kind == "gpu":
            return await self.gpu()
        if kind == "all":
            return combine([await self.tfconfig(None), await self.network(),
                            env_report(await self.env())])
        raise SpecError(f"unknown check {kind!r}; one of {', '.join(KINDS)}")

    async def tfconfig(self, config: TfConfigGiven | None = None) -> CheckReport:
        text = _load(config) if config is not None else None
        if isinstance(text, CheckReport):
            return text
        views = await self._ask(
            lambda agent, limit: agent.tf_config_view(tf_config=text, timeout=limit))
        expected = {rt.name: rt.name for rt in self.targets} if text is None else None
        return tfconfig_check.analyse(views, expected)

    async def network(self) -> CheckReport:
        addresses = {rt.name: rt.address for rt in self.targets}
        stand_ins = await self._ask(lambda agent, limit: agent.open_stand_in(timeout=limit))
        try:
            reach: dict[str, dict[str, PeerReach]] = {}
            for rt in self.targets:  # one task at a time: connect times are not queued
                others = {n: a for n, a in addresses.items() if n != rt.name}
                reach.update(await self._reach_from(rt, others))
        finally:
            await self._ask(lambda agent, limit: agent.close_stand_ins(timeout=limit))
        outbound, outside, trouble = await self._outbound()
        bandwidth = await self._ask(
            lambda agent, limit: agent.allreduce_bandwidth(sizes_mb=list(BANDWIDTH_SIZES_MB),
                                                           timeout=limit),
            BANDWIDTH_TIMEOUT_S)
        first = next(iter(bandwidth.values()), None)
        return network_check.analyse(reach, {t: _text(s) for t, s in stand_ins.items()},
                                     first if first is not None and "error" not in first
                                     else None, outbound, outside, trouble)

    async def _outbound(self) -> tuple[dict[str, PeerReach] | None, str, str | None]:
        """Each local task's connect to a listener on this host's address beyond loopback:
        ``({task: {"ok", "ms", "error"}}, address, the launcher's cause and cure)``."""
        if self.launcher is None or (address := outside_address()) is None:
            return None, "", None
        with socket.socket() as listener:
            listener.bind((address, 0))
            listener.listen(len(self.targets) + 1)  # a connect completes in the backlog
            where = f"{address}:{listener.getsockname()[1]}"
            reached = {}
            for rt in self.targets:
                got = await self._reach_from(rt, {network_check.OUTSIDE: where})
                reached[rt.name] = got[rt.name][network_check.OUTSIDE]
        trouble = self.launcher.network_trouble()
        return reached, address, (f"{trouble.cause}. Fix: {trouble.cure}" if trouble else None)

    async def gpu(self) -> CheckReport:
        """Each task's GPUs as given, read by NVML and seen by TensorFlow; then, where every
        task's TensorFlow sees one, the strategy's all-reduce with RING and with NCCL, all
        tasks at once, stopped at the first that fails (docs/gpus.md)."""
        readings = await self._ask(lambda agent, limit: agent.gpu_readings(timeout=limit),
                                   GPU_PROBE_TIMEOUT_S)
        plan, not_timed = gpu_check.allreduce_plan(readings)
        timed: dict[str, dict[str, Bandwidth | Failure]] = {}
        for impl in plan:
            def reduce(agent: AgentClient, limit: float, impl: str = impl) -> Awaitable[Bandwidth]:
                return agent.allreduce_bandwidth(sizes_mb=list(GPU_SIZES_MB),
                                                 implementation=impl, timeout=limit)

            got = await self._ask(reduce, BANDWIDTH_TIMEOUT_S, release=True)
            skipped = next((a["skipped"] for a in got.values()
                            if "error" not in a and "skipped" in a), None)
            if skipped:
                not_timed = skipped
                break
            timed[impl] = got
            if _any_failed(got):
                break
        return gpu_check.analyse(readings, timed, not_timed)

    async def _reach_from(self, rt: TaskRuntime,
                          others: dict[str, str]) -> dict[str, dict[str, PeerReach]]:
        """``{rt: {peer: {"ok", "ms", "error"}}}`` for each of ``others`` (name -> address);
        a task that does not answer reaches none of them."""
        try:
            return {rt.name: await _agent(rt).connect_peers(addresses=others,
                                                            timeout=PROBE_TIMEOUT_S)}
        except (asyncio.TimeoutError, AgentError) as exc:
            return {rt.name: {peer: {"ok": False, "ms": None,
                                     "error": f"{rt.name} did not answer ({exc or 'timeout'})"}
                              for peer in others}}

    async def sharding(self, expr: str, reference: str | None = None,
                       max_elements: int = consistency.MAX_ELEMENTS,
                       max_seconds: float = consistency.MAX_SECONDS,
                       unbatch: bool | None = None) -> CheckReport:
        """EXPR (a dataset) described on the inspection subshells, then read on every task's
        main shell at once (docs/reference.md, Checks)."""
        # describing serialises EXPR's graph: a large in-memory dataset gets the read's limit
        described = await self._ask(
            lambda agent, limit: agent.sharding_describe(expr=expr, timeout=limit),
            max(PROBE_TIMEOUT_S, float(max_seconds)))
        problem = sharding_check.describe_problem(described)
        if problem is not None:
            return problem
        found = [d for d in described.values() if "error" not in d]
        distributed = any(d.get("kind") == "distributed" for d in found)
        workers = max((d.get("workers") or 0 for d in found), default=0)
        if distributed and workers > len(self.targets):
            raise SpecError(f"a distributed dataset is read by all {workers} workers at once "
                            f"(its iterator runs collectives): check it on every task, not "
                            f"on {len(self.targets)}")
        timeout = 2 * float(max_seconds) + READ_MARGIN_S
        first = self.targets[0].name

        def read(agent: AgentClient, limit: float) -> Awaitable[Read]:
            return agent.sharding_fingerprints(
                expr=expr, max_elements=int(max_elements), max_seconds=float(max_seconds),
                unbatch=unbatch, reference=reference, with_reference=agent.task == first,
                timeout=limit)

        reads = await self._ask(read, timeout, release=distributed)
        mine = reads[first]
        ref = mine.pop("reference", None) if "error" not in mine else None
        return sharding_check.analyse(described, reads, ref)

    async def variables(self, expr: str, atol: float = variables_check.ATOL,
                        rtol: float = variables_check.RTOL,
                        full_values: int = variables_probe.FULL_VALUES) -> CheckReport:
        """Checksums of EXPR's variables from every task, read on the main shells between cells
        (so every task is at the same step), compared exactly and within atol/rtol."""
        answers = await self._ask(
            lambda agent, limit: agent.variable_checksums(
                expr=expr, full_values=int(full_values), timeout=limit),
            VARIABLES_TIMEOUT_S)
        return variables_check.analyse(answers, atol=float(atol), rtol=float(rtol))

    async def _abort(self, rt: TaskRuntime) -> None:
        assert rt.agent is not None
        with contextlib.suppress(asyncio.TimeoutError, AgentError):
            await rt.agent.abort_collectives(reason="a task failed while reading the "
                                             "dataset for the sharding check")

    async def env(self) -> pd.DataFrame:
        reports = await self._ask(lambda agent, limit: agent.env_report(timeout=limit))
        return env_check.env_frame({t: r for t, r in reports.items() if "props" in r})


def env_report(df: pd.DataFrame) -> CheckReport:
    """The environment as a check: fine when nothing but per-task values differ."""
    differing = df[df["mismatch"]]
    tasks = [c for c in df.columns if c != "mismatch"]
    if differing.empty:
        return CheckReport("env", True, f"the {len(tasks)} task(s) run the same environment",
                           df)
    names = ", ".join(differing.index[:5]) + (" ..." if len(differing) > 5 else "")
    critical = env_check.critical_mismatch(df)
    return CheckReport("env", False, critical or f"{len(differing)} difference(s): {names}",
                       differing, fields={"mismatches": list(differing.index)})


def _expression(kind: str, expr: object) -> str:
    if not isinstance(expr, str) or not expr.strip():
        example = "'dist_dataset'" if kind == "sharding" else "'model'"
        raise SpecError(f"the {kind} check needs an expression evaluated in every task, e.g. "
                        f"cluster.check({kind!r}, {example})")
    return expr


def _text(value: str | Failure) -> str:
    return value if isinstance(value, str) else value["error"]


def _agent(rt: TaskRuntime) -> AgentClient:
    assert rt.agent is not None  # CheckRunner keeps only the tasks with an agent
    return rt.agent


async def _answer(call: Awaitable[R], timeout: float) -> R | Failure:
    """The task's reply, or ``{"error": why}`` when the call failed there or did not come back
    within ``timeout``; then also ``"answered": False``, as the task may still be in it."""
    try:
        return await call
    except asyncio.TimeoutError:
        return {"error": f"no answer within {timeout:.0f}s", "answered": False}
    except AgentError as exc:
        return {"error": str(exc)}


def _any_failed(answers: Mapping[str, object]) -> bool:
    """Whether a task's answer (a reply, or ``_answer``'s failure) is a failure."""
    return any(isinstance(a, Mapping) and "error" in a for a in answers.values())


def _unanswered(answer: object) -> bool:
    """Whether ``answer`` is ``_answer``'s for a call that did not come back in time."""
    return isinstance(answer, Mapping) and "error" in answer and answer.get("answered") is False
