"""Where a task's main thread stands, on a real worker kernel, wherever its temp dir is.

ipykernel names cell files under the platform's temp dir (``$TMPDIR/ipykernel_<pid>/``), and
SLURM nodes usually set TMPDIR: a cell's stack must read as the user's code there too.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.events import OutputLine

pytestmark = pytest.mark.cluster

BUSY_LOOP = """
import sys, time
print("busy in", sys._getframe().f_code.co_filename, flush=True)   # the kernel's cell file
t = time.time()
while time.time() - t < 120:   # ended by the test's interrupt
    pass
"""


@pytest.mark.parametrize("tmpdir", ["node-local", "default"])
def test_a_cell_in_a_busy_python_loop_reads_as_python(tmp_path: Path, tmpdir: str) -> None:
    env: dict[str, str] = {}
    if tmpdir == "node-local":
        node_tmp = tmp_path / "node-tmp"
        node_tmp.mkdir()
        env["TMPDIR"] = str(node_tmp)
    with Cluster(workers=1, preload=(), env=env) as c:
        busy = threading.Event()
        results: list[Any] = []
        cell_file: list[str] = []

        def seen(event: Any) -> None:
            if isinstance(event, OutputLine) and event.text.startswith("busy in "):
                cell_file.append(event.text.strip().removeprefix("busy in "))
                busy.set()

        runner = threading.Thread(target=lambda: results.append(
            c.run(BUSY_LOOP, timeout=150, on_event=seen)))
        runner.start()
        stacks: list[str] = []

        def in_the_loop() -> bool:
            # (right after "busy in" the main thread may still be in print's flush)
            stacks.append(c.stacks()["worker:0"])
            return stacks[-1].startswith(f"main thread: python at {cell_file[0]}:")

        try:
            assert busy.wait(60), "the cell never started"
            # where the user's loop is, in the file the kernel compiled the cell to (below
            # TMPDIR when it is set), whatever ipykernel names it; never "idle"
            wait_for(in_the_loop, 20, f"the main thread read as python at {cell_file[0]}")
        finally:
            c.interrupt()
            runner.join(60)
        assert not runner.is_alive()
        assert stacks[-1].splitlines()[0].endswith(" in <module>")
        # and the notebook's numbering of that line, which the temp file name does not tell
        assert re.match(r"  the user's line that led there: cell \d+ line \d+$",
                        stacks[-1].splitlines()[1]), stacks[-1]
        assert not any(s.startswith("main thread: idle") for s in stacks), stacks
        assert results[0].tasks["worker:0"].error.ename == "KeyboardInterrupt"
