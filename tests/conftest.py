"""Shared fixtures: real clusters, deadlines instead of sleeps, and a leak check on every test."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

CELLS = Path(__file__).parent / "cells"


_SESSION_ROOT: list[str] = []  # this session's pytest base temp: every test's run dirs are below


def worker_kernels() -> set[int]:
    """PIDs of the tfdist_nb worker kernels this test session started (their connection files
    live under its base temp dir), so another test run on the machine does not count."""
    root = _SESSION_ROOT[0] if _SESSION_ROOT else ""
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "tfdist_nb.worker.kernel" in cmd and any(root in part for part in cmd):
            found.add(proc.info["pid"])
    return found


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it is truthy; fail the test with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def _reap(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


@pytest.fixture(scope="session", autouse=True)
def _runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Run directories go to a temp dir, and the session ends with no worker left anywhere."""
    _SESSION_ROOT.append(str(tmp_path_factory.getbasetemp()))
    root = tmp_path_factory.mktemp("tfdist_runs")
    os.environ["TFDIST_RUNS_DIR"] = str(root)
    yield root
    from tfdist_nb.cluster import cluster

    for c in list(cluster._live):
        c.stop()
    left = worker_kernels()
    _reap(left)
    assert not left, f"worker kernels left at the end of the session: {sorted(left)}"


def _owned_by_live_clusters() -> set[int]:
    """Workers of clusters still running (a module-scoped cluster's restarted tasks, say)."""
    from tfdist_nb.cluster import cluster

    return {rt.pid for c in list(cluster._live) if c.running for rt in c.tasks.values()
            if rt.pid}


@pytest.fixture(autouse=True)
def no_leaked_workers() -> Iterator[None]:
    """Fail a test that leaves behind a worker kernel it started."""
    before = worker_kernels()
    yield
    deadline = time.monotonic() + 5
    while ((new := worker_kernels() - before - _owned_by_live_clusters())
           and time.monotonic() < deadline):
        time.sleep(0.1)
    _reap(new)
    assert not new, f"test leaked worker kernels: {sorted(new)}"


@pytest.fixture(scope="module")
def cluster2() -> Iterator[Any]:
    """One 2-worker cluster shared by a module's tests (each TF task costs ~3 s to start)."""
    from tfdist_nb import Cluster

    with Cluster(workers=2) as c:
        yield c


def cell(name: str) -> str:
    return (CELLS / f"{name}.py").read_text()
