"""The merged log as a pandas DataFrame, built from the run directory (``Cluster.logs()``,
docs/reference.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TypedDict, cast

import pandas as pd

from tfdist_nb.errors import SpecError
from tfdist_nb.events import Restart, RestartRecord

COLUMNS = ["time", "task", "stream", "level", "text", "cell"]

# TensorFlow's C++ log prefix ("I0000 00:00:... file.cc:12]" or "2026-... I tensorflow/...")
_CPP = re.compile(r"^(?:[IWEF]\d{4} \d\d:\d\d:\d\d|\S+ \S+: ([IWEF]) tensorflow/)")
_PY = re.compile(r"^(?:\S*:)?\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b[: ]")
_CPP_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "FATAL"}
# NCCL's debug lines (NCCL_DEBUG=WARN or INFO): "host:pid:tid [cudaDev] file.cc:12 NCCL WARN ..."
_NCCL = re.compile(r"^\S+:\d+:\d+ (?:\[\d+\] )?(?:\S+ )?NCCL (WARN|INFO|TRACE)\b")
_NCCL_LEVELS = {"WARN": "WARNING", "INFO": "INFO", "TRACE": "DEBUG"}
# TensorFlow's Python logger in a kernel: "INFO:tensorflow:..." (logging's basic format)
_TF_PY_INFO = re.compile(r"^(?:INFO|DEBUG):tensorflow:")
# what absl says once before TensorFlow's first C++ log record (in a task's first cell with
# TensorFlow 2.16; at import, before any cell, with 2.21): about the log, not about the job
ABSL_PREAMBLE = ("WARNING: All log messages before absl::InitializeLog() is called are written "
                 "to STDERR")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "FATAL")


def level_of(stream: str, text: str) -> str | None:
    """The log level a line carries, when it looks like a TF C++ or Python logging record."""
    if stream == "error":
        return "ERROR"
    if m := _CPP.match(text):
        return _CPP_LEVELS[m.group(1) or text[0]]
    if m := _NCCL.match(text):
        return _NCCL_LEVELS[m.group(1)]
    return m.group(1) if (m := _PY.match(text)) else None


def tensorflow_info(stream: str, text: str) -> bool:
    """Whether a line is TensorFlow's own INFO/DEBUG record (C++, Python logger, absl's
    preamble): held back from the cell by default (docs/reference.md, Output in the cell)."""
    if stream not in ("stdout", "stderr"):
        return False
    if m := _CPP.match(text):
        return (m.group(1) or text[0]) == "I"
    return _TF_PY_INFO.match(text) is not None or text == ABSL_PREAMBLE


# Harmless native lines every task prints, and NCCL's debug lines (their meaning reaches the cell
# as a classified error, diagnostics/gpu_faults.py): said once per cluster, not per task and cell
KNOWN_NOISE = {
    "no-gpu": (re.compile(r"failed call to cuInit"),
               "TensorFlow found no GPU on {n} task(s) ({tasks}): no NVIDIA driver here "
               "(its 'failed call to cuInit' line is kept on disk: %tfdist_logs --grep cuInit)"),
    "generator-dataset": (
        re.compile(r"Input of GeneratorDatasetOp::Dataset will not be optimized"),
        "TensorFlow noted on {n} task(s) ({tasks}) that a Dataset.from_generator input is not "
        "graph-optimized: harmless, the generator runs in Python as written (its line is kept "
        "on disk: %tfdist_logs --grep GeneratorDatasetOp)"),
    "nccl-debug": (_NCCL, "NCCL's debug lines (NCCL_DEBUG) of {n} task(s) ({tasks}) are kept in "
                          "their logs, not shown here: %tfdist_logs --grep NCCL"),
}


def known_noise(stream: str, text: str) -> str | None:
    """The KNOWN_NOISE key a line belongs to, or None."""
    if stream not in ("stdout", "stderr"):
        return None
    return next((key for key, (pattern, _) in KNOWN_NOISE.items() if pattern.search(text)),
                None)


def check_filters(level: str | None, grep: str | None, tail: int | None) -> set[str] | None:
    """``Cluster.logs``' filters checked before any file is read; returns the levels
    (``"WARNING,ERROR"`` -> ``{"WARNING", "ERROR"}``). A SpecError names the one that is wrong."""
    levels = None
    if level is not None:
        levels = {part.strip().upper() for part in level.split(",") if part.strip()}
        unknown = levels - set(LEVELS)
        if unknown or not levels:
            raise SpecError(f"unknown log level {', '.join(sorted(unknown)) or level!r}; use "
                            f"{', '.join(LEVELS)} (comma separated)")
    if grep is not None:
        try:
            re.compile(grep)
        except re.error as exc:
            raise SpecError(f"grep: {grep!r} is not a regular expression ({exc})") from None
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 1):
        raise SpecError(f"tail: {tail!r} is not a number of lines (1 or more)")
    return levels


class LogFrame(pd.DataFrame):
    """The logs as a DataFrame whose display keeps each line whole: pandas cuts a column at
    50 characters, which hid the value a ``--grep`` looked for."""

    @property
    def _constructor(self) -> type[LogFrame]:
        return LogFrame

    def __repr__(self) -> str:  # a row per line, however wide (a terminal folds it)
        with pd.option_context("display.max_colwidth", None, "display.max_columns", None,
                               "display.width", None, "display.expand_frame_repr", False):
            return super().__repr__()

    def _repr_html_(self) -> str | None:
        with pd.option_context("display.max_colwidth", None):
            return super()._repr_html_()


class LogLine(TypedDict, total=False):
    """What the frame reads of an output line or a note (events.OutputRecord, NoteRecord)."""

    kind: str  # output | note
    time: float
    task: str
    stream: str  # an output line's
    level: str  # a note's
    text: str
    cell: int | None


def _lines(records: Iterable[Mapping[str, object]]) -> Iterator[LogLine]:
    """The output lines and notes of ``events.jsonl`` (a restart: a note in each task's log)."""
    for rec in records:
        kind = rec.get("kind")
        if kind in ("output", "note"):
            yield cast(LogLine, rec)  # as events.py's to_json wrote it
        elif kind == Restart.kind:
            restart = Restart(**cast(RestartRecord, rec))
            for t in restart.tasks:
                yield {"kind": "note", "time": restart.time, "task": t, "level": "INFO",
                       "text": restart.said(t)}


def logs_frame(records: Iterable[Mapping[str, object]], on: set[str] | None = None,
               grep: str | None = None, tail: int | None = None,
               levels: set[str] | None = None) -> pd.DataFrame:
    """One row per output line or note (a restart's: one in each task's log); ``levels``: only
    lines carrying one of these levels."""
    pattern = re.compile(grep) if grep else None
    rows = []
    for rec in _lines(records):
        kind = rec.get("kind")
        if on is not None and rec["task"] not in on:
            continue
        text = rec["text"]
        if pattern is not None and not pattern.search(text):
            continue
        stream = rec.get("stream", "controller")
        level = rec.get("level") if kind == "note" else level_of(stream, text)
        if levels is not None and level not in levels:
            continue
        rows.append((rec["time"], rec["task"], stream, level, text, rec.get("cell")))
    if tail is not None:
        rows = rows[-tail:]
    df = LogFrame(rows, columns=COLUMNS)
    df["time"] = pd.to_datetime(df["time"], unit="s", utc=True)
    return df
