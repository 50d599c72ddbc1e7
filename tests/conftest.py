"""Shared fixtures: real clusters, deadlines instead of sleeps, and a leak check on every test."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client.provisioning import LocalProvisioner

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



# --- the fast layer's guard (README.md, "Development") --------------------------------------
# `pytest -m "not cluster"` starts no kernel, server, browser or fake host and imports no
# TensorFlow. Every process this pytest process starts goes through Popen (asyncio's too, on
# any thread) and every kernel through jupyter_client's LocalProvisioner (a forked one too), so
# a heavy command line is noted against the test running then; what a plain subprocess starts
# in turn is not seen.
#: modules run with ``python -m``, and programs, that are a kernel, a server or a fake host
HEAVY_MODULES = {"ipykernel", "ipykernel_launcher", "tfdist_nb.worker", "tfdist_nb.worker.kernel",
                 "tfdist_nb.worker.remote", "tfdist_nb.launchers.zygote"}
HEAVY_PROGRAMS = {"sshd", "slurmd", "slurmctld", "munged", "chromium", "chrome", "headless_shell",
                  "jupyter-lab", "jupyter-server", "jupyter-notebook", "jupyter-execute"}
#: ``jupyter <app>`` that serves or runs a kernel, unless a listing (``jupyter server extension
#: list``) or a build follows it
JUPYTER_APPS = {"lab", "server", "notebook", "console", "kernel", "execute", "nbconvert"}
_test: dict[str, Any] = {}  # the test being set up, run or torn down: its item, had_tf, started


def heavy_command(words: list[str]) -> bool:
    """Whether a command line starts a kernel, a Jupyter server, a browser or a fake host."""
    for i, word in enumerate(words):
        after = words[i + 1:i + 3]
        if (os.path.basename(word) in HEAVY_PROGRAMS or "/playwright/" in word
                or (word in HEAVY_MODULES and words[i - 1] == "-m")):
            return True
        if (os.path.basename(word) == "jupyter" and after and after[0] in JUPYTER_APPS
                and after[1:] not in (["extension"], ["list"], ["build"])):
            return True
    return False


def _note(words: list[str]) -> None:
    item = _test.get("item")
    if item is not None and not item.get_closest_marker("cluster"):
        _test["started"].append(" ".join(words))


_popen_init = subprocess.Popen.__init__
_pre_launch = LocalProvisioner.pre_launch


def _watched_popen(self: subprocess.Popen[Any], args: Any, *a: Any, **kw: Any) -> None:
    parts = [args] if isinstance(args, (str, bytes, os.PathLike)) else args
    words = " ".join(os.fsdecode(p) for p in parts).split()  # ``sh -c "python -m ..."`` too
    if heavy_command(words):
        _note(words)
    _popen_init(self, args, *a, **kw)


async def _watched_pre_launch(self: LocalProvisioner, **kwargs: Any) -> dict[str, Any]:
    """Every kernel a KernelManager starts here, one forked from a fork server (no Popen) too."""
    kwargs = await _pre_launch(self, **kwargs)
    _note(list(kwargs.get("cmd") or ["a kernel"]))
    return kwargs


subprocess.Popen.__init__ = _watched_popen  # type: ignore[method-assign]
LocalProvisioner.pre_launch = _watched_pre_launch  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Setup included: a module-scoped cluster starts in its first test's setup."""
    outer = dict(_test)  # a test running pytest in this process (tests/test_fast_layer.py)
    _test.update(item=item, had_tf="tensorflow" in sys.modules, started=[])
    try:
        return (yield)
    finally:
        _test.clear()
        _test.update(outer)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Fail, as a teardown error, an unmarked test that started something heavy."""
    yield
    started = _test.get("started", [])
    if not _test.get("had_tf", True) and "tensorflow" in sys.modules:
        started.append("import tensorflow (in the pytest process)")
    if started and not item.get_closest_marker("cluster"):
        pytest.fail(f"{item.nodeid} is not marked cluster but started {started}: mark it "
                    "@pytest.mark.cluster (or its module: pytestmark = pytest.mark.cluster) so "
                    "that the fast layer, pytest -m 'not cluster', starts none", pytrace=False)
