"""``StrEnum`` on Python 3.10 too: members are strings that compare equal to their value and
print as it (``TaskState.IDLE == "idle"``, ``f"{TaskState.IDLE}"`` is ``idle``), so an outcome
is typed in code and reads as its word in messages and JSON."""

from __future__ import annotations

import enum
import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10
    class StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)

__all__ = ["StrEnum"]
