"""Shared fixtures: real clusters, deadlines instead of sleeps, and a leak check on every test."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.processes import SESSION_ROOT, worker_kernels


def _reap(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


@pytest.fixture(scope="session", autouse=True)
def _runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Run directories go to a temp dir, and the session ends with no worker left anywhere."""
    SESSION_ROOT.append(str(tmp_path_factory.getbasetemp()))
    root = tmp_path_factory.mktemp("tfdist_runs")
    os.environ["TFDIST_RUNS_DIR"] = str(root)
    # Spare kernels start as soon as a cluster is up; on this suite's 2 cores, one per task for
    # every test's cluster would double its processes. tests/test_warm.py (which turns them back
    # on) and the benchmarks cover them; elsewhere a cluster leaving warm= unset has none.
    os.environ.setdefault("TFDIST_WARM", "0")
    yield root
    for c in _live_clusters():
        c.stop()
    left = worker_kernels()
    _reap(left)
    assert not left, f"worker kernels left at the end of the session: {sorted(left)}"


def _live_clusters() -> list[Any]:
    """Clusters of this process that have not stopped (the one place that asks the core)."""
    from tfdist_nb.cluster.registry import live_clusters

    return list(live_clusters())


def _owned_by_live_clusters() -> set[int]:
    """Workers of clusters still running (a module-scoped cluster's restarted tasks, say), with
    the remote lifeline that an SSH task's kernel runs under."""
    owned = {rt.pid for c in _live_clusters() if c.running for rt in c.tasks.values()
             if rt.pid}
    # their spare kernels (docs/design.md, Spare kernels) belong to them too
    owned |= {pid for c in _live_clusters() if c.running
              for pid in getattr(c, "spares", lambda: {})().get("pids", ())}
    for pid in list(owned):
        with contextlib.suppress(psutil.Error, AttributeError):
            parent = psutil.Process(pid).parent()
            if "tfdist_nb.worker.remote" in parent.cmdline():  # type: ignore[union-attr]
                owned.add(parent.pid)  # type: ignore[union-attr]
    return owned


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
