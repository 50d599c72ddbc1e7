"""Live, attributed output of a running cell, and the per-task failure report after it.

Every line is prefixed with its task (coloured per task) and written to the notebook's own stdout
or stderr, so it streams into the cell output as it arrives. TensorFlow's own INFO records (one
per step and collective, device listings) are held back unless ``verbose``: they stay in the run
directory, the dashboard and ``%tfdist_logs``, and the cell ends with a line counting them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from tfdist_nb.diagnostics.numerics import first_nan
from tfdist_nb.events import Event, OutputLine, RichOutput, TaskNote
from tfdist_nb.results import RunResult, TaskResult
from tfdist_nb.store.logs import KNOWN_NOISE, known_noise, level_of, tensorflow_info
from tfdist_nb.topology import task_order

_COLOURS = ["34", "35", "36", "32", "33", "94", "95", "96"]
RESET = "\x1b[0m"


def task_colour(task: str) -> str:
    role, _, index = task.partition(":")
    offset = {"worker": 0, "chief": 3, "ps": 5, "evaluator": 7}.get(role, 0)
    return _COLOURS[(offset + int(index or 0)) % len(_COLOURS)]


def label(task: str, colour: bool = True) -> str:
    return f"\x1b[{task_colour(task)}m[{task}]{RESET}" if colour else f"[{task}]"


class LivePrinter:
    """Called with every event while a cell runs (in the notebook's main thread)."""

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None,
                 colour: bool = True, display: Callable[..., object] | None = None,
                 max_lines_per_task: int | None = None, run_dir: Path | str | None = None,
                 verbose: bool = False, noise_said: set[str] | None = None) -> None:
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.colour = colour
        self._display = display
        self.max_lines = max_lines_per_task
        self.run_dir = run_dir
        self.per_task: dict[str, int] = {}
        self.verbose = verbose
        self.held_back = 0
        self._last: TextIO | None = None  # the stream written last (see _write)
        # known harmless native lines: held back, said once per cluster (the caller keeps
        # ``noise_said`` for the cluster's life)
        self.noise: dict[str, set[str]] = {}
        self.noise_said = noise_said if noise_said is not None else set()
        # (task, stream) -> time of the message whose INFO record was held back: the lines
        # that came in the same message without a prefix are that record's continuation
        self._holding: dict[tuple[str, str], float] = {}

    def __call__(self, event: Event) -> None:
        if getattr(event, "origin", None) is not None:
            return  # a console on the task wrote it: that console shows it (docs/reference.md)
        if isinstance(event, OutputLine):
            if event.stream in ("stdout", "stderr") and not self._hold(event):
                self._line(event)
        elif isinstance(event, RichOutput) and event.msg_type != "update_display_data":
            self._write(self.stdout, f"{label(event.task, self.colour)} output:\n")
            self.flush()
            from IPython.display import display

            (self._display or display)(event.data, raw=True, metadata=event.metadata)
        elif isinstance(event, TaskNote) and event.level in ("WARNING", "ERROR"):
            self._write(self.stderr, f"{label(event.task, self.colour)} tfdist_nb: {event.text}\n")

    def _write(self, out: TextIO, text: str) -> None:
        """Write to ``out``, flushing the other stream first when the stream changes: in a
        notebook stdout and stderr are two buffers sent apart, which would put a task's
        ``tf.print`` lines (stderr) after the ``print`` lines (stdout) that followed them
        (docs/reference.md, "Output order and time")."""
        if self._last is not None and self._last is not out:
            self._last.flush()
        self._last = out
        out.write(text)

    def flush(self) -> None:
        """Everything written so far goes out, before the cell's closing lines."""
        for out in (self.stdout, self.stderr):
            out.flush()

    def _hold(self, event: OutputLine) -> bool:
        """Whether to keep this line out of the cell (a TensorFlow INFO record, or the rest of
        one); counted in ``held_back``."""
        if self.verbose:
            return False
        if (noise := known_noise(event.stream, event.text)) is not None:
            self.noise.setdefault(noise, set()).add(event.task)
            return True
        key = (event.task, event.stream)
        if tensorflow_info(event.stream, event.text):
            self._holding[key] = event.time
        elif self._holding.get(key) != event.time or level_of(event.stream, event.text):
            self._holding.pop(key, None)
            return False
        self.held_back += 1
        return True

    def held_back_note(self) -> str | None:
        """The cell's last line when INFO records were held back."""
        if not self.held_back:
            return None
        return (f"tfdist_nb: {self.held_back} TensorFlow INFO log line(s) not shown: "
                "%tfdist_logs --level INFO lists them (or run the cell with --verbose)")

    def noise_notes(self) -> list[str]:
        """One line per kind of known noise seen, the first time in this cluster's life."""
        notes = []
        for key, tasks in sorted(self.noise.items()):
            if key in self.noise_said:
                continue
            self.noise_said.add(key)
            names = ", ".join(sorted(tasks, key=task_order))
            notes.append("tfdist_nb: " + KNOWN_NOISE[key][1].format(n=len(tasks), tasks=names))
        return notes

    def _line(self, event: OutputLine) -> None:
        """Print one line; past ``max_lines_per_task`` say once where the rest is."""
        n = self.per_task.get(event.task, 0) + 1
        self.per_task[event.task] = n
        out = self.stdout if event.stream == "stdout" else self.stderr
        if self.max_lines is None or n <= self.max_lines:
            self._write(out, f"{label(event.task, self.colour)} {event.text}\n")
        elif n == self.max_lines + 1:
            where = f" in {self.run_dir}/events.jsonl" if self.run_dir else ""
            self._write(self.stdout, f"{label(event.task, self.colour)} ... more lines are in "
                        f"the dashboard and on disk{where} (%tfdist_logs --on {event.task})\n")

    def hidden(self) -> int:
        """Lines not printed because of the cap (all of them are on disk)."""
        if self.max_lines is None:
            return 0
        return sum(max(0, n - self.max_lines) for n in self.per_task.values())


def failure_report(result: RunResult, colour: bool = True) -> str:
    """Each failed task's explanation and traceback, under its task name; first, where NaN/Inf
    came from when NaN checking found it."""
    parts = [_one_failure(r, colour) for r in result.failed]
    if origin := first_nan(result.failed):
        parts.insert(0, f"tfdist_nb: {origin}\n")
    return "\n".join(parts)


def _one_failure(r: TaskResult, colour: bool) -> str:
    head = f"{label(r.task, colour)} {r.status}"
    if r.error is not None:
        head += f": {r.error}"
    parts = [head]
    if r.explanation:
        parts.append(f"  tfdist_nb: {r.explanation}")
    if r.error is not None and r.error.traceback:
        parts.extend(r.error.traceback)
    if r.stack:
        parts.append(f"main-thread stack of {r.task}:\n{r.stack}")
    return "\n".join(parts) + "\n"
