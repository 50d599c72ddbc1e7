"""The environment every task's kernel is started with: set at launch, so TF_CONFIG and ``env=``
are in place before the task imports TensorFlow. Variables that would make a worker behave
unlike a user's run are dropped (``PYTEST_CURRENT_TEST`` turns ipykernel's fd capture off).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from tfdist_nb.errors import SpecError
from tfdist_nb.topology import TaskId
from tfdist_nb.worker.telemetry import INTERVAL_ENV, telemetry_interval

_DROP_EXACT = {"PYTEST_CURRENT_TEST", "JPY_PARENT_PID", "JPY_SESSION_NAME", "TF_CONFIG"}
_DROP_PREFIX = ("TFDIST_TASK",)
#: ``ray.init()`` points Python's ``breakpoint()`` at Ray's debugger for the whole process (and
#: what it starts); outside a Ray worker that hook fails, so a task never inherits it
BREAKPOINT, RAY_HOOKS = "PYTHONBREAKPOINT", "ray."
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# Variables tfdist_nb sets for each task itself; an --env of one would be silently replaced
TASK_OWNED = {
    "TF_CONFIG": "each task's TF_CONFIG is built from the cluster SPEC (docs/reference.md, "
                 "TF_CONFIG); check one of your own with %tfdist_check tfconfig FILE",
    "TFDIST_TASK": "it names the task (tw.task) and is set by tfdist_nb",
}


def parse_env_items(items: list[str] | None) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` → dict; a malformed item raises ValueError naming it."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not ENV_KEY.fullmatch(key):
            raise ValueError(f"--env expects KEY=VALUE with KEY a variable name, got {item!r}")
        if key in TASK_OWNED:
            raise ValueError(f"--env {key}=... cannot be set: {TASK_OWNED[key]}")
        out[key] = value
    return out


def check_env(env: Mapping[str, str] | None) -> None:
    """SpecError for an ``env=`` the tasks could not start with, before anything starts: a
    ``TFDIST_TELEMETRY_INTERVAL`` (here or in ``env=``) they would refuse, or a TASK_OWNED
    variable."""
    for where, value in (("the environment", os.environ.get(INTERVAL_ENV)),
                         ("env=", (env or {}).get(INTERVAL_ENV))):
        try:
            telemetry_interval(value)
        except ValueError as exc:
            raise SpecError(f"{exc} (from {where})") from None
    owned = sorted(set(env or {}) & set(TASK_OWNED))
    if owned:
        raise SpecError(f"env={owned[0]} cannot be set: {TASK_OWNED[owned[0]]}")


#: above this many tasks the heartbeat interval grows with the cluster, so the controller reads
#: at most this many samples a second (docs/performance.md, "The controller at 1,024 tasks")
SAMPLES_PER_S = 512


def telemetry_env(tasks: int, extra: Mapping[str, str]) -> dict[str, str]:
    """The tasks' heartbeat interval beyond ``SAMPLES_PER_S`` tasks (2 s at 1,024), unless
    ``TFDIST_TELEMETRY_INTERVAL`` is set here or in ``env=``."""
    if tasks <= SAMPLES_PER_S or INTERVAL_ENV in os.environ or INTERVAL_ENV in extra:
        return {}
    return {INTERVAL_ENV: f"{tasks / SAMPLES_PER_S:.3g}"}


def worker_env(task: TaskId, tf_config: str, extra: Mapping[str, str] | None,
               python: str, base: Mapping[str, str] | None = None,
               local: bool = True) -> dict[str, str]:
    """``base`` (default: this process's environment) less what must not leak, plus the task's
    identity and TF_CONFIG; ``local``: the interpreter runs here and must find this tfdist_nb."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in _DROP_EXACT and not k.startswith(_DROP_PREFIX)}
    if env.get(BREAKPOINT, "").startswith(RAY_HOOKS):  # ray.init() in this process set it
        # a task's breakpoint() is pdb (docs/reference.md, Input from the tasks)
        del env[BREAKPOINT]
    if local and Path(python).resolve() != Path(sys.executable).resolve():
        # Another interpreter still finds this tfdist_nb (the worker module must match ours).
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    env["TF_CONFIG"] = tf_config
    env["TFDIST_TASK"] = str(task)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def resolve_python(python: str | None) -> str:
    """The worker interpreter as an absolute path (default: this one); SpecError if missing."""
    if python is None:
        return sys.executable
    found = shutil.which(python) or (python if Path(python).is_file() else None)
    if not found or not os.access(found, os.X_OK):
        raise SpecError(f"worker interpreter {python!r} not found or not executable")
    return str(Path(found).absolute())
