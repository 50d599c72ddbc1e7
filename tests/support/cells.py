"""The cells the tests run on clusters, kept as files in tests/cells/."""

from __future__ import annotations

from pathlib import Path

CELLS = Path(__file__).parent.parent / "cells"


def cell(name: str) -> str:
    return (CELLS / f"{name}.py").read_text()
