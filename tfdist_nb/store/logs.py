"""The merged log as a pandas DataFrame, built from the run directory (``Cluster.logs()``,
docs/reference.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import pandas as pd

COLUMNS = ["time", "task", "stream", "level", "text", "cell"]

# TensorFlow's C++ log prefix ("I0000 00:00:... file.cc:12]" or "2026-... I tensorflow/...")
_CPP = re.compile(r"^(?:[IWEF]\d{4} \d\d:\d\d:\d\d|\S+ \S+: ([IWEF]) tensorflow/)")
_PY = re.compile(r"^(?:\S*:)?\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b[: ]")
_CPP_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "FATAL"}


def level_of(stream: str, text: str) -> str | None:
    """The log level a line carries, when it looks like a TF C++ or Python logging record."""
    if stream == "error":
        return "ERROR"
    m = _CPP.match(text)
    if m:
        return _CPP_LEVELS[m.group(1) or text[0]]
    m = _PY.match(text)
    return m.group(1) if m else None


def logs_frame(records: Iterable[dict[str, Any]], on: set[str] | None = None,
               grep: str | None = None, tail: int | None = None) -> pd.DataFrame:
    pattern = re.compile(grep) if grep else None
    rows = []
    for rec in records:
        kind = rec.get("kind")
        if kind not in ("output", "note"):
            continue
        if on is not None and rec["task"] not in on:
            continue
        text = rec["text"]
        if pattern is not None and not pattern.search(text):
            continue
        stream = rec.get("stream", "controller")
        level = rec.get("level") if kind == "note" else level_of(stream, text)
        rows.append((rec["time"], rec["task"], stream, level, text, rec.get("cell")))
    if tail is not None:
        rows = rows[-tail:]
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["time"] = pd.to_datetime(df["time"], unit="s", utc=True)
    return df
