"""The controller SIGKILLed (the notebook's kernel killed, out of memory or by hand): every task
ends, with what its cells started, and leaves no connection file, socket or private network."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.processes import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

CONTROLLER = r"""
import json, sys, time
from pathlib import Path
from tfdist_nb import Cluster
from tfdist_nb.launchers import private_net

c = Cluster(workers=2, run_dir=sys.argv[1], warm=False).start()
r = c.run("import subprocess\np = subprocess.Popen(['sleep', '3131'])\nprint(p.pid)")
assert r.ok, r.summary()
files = []
for conn in Path(c.run_dir).glob("tasks/*/kernel-connection.json"):
    info = json.loads(conn.read_text())
    files.append(str(conn))
    files += [f"{info['ip']}-{info[k]}" for k in
              ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")]
net = private_net._shared
print(json.dumps({"kernels": [rt.pid for rt in c.tasks.values()],
                  "children": [int(t.stdout.split()[-1]) for t in r.tasks.values()],
                  "files": files,
                  "network": [p.pid for p in (net.holder, net.slirp) if p] if net else []}),
      flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_killed_controller_leaves_no_process_file_or_socket(tmp_path: Path) -> None:
    # a run directory too deep for a socket path: the sockets go to a private temp directory
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(deep)],
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = controller.stdout.readline()  # type: ignore[union-attr]
        assert line, "the controller printed nothing"
        seen = json.loads(line)
    finally:
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
    pids = seen["kernels"] + seen["children"] + seen["network"]
    assert len(seen["kernels"]) == len(seen["children"]) == 2
    scratch = {str(Path(f).parent) for f in seen["files"] if "/tfdist-" in f}
    assert len(scratch) == 2  # one private socket directory per task
    wait_for(lambda: not any(alive(p) for p in pids), 15,
             "the tasks, what their cells started and the private network to end")
    wait_for(lambda: not any(os.path.lexists(f) for f in seen["files"]), 5,
             "the connection files and sockets to be removed")
    assert not any(os.path.exists(d) for d in scratch)
