"""Runs the checks of docs/reference.md (Checks) on a cluster's tasks: asks each task's probe
(:mod:`tfdist_nb.worker.probes`) in parallel, every call bounded, and hands the answers to the
pure analysis in :mod:`tfdist_nb.diagnostics`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.diagnostics import env_check, network_check, tfconfig_check
from tfdist_nb.diagnostics.report import CheckReport, combine
from tfdist_nb.errors import AgentError, SpecError
from tfdist_nb.worker import probes

KINDS = ("tfconfig", "network", "env", "all")
PROBE_TIMEOUT_S = 15.0
BANDWIDTH_TIMEOUT_S = 120.0
BANDWIDTH_SIZES_MB = (1.0, 16.0, 64.0)


def check_tf_config(config: str | Mapping[str, Any] | Path) -> CheckReport:
    """A TF_CONFIG checked here, without a cluster: structure, roles, indices, duplicate
    addresses, host names that do not resolve and ports of this host that are in use."""
    text, errors = tfconfig_check.load_config(config)
    if errors:
        return CheckReport("tfconfig", False, errors[0], details=errors,
                           fields={"errors": errors})
    return tfconfig_check.analyse({"given": probes.tf_config_view(text)})


class CheckRunner:
    def __init__(self, targets: list[TaskRuntime]) -> None:
        self.targets = [rt for rt in targets if rt.agent is not None]

    async def _ask(self, op: str, *, inspect: bool = True,
                   timeout: float = PROBE_TIMEOUT_S, **args: Any) -> dict[str, Any]:
        """``{task: answer}``; a task that fails or does not answer in time is
        ``{"error": ...}``."""
        async def one(rt: TaskRuntime) -> Any:
            assert rt.agent is not None
            try:
                return await rt.agent.call(op, inspect=inspect, timeout=timeout, **args)
            except asyncio.TimeoutError:
                return {"error": f"no answer within {timeout:.0f}s"}
            except AgentError as exc:
                return {"error": str(exc)}

        answers = await asyncio.gather(*(one(rt) for rt in self.targets))
        return {rt.name: a for rt, a in zip(self.targets, answers, strict=True)}

    async def run(self, kind: str, expr: Any = None) -> CheckReport:
        if kind == "tfconfig":
            return await self.tfconfig(expr)
        if kind == "network":
            return await self.network()
        if kind == "env":
            return env_report(await self.env())
        if kind == "all":
            return combine([await self.tfconfig(None), await self.network(),
                            env_report(await self.env())])
        raise SpecError(f"unknown check {kind!r}; one of {', '.join(KINDS)}")

    async def tfconfig(self, config: Any = None) -> CheckReport:
        text = None
        if config is not None:
            text, errors = tfconfig_check.load_config(config)
            if errors:
                return CheckReport("tfconfig", False, errors[0], details=errors,
                                   fields={"errors": errors})
        views = await self._ask("tf_config_view", tf_config=text)
        expected = {rt.name: rt.name for rt in self.targets} if text is None else None
        return tfconfig_check.analyse(_no_errors(views), expected)

    async def network(self) -> CheckReport:
        addresses = {rt.name: rt.address for rt in self.targets}
        stand_ins = await self._ask("open_stand_in")
        try:
            reach = {}
            for rt in self.targets:  # one task at a time: connect times are not queued
                others = {n: a for n, a in addresses.items() if n != rt.name}
                reach.update(await self._ask_one(rt, "connect_peers", addresses=others))
        finally:
            await self._ask("close_stand_ins")
        bandwidth = await self._ask("allreduce_bandwidth", inspect=False,
                                    timeout=BANDWIDTH_TIMEOUT_S,
                                    sizes_mb=list(BANDWIDTH_SIZES_MB))
        first = next(iter(bandwidth.values()), None) if bandwidth else None
        return network_check.analyse(reach, {t: _text(s) for t, s in stand_ins.items()},
                                     first if isinstance(first, dict) else None)

    async def _ask_one(self, rt: TaskRuntime, op: str, **args: Any) -> dict[str, Any]:
        assert rt.agent is not None
        try:
            return {rt.name: await rt.agent.call(op, inspect=True, timeout=PROBE_TIMEOUT_S,
                                                 **args)}
        except (asyncio.TimeoutError, AgentError) as exc:
            return {rt.name: {peer: {"ok": False, "ms": None,
                                     "error": f"{rt.name} did not answer ({exc or 'timeout'})"}
                              for peer in args.get("addresses", {})}}

    async def env(self) -> pd.DataFrame:
        reports = await self._ask("env_report")
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


def _no_errors(views: dict[str, Any]) -> dict[str, Any]:
    return {t: v if "error" not in v else {"tf_config": None, "host": "?",
                                            "resolve": {}, "ports": {}} for t, v in views.items()}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value.get("error", value))
