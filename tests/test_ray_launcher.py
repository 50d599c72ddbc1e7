"""The Ray launcher on a local Ray and on a real two-node Ray cluster made here
(tests/ray_cluster.py: ``ray start --head`` and ``ray start --address`` in two network
namespaces on the tests' bridge); the notebook (this process) reaches it through Ray Client.

The two-node module fixture is shared by the tests that need it; the raylet-killing test runs
last, as it takes the second node down. After every test no Ray process of ours is left here
(a local Ray is shut down with its cluster), and after a stop no actor, kernel or placement
group is left on either node.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import ray_cluster
from tests.support.cells import cell
from tests.support.contract import check_launcher_contract
from tests.support.processes import free_port, wait_for
from tfdist_nb import Cluster
from tfdist_nb.errors import ClusterStartError
from tfdist_nb.launchers.ray_said import SPAWN_TRIES, spawn_failed

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def _ray_here() -> set[int]:
    """Ray's processes in this network namespace (a local Ray's GCS, raylet, workers)."""
    found = set()
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        words = " ".join(proc.info.get("cmdline") or [])
        if proc.info.get("name") in ("raylet", "gcs_server") or "ray::" in words \
                or "ray/_private/workers/default_worker.py" in words:
            found.add(proc.info["pid"])
    return found


@pytest.fixture(autouse=True)
def no_ray_left_here() -> Iterator[None]:
    ray_cluster.require_available()
    before = _ray_here()
    yield
    wait_for(lambda: not (_ray_here() - before), 30,
             f"no Ray process left here: {sorted(_ray_here() - before)}")


@pytest.fixture(scope="module")
def ray_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ray_cluster.RayCluster]:
    ray_cluster.require_available()
    _DIRS_BEFORE.update(_task_dirs())
    made = ray_cluster.make_ray(tmp_path_factory.mktemp("ray"))
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def ray2(ray_nodes: ray_cluster.RayCluster,
         monkeypatch: pytest.MonkeyPatch) -> ray_cluster.RayCluster:
    """The two-node cluster, its token set here as a user of a token-guarded cluster would."""
    for key, value in ray_nodes.auth.items():
        monkeypatch.setenv(key, value)
    return ray_nodes


def _task_dirs() -> set[Path]:
    """The Ray actors' directories of their kernels (the test hosts share this file system)."""
    return set(Path(tempfile.gettempdir()).glob("tfdist-ray-*"))


_DIRS_BEFORE: set[Path] = set()  # what an earlier, interrupted run may have left


def nothing_left(ray2: ray_cluster.RayCluster) -> None:
    """No actor or kernel process on either node nor their directories, every placement group
    removed in Ray's table, and every CPU of the live nodes free again in Ray's view (no actor
    or bundle holds one)."""
    for node in ray2.nodes:
        wait_for(lambda n=node: not ray2.ours(n), 20, f"no actor or kernel on {node}: "
                 f"{ray2.ours(node)}")
    wait_for(lambda: not (_task_dirs() - _DIRS_BEFORE), 20,
             f"no kernel directory left: {sorted(_task_dirs() - _DIRS_BEFORE)}")
    import ray
    from ray.util.placement_group import placement_group_table

    hook = os.environ.get("PYTHONBREAKPOINT")  # ray.init() sets Ray's, for every later process
    for attempt in range(1, SPAWN_TRIES + 1):  # as the launcher does: Ray's issue 63202
        try:
            ray.init(ray2.client_address, log_to_driver=False)
            break
        except Exception as exc:  # what Ray raises varies by version; only its text tells
            if not spawn_failed(str(exc)) or attempt == SPAWN_TRIES:
                raise
            ray.shutdown()
    try:
        states = {pg["name"]: pg["state"] for pg in placement_group_table().values()}
        # a lost node leaves Ray's view once Ray marks it dead (its health checks: < 45 s)
        wait_for(lambda: ray.available_resources().get("CPU") == ray.cluster_resources()["CPU"],
                 45, "every CPU of the live nodes free again in Ray's view")
    finally:
        ray.shutdown()
        if hook is None:
            os.environ.pop("PYTHONBREAKPOINT", None)
        else:
            os.environ["PYTHONBREAKPOINT"] = hook
    assert set(states.values()) <= {"REMOVED"}, states


def test_the_ray_launcher_keeps_the_contract_on_a_local_ray(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # a local Ray guards itself with a token, by default ~/.ray/auth_token: this test's own
    (tmp_path / "token").write_text("0" * 64)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # Ray sets it in os.environ: undone after
    with Cluster(workers=2, launcher="ray", preload=(), warm=False) as c:
        check_launcher_contract(c)


def test_an_address_that_does_not_answer_is_named() -> None:
    address = f"ray://127.0.0.1:{free_port()}"
    started = time.monotonic()
    c = Cluster(workers=1, launcher="ray", launcher_options={"address": address}, preload=())
    with pytest.raises(ClusterStartError, match=rf"the Ray cluster at {address} does not "
                                                r"answer \(Connection refused\)"):
        c.start()
    assert time.monotonic() - started < 15 and not c.running


def test_a_ray_version_differing_from_the_notebooks_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A head node running another Ray release (installed here into its own venv)."""
    import ray

    began = time.monotonic()
    other = ray_cluster.install_other_ray(tmp_path / "venv")
    installed = time.monotonic() - began
    head = ray_cluster.make_ray(tmp_path / "other", nodes=1, ray=other)
    try:
        for key, value in head.auth.items():
            monkeypatch.setenv(key, value)
        c = Cluster(workers=1, launcher="ray", preload=(), warm=False,
                    launcher_options={"address": head.client_address})
        with pytest.raises(ClusterStartError) as err:
            c.start()
        assert not c.running
    finally:
        head.remove()
    text, theirs = str(err.value), ray_cluster.other_ray_version()
    python = ".".join(map(str, sys.version_info[:3]))
    assert (f"Ray's version differs between this notebook and the Ray cluster at "
            f"{head.client_address}: the notebook has Ray {ray.__version__} (Python {python}), "
            f"the cluster Ray {theirs} (Python {python})") in text, text
    assert f"pip install 'ray[client]=={theirs}' in the notebook's environment" in text, text
    assert "Traceback" not in text, text
    print(f"Ray {theirs} installed in {installed:.1f}s; the test took "
          f"{time.monotonic() - began:.1f}s")


def test_mwms_across_two_ray_nodes(ray2: ray_cluster.RayCluster) -> None:
    hook = os.environ.get("PYTHONBREAKPOINT")
    with Cluster(workers=2, launcher="ray", launcher_options={"address": ray2.client_address},
                 warm=False) as c:
        # ray.init() points breakpoint() at Ray's debugger: not the notebook's, not a task's
        assert os.environ.get("PYTHONBREAKPOINT") == hook
        said = iter(["p v * 6", "c"])
        stepped = c.run('v = 7\nbreakpoint()\nprint("after", v)', on="worker:1", timeout=60,
                        on_input=lambda task, prompt, password: next(said))
        assert stepped.ok, stepped.summary()
        assert "42" in stepped.tasks["worker:1"].stdout
        assert "after 7" in stepped.tasks["worker:1"].stdout
        table = c.status()
        assert sorted(table["host"]) == sorted(ray2.nodes)  # SPREAD: one task per node
        for name, rt in ((str(t), rt) for t, rt in c.tasks.items()):
            assert rt.address.rpartition(":")[0] == rt.host, (name, rt.address)
            assert rt.pid in ray2.pids(rt.host)  # the kernel runs on its node
        result = c.run(cell("mwms_loop"), timeout=150)
        assert result.ok, result.summary()
        losses = {n: re.search(r"final loss ([0-9.]+)", r.stdout).group(1)  # type: ignore[union-attr]
                  for n, r in result.tasks.items()}
        assert losses["worker:0"] == losses["worker:1"]
        assert all("replicas in sync: 2" in r.stdout for r in result.tasks.values())
        table = c.status()  # telemetry came back from the nodes
        assert (table["rss_mb"] > 100).all() and (table["step"] == 20).all()
        assert all("MainThread" in s for s in c.stacks().values())
        assert set(c.logs(grep=r"loss")["task"]) == {"worker:0", "worker:1"}
        reports = c.stop()
    assert len(reports) == 2 and {r.path for r in reports} <= {"request", "kill"}
    nothing_left(ray2)


def test_the_ray_launcher_keeps_the_contract_on_two_nodes(ray2: ray_cluster.RayCluster) -> None:
    with Cluster(workers=2, launcher="ray", launcher_options={"address": ray2.client_address},
                 preload=(), warm=False) as c:
        check_launcher_contract(c)  # a crash, then a restart of every task
        old = c.tasks[next(t for t in c.tasks if str(t) == "worker:1")]
        before, host = old.pid, old.host
        c.restart(on="worker:1")
        again = c.tasks[next(t for t in c.tasks if str(t) == "worker:1")]
        assert again.pid != before and again.host == host
        assert c.run("print('back')", on="worker:1").tasks["worker:1"].stdout.strip() == "back"
        import ray

        env = c.env()  # %tfdist_env: Ray's version on each task's node and here
        assert env.loc["ray", ["worker:0", "worker:1"]].tolist() == [ray.__version__] * 2
        assert env.loc["ray (notebook)", "worker:0"] == ray.__version__
        assert not env.loc[["ray", "ray (notebook)"], "mismatch"].any()
    nothing_left(ray2)


def test_three_starts_in_a_row_from_one_notebook(ray2: ray_cluster.RayCluster) -> None:
    """Each start is a new Ray Client connection, for which the head forks a server of its own;
    some forks die (Ray's issue 63202), and the launcher then connects again."""
    for i in range(3):
        began = time.monotonic()
        with Cluster(workers=1, launcher="ray", preload=(), warm=False,
                     launcher_options={"address": ray2.client_address}) as c:
            said = c.run(f"print({i})")
            assert [r.stdout.strip() for r in said.tasks.values()] == [str(i)], said.summary()
        print(f"start {i + 1}: {time.monotonic() - began:.1f}s")
    nothing_left(ray2)


def test_an_unplaceable_request_is_named(ray2: ray_cluster.RayCluster) -> None:
    started = time.monotonic()
    c = Cluster(workers=3, launcher="ray", preload=(), warm=False, start_timeout=600,
                launcher_options={"address": ray2.client_address, "strategy": "STRICT_SPREAD"})
    with pytest.raises(ClusterStartError) as err:
        c.start()
    text = str(err.value)
    assert "Ray cannot place 3 task(s) of {CPU 1} each with strategy STRICT_SPREAD" in text
    for node in ray2.nodes:
        assert f"{node}: CPU 1" in text, text
    # named at once, not at the start timeout: under 30 s, plus about 40 s for each time Ray
    # Client's own server failed to start and the launcher connected again (Ray issue 63202)
    assert time.monotonic() - started < 100 and not c.running
    nothing_left(ray2)


def test_a_raylet_killed_mid_cell_is_named_with_its_node(ray2: ray_cluster.RayCluster) -> None:
    """Last: the second node stays down."""
    with Cluster(workers=2, launcher="ray", launcher_options={"address": ray2.client_address},
                 preload=(), warm=False) as c:
        lost = next(rt for rt in c.tasks.values() if rt.host == ray2.nodes[1])
        box: dict[str, Any] = {}
        runner = threading.Thread(target=lambda: box.update(
            r=c.run("import time\nprint('sleeping', flush=True)\ntime.sleep(120)")))
        runner.start()
        wait_for(lambda: "sleeping" in " ".join(c.logs()["text"]), 30, "the cell to start")
        killed = time.monotonic()
        ray2.kill_raylet(ray2.nodes[1])
        runner.join(60)
        assert not runner.is_alive()
        res = box["r"].tasks[lost.name]
        assert res.status == "crashed", box["r"].summary()
        assert f"lost with Ray node {ray2.nodes[1]}" in res.error.evalue, res.error.evalue
        took = time.monotonic() - killed
        print(f"a lost node ended the cell {took:.1f}s after its raylet was killed")
        assert took < 45
    nothing_left(ray2)
