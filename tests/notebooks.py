"""Reading executed notebooks as a person would: the text each cell shows."""

from __future__ import annotations

import re
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cell_text(cell: Any, errors: bool = False) -> str:
    """Streams and the text form of results, colours stripped; ``errors``: also ename: evalue."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
        elif errors and out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return ANSI.sub("", "".join(parts))
