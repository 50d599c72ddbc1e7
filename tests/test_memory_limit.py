"""The quickstart fits Binder's usual 2 GB (docs/workshop.md, binder/README.md): run headless in a
memory cgroup this test makes with a 2 GiB limit, the same command a student runs, with the
defaults (spares on: the pool reads the cgroup's limit before starting one). It needs a memory
cgroup it may create (root, or a delegated cgroup v2 subtree); elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIMIT = 2 * 2**30


class MemoryCgroup:
    """A child memory cgroup (v2 where the memory controller is there, else v1) with a limit."""

    def __init__(self, name: str) -> None:
        v2 = Path("/sys/fs/cgroup")
        if "memory" in _read(v2 / "cgroup.controllers").split():
            self.path, self.v2 = v2 / name, True
        elif (v1 := v2 / "memory").is_dir():
            self.path, self.v2 = v1 / name, False
        else:
            raise OSError("no memory cgroup controller mounted")
        self.path.mkdir()
        try:
            (self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(
                str(LIMIT))
        except OSError:
            self.path.rmdir()
            raise

    def peak(self) -> int | None:
        text = _read(self.path / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes"))
        return int(text) if text.strip().isdigit() else None

    def oom_kills(self) -> int:
        if self.v2:
            for line in _read(self.path / "memory.events").splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
            return 0
        return int(_read(self.path / "memory.failcnt") or 0)

    def remove(self) -> None:
        for pid in _read(self.path / "cgroup.procs").split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        self.path.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.fixture
def cgroup() -> Iterator[MemoryCgroup]:
    try:
        made = MemoryCgroup(f"tfdist-test-{os.getpid()}")
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here ({exc}): run as root or in a delegated "
                    "cgroup v2 subtree")
    try:
        yield made
    finally:
        made.remove()


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_the_quickstart_runs_within_2_gb(cgroup: MemoryCgroup, tmp_path: Path) -> None:
    env = {**os.environ, "TFDIST_RUNS_DIR": str(tmp_path / "runs")}
    joined = f"echo $$ > {cgroup.path / 'cgroup.procs'} && exec \"$@\""
    run = subprocess.run(
        ["sh", "-c", joined, "sh", sys.executable, "-m", "tfdist_nb", "quickstart",
         "--no-colour", "--notebook", str(REPO / "examples" / "01_quickstart.ipynb")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] {task} final loss" in run.stdout
    assert "stopped 2 task(s) of 2 workers" in run.stdout
    peak = cgroup.peak()
    print(f"quickstart under a {LIMIT / 2**30:.0f} GiB cgroup: peak "
          f"{(peak or 0) / 2**20:.0f} MiB")
    assert peak is None or peak < LIMIT
    assert cgroup.oom_kills() == 0
