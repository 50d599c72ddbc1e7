"""A full disk under the run directory: a real 2 MB tmpfs, filled while a real cluster runs.

Nothing the tasks print is lost or kept from the user: the cell shows every line, the detectors
get every heartbeat (a busy cell is not called stalled), the refusal is said once, %tfdist_logs
reads what waits in memory, and it all reaches the disk once there is room again.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfdist_nb import Cluster
from tfdist_nb.events import OutputLine, TaskNote

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

FLOOD = "for i in range(3000):\n    print(f'line {i:04d} ' + 'x' * 60)\n"  # ~220 kB a task


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (this test makes a real full disk)")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tfdist-test",
                    str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk refuses: the disk is full after this."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:
                f.write(b"\0")
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_loses_no_line_and_ends_no_healthy_cell(small_disk: Path) -> None:
    with Cluster(workers=2, run_dir=small_disk) as c:
        events_file = c.run_dir / "events.jsonl"
        filler = fill(small_disk)
        seen: list[object] = []
        flood = c.run(FLOOD, on_event=seen.append)
        assert flood.ok, flood.summary()
        # every line reached the cell's live output and its result
        for task in ("worker:0", "worker:1"):
            live = [e.text for e in seen if isinstance(e, OutputLine) and e.task == task
                    and e.stream == "stdout"]
            assert live == [f"line {i:04d} " + "x" * 60 for i in range(3000)]
            assert flood.tasks[task].stdout.count("\n") == 3000
        said = [e.text for e in seen if isinstance(e, TaskNote) and e.task == "run directory"]
        assert len(said) == 1, said
        assert said[0].startswith(f"cannot write the run directory {c.run_dir} (No space left "
                                  "on device): output is kept in memory")
        assert c.disk_trouble() == "No space left on device"
        # %tfdist_logs reads the disk and what waits in memory as one log
        logs = c.logs(on="worker:1", grep="^line ")
        assert list(logs["text"]) == [f"line {i:04d} " + "x" * 60 for i in range(3000)]
        # the heartbeats still reach the stall detector: a busy cell longer than the stall
        # timeout, printing nothing, is healthy
        busy = c.run("import time\nt = time.time()\nwhile time.time() - t < 9:\n    pass\n"
                     "print('done')", on="worker:0", stall_timeout=5)
        assert busy.ok, busy.summary()
        assert sum("cannot write the run directory" in a for a in c.alerts()) == 1
        # room again: what was held is written, in order, and that is said
        on_disk_before = events_file.stat().st_size
        filler.unlink()
        seen.clear()
        after = c.run("print('after')", on_event=seen.append)
        assert after.ok
        back = [e.text for e in seen if isinstance(e, TaskNote) and e.task == "run directory"]
        assert len(back) == 1 and back[0].startswith(
            f"the run directory {c.run_dir} is written again: ")
        assert events_file.stat().st_size > on_disk_before
        assert c.disk_trouble() is None
    records = [json.loads(x) for x in events_file.read_text().splitlines()]
    for task in ("worker:0", "worker:1"):
        mine = [r["text"] for r in records if r.get("task") == task and r.get("stream") == "stdout"
                and r["text"].startswith("line ")]
        assert mine == [f"line {i:04d} " + "x" * 60 for i in range(3000)]
    assert any(r.get("text") == "after" for r in records)
