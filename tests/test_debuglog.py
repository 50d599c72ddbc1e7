"""What the code swallows on purpose is logged at DEBUG, and TFDIST_LOG shows it (a fresh
interpreter each time: the variable is read when tfdist_nb's loggers are first set up)."""

from __future__ import annotations

import os
import subprocess
import sys

SNIPPET = """
import logging
from tfdist_nb.debuglog import swallowed
with swallowed(logging.getLogger("tfdist_nb.cluster.lifecycle")):
    raise OSError("the old process was gone already")
with swallowed(logging.getLogger("tfdist_nb.cluster.lifecycle"), OSError):
    raise KeyError("raised on")
"""


def run(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TFDIST_LOG"} | env_extra
    return subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True,
                          env=env, timeout=60)


def test_tfdist_log_debug_shows_what_was_swallowed_and_where() -> None:
    proc = run({"TFDIST_LOG": "debug"})
    assert "KeyError: 'raised on'" in proc.stderr  # only the types it was given
    line = next(x for x in proc.stderr.splitlines() if "swallowed OSError" in x)
    # the line of the with-statement that swallowed it
    assert line.startswith("tfdist_nb DEBUG tfdist_nb.cluster.lifecycle (<string>:4): ")
    assert "the old process was gone already" in line


def test_without_tfdist_log_nothing_is_said() -> None:
    proc = run({})
    assert "swallowed" not in proc.stderr and "KeyError" in proc.stderr
