"""What ``%tfdist_inject``, ``%tfdist_loglevel`` and ``%tfdist_numerics`` switch on every
task's worker agent (docs/reference.md, Magics), each call bounded and said in one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tfdist_nb.cluster.loop import LoopThread, gather
from tfdist_nb.cluster.state import TaskState
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.errors import SpecError
from tfdist_nb.topology import Targets
from tfdist_nb.worker.inject import KINDS

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
INJECT_CALL_S = 15.0


def directory_to_write(path: Path, option: str) -> None:
    """Make ``path``, a directory the user names for the tasks to write into (``--logdir``,
    ``--dump``), owner-only; or a SpecError naming ``option`` and why it cannot be written (a
    file in the way, a read-only mount, no permission), before any task is asked to."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SpecError(f"{option} {path}: cannot make this directory "
                        f"({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SpecError(f"{option} {path}: not writable by this user")


def check_fault(kind: str, on: Targets) -> None:
    """SpecError for a fault that cannot be armed: an unknown kind, or no task named."""
    if kind != "clear" and kind not in KINDS:
        raise SpecError(f"unknown fault {kind!r}; one of {', '.join(KINDS)} or clear")
    if kind != "clear" and on is None:
        raise SpecError("say which task gets the fault: --on 1 (or on='worker:1')")


def inject(loop: LoopThread, targets: list[TaskRuntime], kind: str, params: Mapping[str, Any],
           note: Callable[[str, str, str], None]) -> dict[str, str]:
    """Arm (or ``"clear"``) ``kind`` on the live ``targets``; returns what each task said. A
    dead task is skipped: a restart brings it back without faults."""
    live = [rt for rt in targets if rt.state is not TaskState.DEAD and rt.agent is not None]
    args = {k: v for k, v in params.items() if v is not None}
    said = loop.run(gather(*(rt.agent.inject(kind=kind, params=args) for rt in live if rt.agent)),
                    INJECT_CALL_S)
    for rt, text in zip(live, said, strict=True):
        note(rt.name, f"fault injection: {text}", "WARNING" if kind != "clear" else "INFO")
    return {rt.name: text for rt, text in zip(live, said, strict=True)}


def check_log_level(level: str, cpp: int | None) -> str:
    """``level`` upper-cased, or SpecError for a level or a ``--cpp`` value there is not."""
    level = level.upper()
    if level not in LOG_LEVELS:
        raise SpecError(f"unknown log level {level!r}; use one of {', '.join(LOG_LEVELS)}")
    if cpp is not None and cpp not in (0, 1, 2, 3):
        raise SpecError("--cpp is TF_CPP_MIN_LOG_LEVEL: 0 (all), 1 (no INFO), 2 (no "
                        "WARNING), 3 (no ERROR)")
    return level


def cpp_env(cpp: int | None, vmodule: str | None) -> dict[str, str]:
    """The variables of TensorFlow's C++ logging to set; TensorFlow reads them once, at start-up,
    so they take effect with a restart."""
    env = {}
    if cpp is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = str(cpp)
    if vmodule is not None:
        env["TF_CPP_VMODULE"] = vmodule
    return env


def set_log_level(loop: LoopThread, targets: list[TaskRuntime], level: str) -> str:
    """The Python and TensorFlow logger level on ``targets``; returns what to tell the user."""
    loop.run(gather(*(rt.agent.set_log_level(level=level) for rt in targets if rt.agent)), 30)
    return f"log level {level} on {len(targets)} task(s)"


def numerics(loop: LoopThread, targets: list[TaskRuntime], on: bool, root: Path | None) -> str:
    """NaN/Inf checking on (or off) on ``targets``, with Debugger V2 dumps under ``root`` (one
    root per task) when given; returns what to tell the user."""
    if root is not None and on:
        directory_to_write(root, "--dump")
    said = loop.run(gather(*(
        rt.agent.set_numerics(on=on, dump_root=str(root / rt.task.slug) if root else None,
                              timeout=60)
        for rt in targets if rt.agent)), 120)
    text = f"NaN/Inf checking {'on' if on else 'off'} on {len(said)} task(s)"
    if root and on:
        text += (f"; Debugger V2 dumps in {root}/<task> (one root per task: open each with "
                 f"%tensorboard --logdir {root}/worker-0, Debugger V2 tab)")
    return text
