"""A ``%%tfcluster`` line as a :class:`ClusterRequest`, and the :func:`plan` of what it does to
the running cluster: pure (apart from finding the interpreter and the launchers' flags), so every
malformed line fails here, with an example, before a process exists.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfdist_nb.cluster.environment import parse_env_items, resolve_python
from tfdist_nb.errors import SpecError
from tfdist_nb.gpu_plan import GpuRequest, gpu_request
from tfdist_nb.launchers.registry import launcher_class
from tfdist_nb.magics.launcher_flags import read_launcher_line
from tfdist_nb.strenum import StrEnum
from tfdist_nb.topology import SPEC_EXAMPLE, ClusterSpec, parse_spec, parse_targets

EXAMPLE = (
    "examples:\n"
    "  %%tfcluster 2 workers\n"
    "  %%tfcluster 1 chief 2 workers 1 ps --timeout 600\n"
    "  %%tfcluster 2 workers --on 1 --env TF_USE_LEGACY_KERAS=1\n"
    "  %%tfcluster 4 workers --hosts gpu1,gpu2\n"
    "  %%tfcluster 2 workers --gpus 0,1\n"
    "  %%tfcluster 2 workers --launcher attach --connection-dir /shared/job42\n"
    "  %%tfcluster 2 workers --launcher slurm --sbatch \"--partition=gpu --nodes=2\""
)
HOSTS = "hosts"  # the launcher option that is Cluster(hosts=), not a key of launcher_options


@dataclass(frozen=True)
class ClusterRequest:
    spec: ClusterSpec | None
    on: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None
    stall_timeout: float | None = None
    restart: bool = False
    python: str | None = None
    launcher: str | None = None  # None: as the running cluster, else local
    hosts: list[str] | None = None  # Cluster(hosts=), set by a launcher's flag (--hosts)
    #: what the launcher's other flags set (Launcher.line_options): launcher_options' keys
    launcher_options: dict[str, Any] = field(default_factory=dict)
    #: the flag that set each of ``hosts`` and ``launcher_options``, for the messages
    flags: dict[str, str] = field(default_factory=dict)
    dashboard: bool = True
    verbose: bool = False
    warm: bool | None = None  # --warm / --no-warm: spare kernels; None: as the cluster has
    gpus: str | None = None  # --gpus auto|none|LIST; None: as the cluster has (else auto)
    gpus_per_task: int | None = None  # --gpus-per-task N; None: as the cluster has


def build_request(args: argparse.Namespace, rest: Sequence[str] = ()) -> ClusterRequest:
    """The request of a parsed line, or a SpecError saying what is wrong; ``rest``: the words
    the magic's parser did not take (a plugin launcher's flags)."""
    spec = parse_spec(args.spec) if args.spec else None
    try:
        env = parse_env_items(args.env)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    for name in ("timeout", "stall_timeout"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise SpecError(f"--{name.replace('_', '-')} must be a positive number of seconds, "
                            f"got {value}")
    gpus, per_task = getattr(args, "gpus", None), getattr(args, "gpus_per_task", None)
    if gpus is not None or per_task is not None:
        gpu_request(gpus or "auto", per_task)  # a bad --gpus fails here, before anything
    line = read_launcher_line(args.launcher, args, rest)
    options = dict(line.values)
    hosts = options.pop(HOSTS, None)
    # A remote interpreter is looked up on its hosts, a local one here.
    remote = launcher_class(line.name or "local").remote
    python = resolve_python(args.python) if args.python and not remote else args.python
    return ClusterRequest(spec=spec, on=args.on, env=env, timeout=args.timeout,
                          stall_timeout=args.stall_timeout, restart=args.restart, python=python,
                          launcher=line.name, hosts=hosts, launcher_options=options,
                          flags=dict(line.flags), dashboard=not args.no_dashboard,
                          verbose=bool(getattr(args, "verbose", False)),
                          warm=getattr(args, "warm", None), gpus=gpus,
                          gpus_per_task=per_task)


class PlanAction(StrEnum):
    """What a ``%%tfcluster`` line does to the cluster that exists."""

    START = "start"  # there is none: start one
    REUSE = "reuse"  # the same cluster runs the cell
    REPLACE = "replace"  # stop it, start another (a resize or a changed environment)
    RESTART = "restart"  # --restart: fresh processes, the same cluster


@dataclass(frozen=True)
class Running:
    """What the plan needs to know of the cluster the magics drive now."""

    spec: ClusterSpec
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    launcher: str = "local"
    hosts: list[str] | None = None
    launcher_options: dict[str, Any] = field(default_factory=dict)
    #: what its launcher runs with for each of its flags (Launcher.line_values)
    line_values: dict[str, object] = field(default_factory=dict)
    restartable: bool = True
    warm: int = 0  # its spare kernels
    gpus: GpuRequest = field(default_factory=GpuRequest)


@dataclass(frozen=True)
class NewCluster:
    """The ``Cluster(...)`` a START or REPLACE makes: the line's settings, and on a resize what
    the line does not change carried over from the running cluster."""

    spec: ClusterSpec
    launcher: str = "local"
    hosts: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    stall_timeout: float = 60.0
    launcher_options: dict[str, Any] | None = None
    warm: bool | None = None  # None: the default (spares for the local launcher)
    gpus: GpuRequest = field(default_factory=GpuRequest)


@dataclass(frozen=True)
class Plan:
    action: PlanAction
    spec: ClusterSpec
    message: str | None = None
    new: NewCluster | None = None  # START and REPLACE: the cluster to make
    set_warm: bool | None = None  # REUSE and RESTART: --warm / --no-warm for the running one
    #: REPLACE: the running cluster's spare kernels go to the new one (``stop(keep_spares=)``)
    keep_spares: bool = False


def plan(request: ClusterRequest, running: Running | None) -> Plan:
    """What the line asks of the cluster that runs now (``running`` None: there is none).

    A different SPEC replaces the cluster and says ``resized: A -> B``; a changed ``--env``,
    ``--python``, launcher or launcher flag (``--hosts``, ``--sbatch``, ...) needs fresh
    kernels too (fixed at launch); ``--restart`` restarts the tasks in place, or replaces the
    cluster when its launcher cannot restart them (attach, slurm). A replacement keeps what the
    line does not change, and takes over the running cluster's spares when it keeps spares
    itself (docs/reference.md, Magics).
    """
    spec = request.spec or (running.spec if running is not None else None)
    if spec is None:
        raise SpecError(f"no cluster is running and no SPEC was given; example: {SPEC_EXAMPLE}")
    if request.on is not None:
        parse_targets(request.on, spec)
    if running is None:
        return Plan(PlanAction.START, spec, new=_new(request, spec, None))
    why = _why_replace(request, spec, running)
    if why is None and request.restart and not running.restartable:
        why = f"restarting all tasks of {spec}"  # its launcher starts them anew
    if why is not None:
        new = _new(request, spec, running)
        # the running cluster's spares go over to a new one of its launcher that keeps spares
        return Plan(PlanAction.REPLACE, spec, why, new=new,
                    keep_spares=(running.warm > 0 and new.launcher == running.launcher
                                 and new.warm is not False))
    if request.restart:
        return Plan(PlanAction.RESTART, spec, f"restarting all tasks of {spec}",
                    set_warm=request.warm)
    return Plan(PlanAction.REUSE, spec, set_warm=request.warm)


def _why_replace(request: ClusterRequest, spec: ClusterSpec, running: Running) -> str | None:
    if spec != running.spec:
        return f"resized: {running.spec} -> {spec}"
    if request.env and request.env != running.env:
        return "restarting the cluster: --env changed"
    if request.python and request.python != running.python:
        return "restarting the cluster: --python changed"
    if _gpus(request, running) != running.gpus:
        return "restarting the cluster: --gpus or --gpus-per-task changed"
    if request.launcher and request.launcher != running.launcher:
        return f"restarting the cluster: launcher {running.launcher} -> {request.launcher}"
    # what it was made with: its arguments, and over them what its launcher says it runs
    # with (normalized as the line's flags are)
    made_with = {**_by_option(running.launcher_options, running.hosts), **running.line_values}
    for option, value in _by_option(request.launcher_options, request.hosts).items():
        if value != made_with.get(option):
            return f"restarting the cluster: {request.flags.get(option, option)} changed"
    return None


def _by_option(options: Mapping[str, object], hosts: list[str] | None) -> dict[str, object]:
    return {**options, **({HOSTS: hosts} if hosts is not None else {})}


def _new(request: ClusterRequest, spec: ClusterSpec, running: Running | None) -> NewCluster:
    options: dict[str, Any] | None = dict(request.launcher_options) or None
    launcher, hosts = request.launcher, request.hosts
    env, python = request.env, request.python
    warm = request.warm
    if running is not None:  # a resize keeps what the line does not change
        env, python = env or running.env, python or running.python
        if launcher is None:
            launcher, hosts = running.launcher, hosts or running.hosts
            options = options or running.launcher_options
        if warm is None and not running.warm:
            warm = False  # spares were turned off: the replacement has none either
    return NewCluster(spec=spec, launcher=launcher or "local", hosts=hosts, env=dict(env),
                      python=python, stall_timeout=request.stall_timeout or 60.0,
                      launcher_options=options, warm=warm, gpus=_gpus(request, running))


def _gpus(request: ClusterRequest, running: Running | None) -> GpuRequest:
    """The GPUs the line asks for; a flag it does not give keeps the running cluster's."""
    have = running.gpus if running is not None else GpuRequest()
    choice = have.choice if request.gpus is None else gpu_request(request.gpus).choice
    per_task = have.per_task if request.gpus_per_task is None else request.gpus_per_task
    return GpuRequest(choice, per_task)
