"""The SLURM launcher against a real SLURM: slurmctld, two slurmd nodes and munge, made here on
the network-namespace hosts of tests/remote_hosts.py (tests/slurm_cluster.py).

Nothing is mocked: jobs go through ``sbatch``, their state comes from ``squeue``/``scontrol``,
``scancel`` ends them, and the workers run inside the job steps on the two nodes. Without root,
iproute2 or the Debian packages the module skips saying why; under CI it fails instead.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests import slurm_cluster
from tests.notebooks import cell_text
from tests.support.cells import cell
from tests.support.contract import check_launcher_contract
from tests.support.processes import wait_for, worker_kernels
from tfdist_nb import Cluster
from tfdist_nb.errors import ClusterStartError, SpecError
from tfdist_nb.launchers.slurm import batch_script, check_sbatch_args, task_script
from tfdist_nb.launchers.slurm_job import JobState
from tfdist_nb.topology import TaskId

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(150)]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm_cluster.SlurmCluster]:
    slurm_cluster.require_available()
    made = slurm_cluster.make_slurm(tmp_path_factory.mktemp("slurm"))
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(made.conf)  # as a user would export it; notebooks inherit it
    try:
        yield made
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        made.remove()


@pytest.fixture(autouse=True)
def queue_left_empty(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test that used SLURM leaves no job in the queue and no process on any node."""
    yield
    if "slurm" not in request.fixturenames:
        return
    cluster: slurm_cluster.SlurmCluster = request.getfixturevalue("slurm")
    nothing_left(cluster)


def nothing_left(cluster: slurm_cluster.SlurmCluster, timeout: float = 15) -> None:
    wait_for(lambda: not cluster.jobs(), timeout, f"an empty queue: {cluster.jobs()}")
    wait_for(lambda: not any(cluster.node_pids(n) for n in cluster.nodes), timeout,
             "no process on any node: "
             + str({n: [_cmd(p) for p in cluster.node_pids(n)] for n in cluster.nodes}))


def _cmd(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:120]
    except psutil.Error:
        return f"{pid} (gone)"


def job_id(said: list[str]) -> str:
    return next(m.group(1) for line in said
                if (m := re.search(r"submitted SLURM job (\d+)", line)))


# ---------------------------------------------------------------------------- no SLURM needed
def test_sbatch_options_the_launcher_sets_itself_are_refused() -> None:
    assert check_sbatch_args("--partition=gpu --nodes=2 -t 10") == [
        "--partition=gpu", "--nodes=2", "-t", "10"]
    for bad in ("--ntasks=4", "-n4", "--output=x", "-o", "--array=1-3", "--wrap=true"):
        with pytest.raises(ValueError, match="is not allowed"):
            check_sbatch_args([bad])


def test_the_scripts_map_slurm_tasks_to_cluster_tasks_and_exec_the_worker() -> None:
    tasks = [TaskId("chief", 0), TaskId("worker", 0), TaskId("worker", 1)]
    directory = Path("/shared/run dir")
    job = batch_script(tasks, directory)
    assert "exec srun --ntasks=3 --kill-on-bad-exit=0 --output='/shared/run dir'/task-%t.log" \
        in job and "/bin/bash '/shared/run dir'/task.sh" in job
    task = task_script(tasks, "/opt/py 3/bin/python", directory)
    for i, t in enumerate(tasks):
        assert f"  {i}) task={t} ;;" in task
    # exec: the worker replaces the shell in the job step's process tree (scancel reaches it)
    assert ("exec '/opt/py 3/bin/python' -m tfdist_nb.worker --task \"$task\" --connection-dir "
            "'/shared/run dir' --ip \"$ip\" --tf-host \"$node\"") in task


def test_job_state_in_slurms_words() -> None:
    pending = JobState("PENDING", "Resources", start="2030-01-01T10:00:00")
    assert pending.words("7") == ("SLURM job 7 PENDING (Resources: waiting for resources "
                                  "(nodes, CPUs, GPUs) to become free), expected to start at "
                                  "2030-01-01T10:00:00")
    assert not pending.ended
    timeout = JobState("TIMEOUT", "TimeLimit", exit_code="0:15")
    assert timeout.ended and timeout.final and "reached its time limit" in timeout.words("7")


def test_the_slurm_launcher_takes_no_hosts() -> None:
    with pytest.raises(SpecError, match="drop hosts="):
        Cluster(workers=2, launcher="slurm", hosts=["a", "b"])


# ---------------------------------------------------------------------------- real SLURM
def test_mwms_across_two_slurm_nodes_from_a_notebook(slurm: slurm_cluster.SlurmCluster,
                                                     tmp_path: Path) -> None:
    from tests.notebooks import run_notebook

    started = time.monotonic()
    nb = run_notebook([
        "%load_ext tfdist_nb",
        '%%tfcluster 2 workers --sbatch "--nodes=2" --no-dashboard\n' + cell("mwms_loop")
        + "\nimport json, os, psutil\n"
          "print('TF_CONFIG', os.environ['TF_CONFIG'])\n"
          "print('SLURM', os.environ['SLURM_JOB_ID'], os.environ['SLURMD_NODENAME'], "
          "os.getpid(), psutil.Process().parent().name())",
        "from tfdist_nb import current\n"
        "print('CONNECTION', current().launcher.job.dir)",
        "%tfdist_stop",
    ], tmp_path)
    elapsed = time.monotonic() - started
    out = cell_text(nb.cells[1])
    assert "(slurm)" in out and "2 workers ready" in out, out[-3000:]
    job = job_id([out])
    assert re.search(rf"SLURM job {job} RUNNING on ", out)
    # both tasks are SLURM tasks of the one job, each on its own node, under slurmstepd
    seen = dict(re.findall(r"\[(worker:\d)\] SLURM (\d+ \S+ \d+ \S+)", out))
    assert set(seen) == {"worker:0", "worker:1"}, out[-3000:]
    jobs, nodes, _pids, parents = zip(*(v.split() for v in seen.values()), strict=True)
    assert set(jobs) == {job}
    assert sorted(nodes) == sorted(slurm.nodes)
    assert set(parents) == {"slurmstepd"}  # not daemonized out of the job step
    # TF_CONFIG from where the tasks landed: both nodes' addresses, the same on both tasks
    configs = [json.loads(c) for c in re.findall(r"\] TF_CONFIG (\{.*\})", out)]
    assert len(configs) == 2 and configs[0]["cluster"] == configs[1]["cluster"]
    hosts = [a.rpartition(":")[0] for a in configs[0]["cluster"]["worker"]]
    assert sorted(hosts) == sorted(slurm.nodes)
    losses = re.findall(r"final loss (\S+) after 20 steps", out)
    assert len(losses) == 2 and losses[0] == losses[1], out[-3000:]
    # the channels cross the network: the kernels listen on the node's address, with Curve
    directory = Path(re.search(r"CONNECTION (\S+)", cell_text(nb.cells[2])).group(1))
    assert directory.stat().st_mode & 0o777 == 0o700
    nothing_left(slurm)  # stop: the job is gone from squeue, no process on either node
    assert not list(directory.glob("worker-*.json"))  # the connection files went with it
    print(f"notebook with a 2-node SLURM job, MWMS and stop: {elapsed:.1f}s")


def test_api_start_stop_and_encrypted_channels_on_the_node_address(
        slurm: slurm_cluster.SlurmCluster) -> None:
    said: list[str] = []
    started = time.monotonic()
    with Cluster(workers=2, launcher="slurm", preload=(),
                 launcher_options={"sbatch_args": ["--nodes=2"], "progress": said.append}) as c:
        ready = time.monotonic() - started
        job = c.launcher.job
        assert [line.split()[0] for line in slurm.jobs()] == [job.id]
        status = c.status()
        assert sorted(status["host"]) == sorted(slurm.nodes)
        for t, rt in c.tasks.items():
            info = json.loads((job.dir / f"{t.slug}.json").read_text())
            assert info["ip"] == rt.address.rpartition(":")[0] in slurm.nodes
            assert info["curve_publickey"] and info["curve_secretkey"]
        pids = [rt.pid for rt in c.tasks.values()]
        assert set(pids) <= worker_kernels()  # the suite's leak check sees SLURM's workers
        log = (c.run_dir / "tasks" / "worker-0" / "kernel.log")
        assert log.resolve() == job.task_log(TaskId("worker", 0))
        stop_started = time.monotonic()
    stopped = time.monotonic() - stop_started
    assert not slurm.jobs()
    assert not any(psutil.pid_exists(p) for p in pids)
    print(f"submit to ready {ready:.1f}s, stop {stopped:.1f}s; said: {said}")


@pytest.mark.parametrize(("workers", "sbatch", "words"), [
    (3, ["--nodes=3"], r"SLURM job \d+ PENDING \((PartitionConfig|PartitionNodeLimit): .*"
                       r"it cannot start as requested \(sbatch --nodes=3\); cancelled it"),
    (2, ["--partition=nope"], r"(?s)SLURM refused the job: sbatch: error: .*Invalid partition name "
                              r"specified"),
])
def test_a_request_slurm_cannot_satisfy_fails_in_seconds_with_its_reason(
        slurm: slurm_cluster.SlurmCluster, workers: int, sbatch: list[str], words: str) -> None:
    started = time.monotonic()
    c = Cluster(workers=workers, launcher="slurm", preload=(), start_timeout=60,
                launcher_options={"sbatch_args": sbatch, "progress": lambda _: None})
    with pytest.raises(ClusterStartError, match=words):
        c.start()
    took = time.monotonic() - started
    assert took < 10, took
    assert not slurm.jobs()
    print(f"refused after {took:.1f}s")


def test_a_job_that_fails_is_reported_with_slurms_state_and_the_tasks_output(
        slurm: slurm_cluster.SlurmCluster) -> None:
    started = time.monotonic()
    c = Cluster(workers=1, launcher="slurm", preload=(), python="/nonexistent/python",
                launcher_options={"progress": lambda _: None})
    with pytest.raises(ClusterStartError) as info:
        c.start()
    took = time.monotonic() - started
    message = str(info.value)
    assert re.search(r"SLURM job \d+ FAILED \(NonZeroExitCode\), exit code 3:0 before worker:0",
                     message), message
    assert "task 0: Exited with exit code 3" in message  # srun's words
    assert "/nonexistent/python did not run on node" in message  # the task's own output
    assert took < 10, took
    print(f"failed job reported after {took:.1f}s")


def test_a_pending_job_says_why_and_its_wait_is_bounded(
        slurm: slurm_cluster.SlurmCluster) -> None:
    blocker = slurm.tool("sbatch", "--parsable", "--nodes=2", "--exclusive",
                         f"--output={slurm.workdir}/blocker-%j.out", "--wrap",
                         "sleep 120").stdout.strip()
    try:
        wait_for(lambda: f"{blocker} RUNNING None" in slurm.jobs(), 15, "the blocking job")
        said: list[str] = []
        c = Cluster(workers=2, launcher="slurm", preload=(),
                    launcher_options={"wait_timeout": 3, "progress": said.append})
        started = time.monotonic()
        with pytest.raises(ClusterStartError, match=r"SLURM job \d+ PENDING \((Resources|"
                                                    r"Priority): .*after 3s \(wait_timeout\)"):
            c.start()
        assert time.monotonic() - started < 8
        assert any(re.fullmatch(r"SLURM job \d+ PENDING \((Resources|Priority): .*", s)
                   for s in said), said
    finally:
        slurm.tool("scancel", blocker)


def test_a_job_cancelled_from_outside_ends_the_running_cell_with_that_reason(
        slurm: slurm_cluster.SlurmCluster) -> None:
    with Cluster(workers=2, launcher="slurm", preload=(),
                 launcher_options={"sbatch_args": ["--nodes=2"],
                                   "progress": lambda _: None}) as c:
        job = c.launcher.job.id
        cancelled: list[float] = []

        def cancel() -> None:
            wait_for(lambda: all(rt.state.value == "busy" for rt in c.tasks.values()), 10,
                     "the cell running")
            time.sleep(0.5)
            cancelled.append(time.monotonic())
            slurm.tool("scancel", job)

        threading.Thread(target=cancel, daemon=True).start()
        result = c.run("import time\ntime.sleep(60)", timeout=40)
        latency = time.monotonic() - cancelled[0]
        assert latency < 5, latency
        for r in result.tasks.values():
            assert r.status == "crashed", result.summary()
            assert re.search(rf"ended with its job: SLURM job {job} (CANCELLED|COMPLETING)",
                             r.error.evalue), r.error.evalue
        assert any(f"*** JOB {job} ON" in r.error.evalue and "CANCELLED AT" in r.error.evalue
                   for r in result.tasks.values())
    print(f"cancelled job ended the cell {latency:.1f}s after scancel")


def test_a_node_that_dies_while_a_cell_runs_is_a_crashed_task(
        slurm: slurm_cluster.SlurmCluster) -> None:
    node = slurm.nodes[1]
    with Cluster(workers=2, launcher="slurm", preload=(),
                 launcher_options={"sbatch_args": ["--nodes=2"],
                                   "progress": lambda _: None}) as c:
        on_node = next(str(t) for t, rt in c.tasks.items() if rt.host == node)
        killed: list[float] = []

        def kill() -> None:
            wait_for(lambda: all(rt.state.value == "busy" for rt in c.tasks.values()), 10,
                     "the cell running")
            killed.append(time.monotonic())
            slurm.kill_node(node)  # slurmd, the job step and the worker at once

        threading.Thread(target=kill, daemon=True).start()
        try:
            result = c.run("import time\ntime.sleep(60)", timeout=40)
        finally:
            slurm.restart_slurmd(node)  # the node comes back (empty), so the job can end
        latency = time.monotonic() - killed[0]
        r = result.tasks[on_node]
        assert r.status == "crashed", result.summary()
        assert f"on node {node}, while SLURM job {c.launcher.job.id}" in r.error.evalue
    assert latency < 5, latency
    print(f"dead node seen {latency:.1f}s after")


def test_a_job_that_hits_its_time_limit_ends_the_running_cell_in_slurms_words(
        slurm: slurm_cluster.SlurmCluster) -> None:
    """SLURM itself ends the job (slurmctld's time-limit sweep, at most ~30 s after the limit
    passed): the cell ends with TIMEOUT and SLURM's "TIME LIMIT" line, not a cell timeout."""
    with Cluster(workers=2, launcher="slurm", preload=(),
                 launcher_options={"sbatch_args": ["--nodes=2"],
                                   "progress": lambda _: None}) as c:
        job = c.launcher.job.id
        limited: list[float] = []

        def limit() -> None:
            wait_for(lambda: all(rt.state.value == "busy" for rt in c.tasks.values()), 10,
                     "the cell running")
            limited.append(time.monotonic())
            slurm.tool("scontrol", "update", f"JobId={job}", "TimeLimit=0")

        threading.Thread(target=limit, daemon=True).start()
        result = c.run("import time\ntime.sleep(90)", timeout=80)
        latency = time.monotonic() - limited[0]
        assert latency < 40, latency
        for r in result.tasks.values():
            assert r.status == "crashed", result.summary()
            assert re.search(rf"ended with its job: SLURM job {job} (TIMEOUT|COMPLETING)",
                             r.error.evalue), r.error.evalue
        assert any("TIME LIMIT" in r.error.evalue or "reached its time limit" in r.error.evalue
                   for r in result.tasks.values()), result.summary()
    print(f"time limit ended the cell {latency:.1f}s after it was set")


def test_the_slurm_launcher_keeps_the_launcher_contract(
        slurm: slurm_cluster.SlurmCluster) -> None:
    with Cluster(workers=2, launcher="slurm", preload=(),
                 launcher_options={"sbatch_args": ["--nodes=2"]}) as c:
        check_launcher_contract(c)
