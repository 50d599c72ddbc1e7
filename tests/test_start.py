"""Starting clusters: ParameterServerStrategy roles, TF port clashes, another worker interpreter."""

from __future__ import annotations

import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cells import cell
from tfdist_nb import Cluster
from tfdist_nb.errors import ClusterStartError
from tfdist_nb.launchers.local import LocalLauncher
from tfdist_nb.topology import TaskId

pytestmark = pytest.mark.cluster


def test_parameter_server_cluster_serves_and_runs_on_the_chief() -> None:
    with Cluster(workers=2, ps=1, chief=True) as c:
        assert [str(t) for t in c.tasks] == ["chief:0", "worker:0", "worker:1", "ps:0"]
        result = c.run(cell("ps_strategy"), timeout=120)
        assert list(result.tasks) == ["chief:0"]  # bodies run on the chief by default
        assert result.ok, result.summary()
        out = result.tasks["chief:0"].stdout
        assert "variables on /job:ps/replica:0/task:0" in out and "counter = 10.0" in out
        # the ps and worker kernels stay usable while they serve
        others = c.run("import tfdist_nb.worker as tw; print(tw.task)", on="worker:1,ps:0")
        assert others.ok and "('ps', 0)" in others.tasks["ps:0"].stdout
        served = c.logs(grep="serving ParameterServerStrategy")
        assert sorted(served["task"]) == ["ps:0", "worker:0", "worker:1"]


def test_a_tf_port_taken_before_start_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = socket.socket()
    blocker.bind(("0.0.0.0", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    calls: list[int] = []
    real = LocalLauncher.tf_addresses

    def first_gets_a_taken_port(self: LocalLauncher, tasks: Any, avoid: Any = None) -> Any:
        calls.append(1)
        if len(calls) == 1:
            return {t: f"localhost:{taken}" for t in tasks}
        return real(self, tasks, avoid)

    monkeypatch.setattr(LocalLauncher, "tf_addresses", first_gets_a_taken_port)
    try:
        # the host's network: in the private one (the default where it can be made) a port
        # another program holds on the host is no clash at all
        with Cluster(workers=1, preload=(), launcher_options={"net": "host"}) as c:
            rt = c.tasks[TaskId("worker", 0)]
            assert rt.address != f"localhost:{taken}"
            assert len(calls) == 2
            assert rt.info["port_free"] is True
            warning = c.logs(grep="was taken before start")
            assert list(warning["level"]) == ["WARNING"]
    finally:
        blocker.close()


def test_another_worker_interpreter(tmp_path: Path) -> None:
    """Workers on another interpreter: a venv of its own (its own ``sys.prefix``) that sees the
    packages of the interpreter running this suite through a .pth file in its site-packages.
    (``--system-site-packages`` would show it the *base* interpreter's packages, which lack
    ipykernel when the suite itself runs in a venv.)"""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    site_dir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, timeout=60, capture_output=True, text=True).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site_dir) / "suite-packages.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
    with Cluster(workers=1, python=str(python), preload=()) as c:
        (task,) = c.tasks.values()
        assert Path(task.info["executable"]) == python
        result = c.run("import sys; print(sys.prefix)")
        assert result.tasks["worker:0"].stdout.strip() == str(venv)


def test_a_worker_that_cannot_start_fails_cleanly(tmp_path: Path) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'this interpreter is broken' >&2\nexit 3\n")
    broken.chmod(0o755)
    c = Cluster(workers=2, python=str(broken), preload=(), start_timeout=20)
    with pytest.raises(ClusterStartError) as info:
        c.start()
    message = str(info.value)
    assert "failed to start" in message and "this interpreter is broken" in message
    assert not c.running


def test_a_worker_dying_during_start_up_fails_at_once(tmp_path: Path) -> None:
    """The kernel comes up, then dies while importing the preload: no wait for the timeout."""
    (tmp_path / "die_on_import.py").write_text("import os, signal\n"
                                               "os.kill(os.getpid(), signal.SIGKILL)\n")
    c = Cluster(workers=2, preload=("die_on_import",), start_timeout=120,
                env={"PYTHONPATH": str(tmp_path)})
    started = time.monotonic()
    with pytest.raises(ClusterStartError, match="killed by SIGKILL while starting"):
        c.start()
    assert time.monotonic() - started < 30
    assert not c.running


def test_the_parameter_server_tutorials_model_fit_trains_with_its_callbacks() -> None:
    # the step timer tfdist_nb adds to every fit is a batch-level callback, which
    # ParameterServerStrategy refuses unless it accepts RemoteValue logs
    with Cluster(workers=2, ps=1, chief=True, env={"TF_USE_LEGACY_KERAS": "1"}) as c:
        result = c.run(cell("ps_fit_tutorial"), timeout=300)
        assert result.ok, result.summary()
        out = result.tasks["chief:0"].stdout
        # 3 epochs of 20 steps, scheduled 10 at a time: 6 timed executions, checkpoint written
        assert "epochs 3 timed 6 checkpoint True" in out, out[-2000:]
        assert not [a for a in c.alerts() if "chief:0" in a and "straggler" in a]
