"""GPU placement (docs/reference.md, GPUs): which GPUs each task gets, said once, in status().

This machine has no GPU: NVML is tests/fake_nvml.py, put where the controller imports
``pynvml`` (a stand-in at the module boundary). Most tests only make a ``Cluster`` (its plan is
made then, before any start); the two marked cluster run real kernels.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from tests.fake_nvml import FakeGpu, FakeMig, FakeNvml
from tests.gpu_here import visible_nvml_gpus
from tests.support.processes import wait_for, worker_kernels
from tfdist_nb import Cluster, current
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.cluster.views import status_frame
from tfdist_nb.display.compact import grid_rows
from tfdist_nb.errors import ClusterStartError, SpecError
from tfdist_nb.gpu_plan import CVD, GROWTH, NoteKind, Placement, gpu_request, plan_gpus
from tfdist_nb.launchers import forkserver
from tfdist_nb.launchers.kernel_key import import_time
from tfdist_nb.launchers.ssh import SSHLauncher
from tfdist_nb.magics.request import ClusterRequest, PlanAction, Running, plan
from tfdist_nb.store.snapshot import ClusterSnapshot, TaskSnapshot
from tfdist_nb.store.state import state_doc
from tfdist_nb.store.tails import LiveStore
from tfdist_nb.topology import ClusterSpec, TaskId
from tfdist_nb.worker.gpu import GpuSampler

W = [TaskId("worker", i) for i in range(8)]


def nvml(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml) -> FakeNvml:
    """``fake`` is what ``import pynvml`` gives the controller (and nothing CUDA-ish is set)."""
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv(CVD, raising=False)
    return fake


def given(c: Cluster) -> list[str | None]:
    """Each task's CUDA_VISIBLE_DEVICES as its environment will have it (None: not placed)."""
    return [c.gpu_plan.env(t).get(CVD) for t in c.spec.tasks]


# ---------------------------------------------------------------------- the default: auto
EXPECTED = {  # (tasks, GPUs) -> each worker's CUDA_VISIBLE_DEVICES
    (2, 1): ["0", "0"], (2, 2): ["0", "1"], (2, 8): ["0,1,2,3", "4,5,6,7"],
    (4, 1): ["0"] * 4, (4, 2): ["0", "1", "0", "1"], (4, 8): ["0,1", "2,3", "4,5", "6,7"],
    (8, 1): ["0"] * 8, (8, 2): ["0", "1"] * 4, (8, 8): [str(i) for i in range(8)],
}


@pytest.mark.parametrize(("tasks", "gpus"), sorted(EXPECTED))
def test_workers_get_disjoint_contiguous_shares_or_take_turns(
        monkeypatch: pytest.MonkeyPatch, tasks: int, gpus: int) -> None:
    nvml(monkeypatch, FakeNvml(count=gpus))
    c = Cluster(workers=tasks)
    assert given(c) == EXPECTED[(tasks, gpus)]
    shared = tasks > gpus
    assert c.gpu_plan.shared is shared
    growth = {c.gpu_plan.env(t).get(GROWTH) for t in c.spec.tasks}
    assert growth == ({"true"} if shared else {None})
    line = c.gpu_plan.line or ""
    assert line.startswith("GPUs: worker:0 ")  # where each task's GPUs are, said once
    assert line.count("NCCL") == (1 if shared else 0)  # the sharing caveat, once
    assert c.gpu_plan.level == ("WARNING" if shared else "INFO")


def test_ps_tasks_get_no_gpu_and_a_leftover_gpu_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml(monkeypatch, FakeNvml(count=4))
    c = Cluster(workers=2, ps=1, chief=True)
    assert dict(zip(map(str, c.spec.tasks), given(c), strict=True)) == {
        "chief:0": "0", "worker:0": "1", "worker:1": "2", "ps:0": ""}
    assert [n.kind for n in c.gpu_plan.notes] == [NoteKind.ASSIGNED, NoteKind.UNUSED]
    assert "GPU(s) 3 left unused (4 for 3 task(s))" in (c.gpu_plan.line or "")


def test_gpus_per_task_asks_that_many_each(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml(monkeypatch, FakeNvml(count=8))
    assert given(Cluster(workers=2, gpus_per_task=3)) == ["0,1,2", "3,4,5"]
    shared = Cluster(workers=3, gpus_per_task=4)  # two groups of 4 for three tasks
    assert given(shared) == ["0,1,2,3", "4,5,6,7", "0,1,2,3"] and shared.gpu_plan.shared


# ---------------------------------------------------------------------- the notebook's own set
def test_the_notebooks_cuda_visible_devices_is_honoured_in_every_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = nvml(monkeypatch, FakeNvml(gpus=[FakeGpu(i, uuid=f"GPU-{i}aaa{i}-1111-2222")
                                            for i in range(4)]))
    monkeypatch.setenv(CVD, "2,3")  # indices: each task gets a host index
    assert given(Cluster(workers=2)) == ["2", "3"]
    monkeypatch.setenv(CVD, "3,1,9,0")  # CUDA stops at the first entry naming no device
    assert given(Cluster(workers=2)) == ["3", "1"]
    monkeypatch.setenv(CVD, f"{fake.gpus[3].uuid},GPU-1aa")  # a UUID and a unique prefix
    assert given(Cluster(workers=2)) == [fake.gpus[3].uuid, fake.gpus[1].uuid]
    monkeypatch.setenv(CVD, "")  # the notebook sees none: nothing to place
    assert given(Cluster(workers=2)) == [None, None]


def test_mig_instances_are_placed_by_their_uuids(monkeypatch: pytest.MonkeyPatch) -> None:
    migs = [FakeMig("MIG-aaaa-0001"), FakeMig("MIG-aaaa-0002"), FakeMig("MIG-bbbb-0003")]
    nvml(monkeypatch, FakeNvml(gpus=[FakeGpu(0, migs=migs), FakeGpu(1)]))
    assert given(Cluster(workers=4)) == [m.uuid for m in migs] + [
        "GPU-00000001-fake-4000-8000-000000000001"]
    monkeypatch.setenv(CVD, "MIG-bbbb")  # one instance, by a prefix of its UUID
    assert given(Cluster(workers=2)) == ["MIG-bbbb-0003"] * 2


def test_a_task_samples_the_gpus_its_uuid_or_mig_entries_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker side maps CUDA_VISIBLE_DEVICES onto NVML by UUID too (it used to keep every
    GPU when the variable held UUIDs)."""
    fake = FakeNvml(gpus=[FakeGpu(0), FakeGpu(1), FakeGpu(2, migs=[FakeMig("MIG-cc-1")])])
    monkeypatch.setenv(CVD, fake.gpus[1].uuid[:12])
    assert [g["index"] for g in GpuSampler(fake).sample() or []] == [1]
    monkeypatch.setenv(CVD, "MIG-cc-1")
    [mig] = GpuSampler(fake).sample() or []
    assert mig["index"] == 2 and mig["mem_total_mb"] == 20_000.0  # the instance's own memory
    monkeypatch.setenv(CVD, "GPU-nothing-like-it")
    sampler = GpuSampler(fake)
    assert sampler.sample() is None and "none visible" in (sampler.reason or "")


# ---------------------------------------------------------------------- what the user says
def test_cuda_visible_devices_from_env_wins_and_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml(monkeypatch, FakeNvml(count=4))
    c = Cluster(workers=2, env={CVD: "3"}, gpus="0,1")
    assert given(c) == [None, None] and c.extra_env[CVD] == "3"
    assert [n.kind for n in c.gpu_plan.notes] == [NoteKind.ENV_WINS]
    assert c.gpu_plan.line == (f"{CVD}='3' from --env: every task starts with it, --gpus is "
                               "not applied")


def test_gpus_none_hides_every_gpu_with_or_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml(monkeypatch, FakeNvml(count=2))
    assert given(Cluster(workers=2, ps=1, gpus="none")) == ["", "", ""]
    nvml(monkeypatch, FakeNvml(fail_init=True))
    c = Cluster(workers=2, gpus="none")
    assert given(c) == ["", ""] and "--gpus none" in (c.gpu_plan.line or "")


def test_a_list_nvml_cannot_see_is_used_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml(monkeypatch, FakeNvml(count=2))
    seen = Cluster(workers=2, gpus=[0, 1])
    assert given(seen) == ["0", "1"] and seen.gpu_plan.level == "INFO"
    c = Cluster(workers=2, gpus=[1, 5])
    assert given(c) == ["1", "5"]
    [unseen] = [n for n in c.gpu_plan.notes if n.kind is NoteKind.UNSEEN]
    assert unseen.level == "WARNING" and unseen.text.startswith("--gpus 5: NVML does not see")
    nvml(monkeypatch, FakeNvml(fail_init=True))  # no NVML at all: still used
    c = Cluster(workers=2, gpus="GPU-abc,GPU-def")
    assert given(c) == ["GPU-abc", "GPU-def"]
    assert "--gpus GPU-abc,GPU-def: NVML is not available here; used as given" in (
        c.gpu_plan.line or "")


def test_no_nvml_places_nothing_and_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml(monkeypatch, FakeNvml(fail_init=True))
    c = Cluster(workers=2, ps=1)
    assert given(c) == [None, None, None] and c.gpu_plan.line is None
    nvml(monkeypatch, FakeNvml(count=0))  # NVML without a device: the same
    assert Cluster(workers=2).gpu_plan.line is None
    monkeypatch.delitem(sys.modules, "pynvml")  # the real module, on what this machine has
    if not visible_nvml_gpus():
        assert Cluster(workers=2).gpu_plan.line is None
    # asked for a count it cannot give: that is said
    nvml(monkeypatch, FakeNvml(fail_init=True))
    said = Cluster(workers=2, gpus_per_task=1).gpu_plan
    assert [n.kind for n in said.notes] == [NoteKind.NOT_PLACED] and not said.tasks


BAD = [
    ("--gpus 0,0", "lists GPU 0 twice"),
    ("--gpus x", "'x' is not a GPU: give indices (0, 1, ...) or UUIDs"),
    ("--gpus -3", "'-3' is not a GPU"),
    ("--gpus 0,1 --gpus-per-task 3", "--gpus-per-task 3 is more than the 2 GPU(s) of --gpus 0,1"),
    ("--gpus-per-task 3", "--gpus-per-task 3 is more than the 2 GPU(s) the notebook sees here "
                          "(0, 1)"),
    ("--gpus-per-task 0", "--gpus-per-task takes a positive number of GPUs, got 0"),
    ("--gpus-per-task -2", "--gpus-per-task takes a positive number of GPUs, got -2"),
    ("--gpus none --gpus-per-task 1", "asks for GPUs and hides them"),
]


@pytest.fixture(scope="module")
def ip() -> Iterator[Any]:
    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("tfdist_nb")
    yield shell
    shell.extension_manager.unload_extension("tfdist_nb")


@pytest.mark.parametrize(("line", "words"), BAD)
def test_bad_gpu_options_are_usage_errors_with_an_example_and_start_nothing(
        ip: Any, monkeypatch: pytest.MonkeyPatch, line: str, words: str) -> None:
    nvml(monkeypatch, FakeNvml(count=2))
    before = worker_kernels()
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("tfcluster", f"2 workers {line}")
    assert words in str(info.value) and "e.g. --gpus 0,1" in str(info.value)
    assert current() is None and worker_kernels() == before


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"gpus": [0, 0]}, "twice"), ({"gpus": "x"}, "not a GPU"), ({"gpus": [-3]}, "not a GPU"),
    ({"gpus": []}, "at least one GPU"), ({"gpus": 1}, "takes 'auto', 'none' or a list"),
    ({"gpus_per_task": 0}, "positive"), ({"gpus_per_task": True}, "positive")])
def test_the_api_refuses_the_same_before_anything(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError, match=words):
        Cluster(workers=2, **kwargs)


def test_a_changed_gpus_flag_replaces_the_cluster_and_a_resize_keeps_it() -> None:
    running = Running(spec=ClusterSpec(workers=2), gpus=gpu_request("0,1"))
    assert plan(ClusterRequest(ClusterSpec(workers=2)), running).action is PlanAction.REUSE
    changed = plan(ClusterRequest(ClusterSpec(workers=2), gpus="none"), running)
    assert changed.action is PlanAction.REPLACE and "--gpus" in (changed.message or "")
    resized = plan(ClusterRequest(ClusterSpec(workers=4)), running)
    assert resized.new is not None and resized.new.gpus == gpu_request("0,1")
    per = plan(ClusterRequest(ClusterSpec(workers=2), gpus_per_task=1), running)
    assert per.new is not None and per.new.gpus == gpu_request("0,1", 1)


# ---------------------------------------------------------------------- other launchers
def test_ssh_places_per_host_by_the_count_given(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml(monkeypatch, FakeNvml(count=8))  # this host's GPUs are not the hosts'
    c = Cluster(workers=4, launcher="ssh", hosts=["h1", "h2"], gpus_per_task=2)
    assert given(c) == ["0,1", "0,1", "2,3", "2,3"]  # worker:0,2 on h1; worker:1,3 on h2
    assert Cluster(workers=4, launcher="ssh", hosts=["h1", "h2"], gpus="5,6").gpu_plan.env(
        W[2]) == {CVD: "6"}
    assert Cluster(workers=2, launcher="ssh", hosts=["h1"]).gpu_plan.line is None  # unknown
    monkeypatch.setenv(CVD, "0")  # the notebook's own GPUs are not sent to the hosts
    assert CVD not in SSHLauncher(hosts=["h1"]).base_environment()


def test_slurm_is_asked_for_a_count_and_keeps_its_own_choice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CVD, "0,1")
    c = Cluster(workers=2, ps=1, launcher="slurm", gpus_per_task=2)
    assert c.launcher.gpus_per_task == 2  # sbatch --gpus-per-task=2 (launchers/slurm.py)
    assert given(c) == [None, None, ""]  # SLURM's CUDA_VISIBLE_DEVICES stays; ps none
    assert CVD not in c.launcher.base_environment()  # nor is the notebook's sent over it
    with pytest.raises(SpecError, match="the scheduler chooses the GPUs"):
        Cluster(workers=2, launcher="slurm", gpus=[0, 1])
    assert plan_gpus(gpu_request(), W[:2], where=Placement.SCHEDULER).line is None


# ---------------------------------------------------------------------- where it is shown
def test_status_the_state_file_and_the_grid_show_each_tasks_gpus() -> None:
    tasks = [TaskRuntime(W[0], "h:1", "{}", env={CVD: "0,1"}),
             TaskRuntime(W[1], "h:2", "{}", env={CVD: "0,1"}, info={"gpus": "2"}),
             TaskRuntime(TaskId("ps", 0), "h:3", "{}", env={})]
    live = LiveStore()
    assert list(status_frame(tasks, live, {})["gpus"]) == ["0,1", "2", ""]
    snap = ClusterSnapshot("c", "2 workers 1 ps", True, "/r", tuple(
        TaskSnapshot(rt.name, rt.task.role, "idle", 1, "h", gpus=rt.gpus) for rt in tasks), ())
    assert [t["gpus"] for t in state_doc(snap, live)["tasks"]] == ["0,1", "2", ""]
    rows = grid_rows([t.name for t in snap.tasks], {t.name: live.view(t.name) for t in snap.tasks},
                     lambda n: ("idle", 1), {}, [], {t.name: t.gpus for t in snap.tasks})
    assert [r["gpus"] for r in rows] == ["0,1", "2", ""]


def test_a_tasks_gpus_are_set_after_the_import_so_spares_and_fork_servers_serve_any_task() -> None:
    assert not import_time(CVD) and not import_time(GROWTH)


# ---------------------------------------------------------------------- real kernels
def libcuda_mapped(pid: int) -> bool:
    return "libcuda" in Path(f"/proc/{pid}/maps").read_text()


READ_ENV = ("import json, os\n"
            f"print(json.dumps([os.environ.get('{CVD}'), os.environ.get('{GROWTH}')]))")


def seen_env(c: Any) -> dict[str, list[str | None]]:
    result = c.run(READ_ENV, timeout=60)
    assert result.ok, result.summary()
    return {name: json.loads(r.stdout) for name, r in result.tasks.items()}


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_real_tasks_get_their_gpus_and_spares_take_theirs_at_adoption(
        ip: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Two real workers on two fake GPUs each start with their own CUDA_VISIBLE_DEVICES; the
    fork server and the spares never loaded CUDA's driver library (a process that initialised
    CUDA cannot fork tasks that use it), the spares start without a task's GPUs, and a cluster
    that takes them over (here, --gpus 0: both share GPU 0) gives them their new set."""
    nvml(monkeypatch, FakeNvml(count=2))
    try:
        ip.run_line_magic("tfcluster", "2 workers --warm --no-dashboard")
        out = capsys.readouterr().out
        assert out.count("tfdist_nb: GPUs: worker:0 0, worker:1 1\n") == 1, out
        c = current()
        assert seen_env(c) == {"worker:0": ["0", None], "worker:1": ["1", None]}
        assert list(c.status()["gpus"]) == ["0", "1"]
        assert json.loads((c.run_dir / "tasks" / "worker-1" / "env.json").read_text())[CVD] == "1"
        servers = [s.pid for s in forkserver.live_servers()]
        assert servers and not any(libcuda_mapped(pid) for pid in servers)
        wait_for(lambda: c.spares()["ready"] >= 2, 90, "two spares warmed")
        spares = set(c.spares()["pids"])
        assert not any(libcuda_mapped(pid) for pid in spares)
        ip.run_line_magic("tfcluster", "2 workers --gpus 0 --warm")
        out = capsys.readouterr().out
        assert "restarting the cluster: --gpus or --gpus-per-task changed" in out, out
        assert "2 task(s) from spare kernels" in out and out.count("NCCL refuses") == 1, out
        c = current()
        assert {rt.pid for rt in c.tasks.values()} == spares
        assert seen_env(c) == {"worker:0": ["0", "true"], "worker:1": ["0", "true"]}
        assert list(c.status()["gpus"]) == ["0", "0"]
    finally:
        with contextlib.suppress(UsageError):
            ip.run_line_magic("tfdist_stop", "")


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_slurm_itself_is_asked_for_gpus_per_task(tmp_path: Path) -> None:
    """A real SLURM (tests/slurm_cluster.py) whose nodes have no GPU refuses the job for what
    it was asked: the request reached sbatch, nothing is left queued."""
    from tests import slurm_cluster

    slurm_cluster.require_available()
    made = slurm_cluster.make_slurm(tmp_path / "slurm", n_nodes=1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SLURM_CONF", str(made.conf))
            c = Cluster(workers=1, launcher="slurm", preload=(), gpus_per_task=1,
                        launcher_options={"progress": lambda _: None})
            with pytest.raises(ClusterStartError, match=r"SLURM refused the job: .*gres.*"
                                                        r"--gpus-per-task=1"):
                c.start()
        assert not made.jobs()
    finally:
        made.remove()


def test_the_exported_launch_script_gives_each_task_its_gpus(tmp_path: Path) -> None:
    """%tfdist_export's launch.sh runs each task with the GPUs the cluster gave it (and the
    growth flag when they shared), unless --env set CUDA_VISIBLE_DEVICES for all. The script
    itself runs here (bash, no kernel, no GPU: the tasks print what they were given)."""
    import subprocess

    from tfdist_nb.cluster.export import export

    spec = ClusterSpec(workers=2)
    task_env = {"worker:0": {CVD: "0"}, "worker:1": {CVD: "1", GROWTH: "true"}}
    out = export(tmp_path / "repro", cluster_id="c1", spec=spec,
                 cells=[{"cell": 1, "code": "x = 1", "targets": ["worker:0", "worker:1"]}],
                 env={}, python=sys.executable, task_env=task_env)
    (out / "train.py").write_text(
        "import os\nprint(os.environ['TFDIST_TASK'], repr(os.environ.get('CUDA_VISIBLE_DEVICES'"
        ")), os.environ.get('TF_FORCE_GPU_ALLOW_GROWTH'))\n")
    ran = subprocess.run(["bash", str(out / "launch.sh")], capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert "[worker:0] worker:0 '0' None" in ran.stdout.splitlines()
    assert "[worker:1] worker:1 '1' true" in ran.stdout.splitlines()
    # --env CUDA_VISIBLE_DEVICES wins over the placement, for every task
    out = export(tmp_path / "repro2", cluster_id="c1", spec=spec, cells=[], python=sys.executable,
                 env={CVD: "3"}, task_env=task_env)
    (out / "train.py").write_text((tmp_path / "repro" / "train.py").read_text())
    ran = subprocess.run(["bash", str(out / "launch.sh")], capture_output=True, text=True,
                         timeout=60)
    assert {"[worker:0] worker:0 '3' None", "[worker:1] worker:1 '3' true"} <= set(
        ran.stdout.splitlines()), ran.stdout
