"""Attaching to workers that a scheduler started: here a subprocess plays ``srun``.

The scheduler starts ``python -m tfdist_nb.worker --task worker:i --connection-dir DIR`` for each
task and waits for them, as SLURM would; the controller only reads DIR.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.cells import cell
from tests.support.contract import check_launcher_contract
from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.errors import ClusterStartError, TfdistError
from tfdist_nb.portpick import draw

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

SCHEDULER = textwrap.dedent("""
    import json, os, subprocess, sys
    n, directory, tf_config = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    procs = []
    for i in range(n):
        env = dict(os.environ)
        if tf_config != "-":
            cfg = json.loads(tf_config)
            env["TF_CONFIG"] = json.dumps({**cfg, "task": {"type": "worker", "index": i}})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tfdist_nb.worker", "--task", f"worker:{i}",
             "--connection-dir", directory, "--tf-host", "localhost"], env=env))
    codes = [p.wait() for p in procs]
    print("scheduler: workers exited", codes, flush=True)
""")


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[tuple[Path, list[subprocess.Popen[str]]]]:
    started: list[subprocess.Popen[str]] = []
    directory = tmp_path / "connect"
    yield directory, started
    for proc in started:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
        proc.wait(10)


def start_workers(where: tuple[Path, list[subprocess.Popen[str]]], n: int,
                  tf_config: dict | None = None) -> subprocess.Popen[str]:
    directory, started = where
    proc = subprocess.Popen([sys.executable, "-c", SCHEDULER, str(n), str(directory),
                             json.dumps(tf_config) if tf_config else "-"],
                            stdout=subprocess.PIPE, text=True)
    started.append(proc)
    return proc


def test_attach_trains_mwms_and_stop_ends_the_scheduler_job(
        scheduler: tuple[Path, list[subprocess.Popen[str]]]) -> None:
    job = start_workers(scheduler, 2)
    directory = scheduler[0]
    with Cluster(workers=2, launcher="attach",
                 launcher_options={"connection_dir": directory}) as c:
        assert directory.stat().st_mode & 0o777 == 0o700
        for f in directory.glob("*.json"):
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        info = json.loads((directory / "worker-0.json").read_text())
        assert info["ip"] == "127.0.0.1" and info["curve_secretkey"]  # loopback and encrypted
        pids = {str(t): rt.pid for t, rt in c.tasks.items()}
        workers = {p.pid for p in psutil.Process(job.pid).children()}
        assert set(pids.values()) == workers  # the scheduler's processes, not new ones

        result = c.run(cell("mwms_loop"), timeout=150)
        assert result.ok, result.summary()
        for r in result.tasks.values():
            assert "replicas in sync: 2" in r.stdout
        addresses = {str(t): rt.address for t, rt in c.tasks.items()}
        cfg = c.run("import os, json\nprint(json.loads(os.environ['TF_CONFIG'])['task'])")
        assert "'index': 1" in cfg.tasks["worker:1"].stdout
        assert all(a.startswith("localhost:") for a in addresses.values())
        assert set(c.stacks()) == {"worker:0", "worker:1"}
        with pytest.raises(TfdistError, match="cannot restart"):
            c.restart()
    out, _ = job.communicate(timeout=30)
    assert "scheduler: workers exited" in out
    assert not list(directory.glob("*.json"))  # nothing left for the next attach to trip on


def test_attach_keeps_a_tf_config_the_scheduler_set(
        scheduler: tuple[Path, list[subprocess.Popen[str]]]) -> None:
    ports = draw(2)
    cfg = {"cluster": {"worker": [f"localhost:{p}" for p in ports]}}
    start_workers(scheduler, 2, tf_config=cfg)
    with Cluster(workers=2, launcher="attach", preload=(),
                 launcher_options={"connection_dir": scheduler[0]}) as c:
        assert [rt.address for rt in c.tasks.values()] == cfg["cluster"]["worker"]


def test_a_crashed_attached_worker_is_reported(
        scheduler: tuple[Path, list[subprocess.Popen[str]]]) -> None:
    start_workers(scheduler, 1)
    with Cluster(workers=1, launcher="attach", preload=(),
                 launcher_options={"connection_dir": scheduler[0]}) as c:
        started = time.monotonic()
        res = c.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        assert time.monotonic() - started < 10
        r = res.tasks["worker:0"]
        assert r.status == "crashed" and "is gone" in r.error.evalue


def test_attach_names_the_missing_task_within_its_timeout(
        scheduler: tuple[Path, list[subprocess.Popen[str]]]) -> None:
    start_workers(scheduler, 1)  # the job was asked for 2 workers; one never came up
    wait_for(lambda: (scheduler[0] / "worker-0.tfdist.json").exists(), 60, "worker:0")
    started = time.monotonic()
    c = Cluster(workers=2, launcher="attach", preload=(),
                launcher_options={"connection_dir": scheduler[0], "wait_timeout": 3})
    with pytest.raises(ClusterStartError, match=r"no attached worker for worker:1 .* "
                                                r"python -m tfdist_nb.worker --task worker:1"):
        c.start()
    assert time.monotonic() - started < 15


def test_attach_without_a_connection_dir_is_a_usage_error() -> None:
    from tfdist_nb.errors import SpecError

    with pytest.raises(SpecError, match="connection_dir"):
        Cluster(workers=1, launcher="attach")
    assert os.environ.get("TF_CONFIG") is None


def test_attach_from_the_magic(scheduler: tuple[Path, list[subprocess.Popen[str]]],
                               tmp_path: Path) -> None:
    from tests.notebooks import cell_text, run_notebook

    job = start_workers(scheduler, 2)
    workers = wait_for(lambda: len(kids := psutil.Process(job.pid).children()) == 2 and
                       sorted(k.pid for k in kids), 30, "the scheduler's two workers")
    nb = run_notebook([
        "%load_ext tfdist_nb",
        f"%%tfcluster 2 workers --connection-dir {scheduler[0]} --no-dashboard\n"
        "import os\nprint('pid', os.getpid())",
        "%tfdist_stop",
    ], tmp_path)
    out = cell_text(nb.cells[1])
    assert "(attach)" in out
    assert sorted(int(x) for x in re.findall(r"pid (\d+)", out)) == workers
    assert "scheduler: workers exited" in job.communicate(timeout=30)[0]


def test_the_attach_launcher_keeps_the_launcher_contract(
        scheduler: tuple[Path, list[subprocess.Popen[str]]]) -> None:
    start_workers(scheduler, 2)
    with Cluster(workers=2, launcher="attach", preload=(),
                 launcher_options={"connection_dir": str(scheduler[0])}) as c:
        check_launcher_contract(c)
