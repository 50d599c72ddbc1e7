"""A parsed ``%%tfcluster`` line, validated before anything is started, and what it asks for.

Pure apart from looking up the worker interpreter: the magic builds a :class:`ClusterRequest`,
then :func:`plan` says whether to start, reuse, resize or restart, so every malformed line fails
here, with a message and an example, before a process exists.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfdist_nb.cluster.environment import parse_env_items, resolve_python
from tfdist_nb.errors import SpecError
from tfdist_nb.launchers.registry import available, launcher_class
from tfdist_nb.strenum import StrEnum
from tfdist_nb.topology import SPEC_EXAMPLE, ClusterSpec, parse_spec, parse_targets

EXAMPLE = (
    "examples:\n"
    "  %%tfcluster 2 workers\n"
    "  %%tfcluster 1 chief 2 workers 1 ps --timeout 600\n"
    "  %%tfcluster 2 workers --on 1 --env TF_USE_LEGACY_KERAS=1\n"
    "  %%tfcluster 4 workers --hosts gpu1,gpu2\n"
    "  %%tfcluster 2 workers --launcher attach --connection-dir /shared/job42\n"
    "  %%tfcluster 2 workers --launcher slurm --sbatch \"--partition=gpu --nodes=2\""
)


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
    hosts: list[str] | None = None
    connection_dir: str | None = None
    sbatch: list[str] | None = None  # sbatch options for --launcher slurm
    dashboard: bool = True
    verbose: bool = False
    warm: bool | None = None  # --warm / --no-warm: spare kernels; None: as the cluster has


def build_request(args: argparse.Namespace) -> ClusterRequest:
    """Turn magic_arguments' namespace into a request, or raise SpecError saying what is wrong."""
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
    sbatch_line = getattr(args, "sbatch", None)
    launcher = args.launcher or ("ssh" if args.hosts else
                                 "attach" if args.connection_dir else
                                 "slurm" if sbatch_line is not None else None)
    if launcher is not None and launcher not in available():
        raise SpecError(f"unknown launcher {launcher!r}; choose one of {', '.join(available())}")
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()] if args.hosts else None
    if args.hosts is not None and not hosts:
        raise SpecError("--hosts needs at least one host, e.g. --hosts gpu1,gpu2")
    if hosts is not None and launcher != "ssh":
        raise SpecError(f"--hosts needs --launcher ssh; the {launcher} launcher does not use it")
    if launcher == "ssh" and hosts is None:
        raise SpecError("--launcher ssh needs --hosts, e.g. --hosts gpu1,gpu2")
    if (launcher == "attach") != bool(args.connection_dir):
        raise SpecError("--launcher attach and --connection-dir DIR go together: DIR is where "
                        "the workers started with python -m tfdist_nb.worker announce themselves")
    if launcher == "attach" and not Path(args.connection_dir).expanduser().is_dir():
        # the workers are started first; a typo here would stop the running cluster for a
        # new one that waits the whole wait_timeout for workers that never come
        raise SpecError(f"--connection-dir {args.connection_dir} is not a directory: start the "
                        "workers first (python -m tfdist_nb.worker --task worker:0 "
                        f"--connection-dir {args.connection_dir}), then run this line; the "
                        "running cluster, if any, is left as it is")
    sbatch = _sbatch_words(sbatch_line) if sbatch_line is not None else None
    if sbatch is not None and launcher != "slurm":
        raise SpecError(f"--sbatch needs --launcher slurm; the {launcher} launcher does not "
                        "submit a job")
    # A remote interpreter is looked up on its hosts, a local one here.
    python = (resolve_python(args.python) if args.python and launcher in (None, "local")
              else args.python)
    return ClusterRequest(spec=spec, on=args.on, env=env, timeout=args.timeout,
                          stall_timeout=args.stall_timeout, restart=args.restart, python=python,
                          launcher=launcher, hosts=hosts, connection_dir=args.connection_dir,
                          sbatch=sbatch, dashboard=not args.no_dashboard,
                          verbose=bool(getattr(args, "verbose", False)),
                          warm=getattr(args, "warm", None))


def glue_sbatch(line: str) -> str:
    """The magic line with ``--sbatch VALUE`` written ``--sbatch=VALUE``: argparse would take a
    lone value that starts with ``-`` (``--sbatch "--nodes=2"``) for an option of its own."""
    try:
        words = shlex.split(line)
    except ValueError:
        return line  # the parser says what is wrong with the quotes
    if "--sbatch" not in words[:-1]:
        return line
    glued: list[str] = []
    it = iter(words)
    for word in it:
        glued.append(f"--sbatch={next(it)}" if word == "--sbatch" else word)
    return shlex.join(glued)


def _sbatch_words(line: str) -> list[str]:
    """``--sbatch "--partition=gpu --nodes=2"`` as sbatch's words, checked as the SLURM
    launcher checks them (options it sets itself are refused)."""
    try:
        options = launcher_class("slurm").cluster_options(None, None, {"sbatch_args": line})
    except SpecError as exc:
        raise SpecError(f"--sbatch: {str(exc).removeprefix('sbatch_args: ')}") from None
    return list(options["sbatch_args"])


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
    sbatch: list[str] | None = None
    restartable: bool = True
    warm: int = 0  # its spare kernels


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


@dataclass(frozen=True)
class Plan:
    action: PlanAction
    spec: ClusterSpec
    message: str | None = None
    new: NewCluster | None = None  # START and REPLACE: the cluster to make
    set_warm: bool | None = None  # REUSE and RESTART: --warm / --no-warm for the running one


def plan(request: ClusterRequest, running: Running | None) -> Plan:
    """What the line asks of the cluster that runs now (``running`` None: there is none).

    A different SPEC replaces the cluster and says ``resized: A -> B``; a changed ``--env``,
    ``--python``, launcher, ``--hosts`` or ``--sbatch`` needs fresh kernels too (fixed at
    launch); ``--restart`` restarts the tasks in place, or replaces the cluster when its
    launcher cannot restart them (attach, slurm). A replacement keeps what the line does not
    change, and its spares when the running cluster has them (docs/reference.md, Magics).
    """
    if running is None:
        if request.spec is None:
            raise SpecError(f"no cluster is running and no SPEC was given; example: "
                            f"{SPEC_EXAMPLE}")
        _check_targets(request, request.spec)
        return Plan(PlanAction.START, request.spec, new=_new(request, request.spec, None))
    spec = request.spec or running.spec
    _check_targets(request, spec)
    why = _why_replace(request, spec, running)
    if why is None and request.restart and not running.restartable:
        why = f"restarting all tasks of {spec}"  # its launcher starts them anew
    if why is not None:
        return Plan(PlanAction.REPLACE, spec, why, new=_new(request, spec, running))
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
    if request.launcher and request.launcher != running.launcher:
        return f"restarting the cluster: launcher {running.launcher} -> {request.launcher}"
    if request.hosts and request.hosts != running.hosts:
        return "restarting the cluster: --hosts changed"
    if request.sbatch is not None and request.sbatch != (running.sbatch or []):
        return "restarting the cluster: --sbatch changed (a new SLURM job)"
    return None


def _new(request: ClusterRequest, spec: ClusterSpec, running: Running | None) -> NewCluster:
    options: dict[str, Any] | None = (
        {"connection_dir": request.connection_dir} if request.connection_dir else
        {"sbatch_args": request.sbatch} if request.sbatch is not None else None)
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
                      launcher_options=options, warm=warm)


def _check_targets(request: ClusterRequest, spec: ClusterSpec) -> None:
    if request.on is not None:
        parse_targets(request.on, spec)
