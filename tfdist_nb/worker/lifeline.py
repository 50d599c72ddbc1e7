"""A worker kernel ends with its controller, and takes what it started and left with it.

ipykernel's parent poller ``os._exit``s leaving the cells' children alive and the connection
file (its key inside) and ipc sockets behind; this watch replaces it and, before the exit, kills
the descendants and removes those files (docs/security.md, "Run directories"). ``os._exit``
works while TensorFlow ignores SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

INTERVAL_S = 0.5


def kernel_files(connection_file: str) -> list[Path]:
    """The files a kernel leaves: its connection file, and for the ipc transport its five
    sockets (``<ip>-<port>``)."""
    path = Path(connection_file)
    files = [path]
    with contextlib.suppress(OSError, ValueError):
        info = json.loads(path.read_text())
        if info.get("transport") == "ipc":
            files += [Path(f"{info['ip']}-{info[key]}") for key in
                      ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
                      if key in info]
    return files


def private_socket_dir(files: list[Path]) -> Path | None:
    """The owner-only ``tfdist-*`` directory the controller made for this kernel's sockets in
    the temp directory (a run directory too deep for a socket path), if it did."""
    temp = Path(tempfile.gettempdir()).resolve()
    # the task's own temp dir is a tfdist-task-* inside the one the controller used
    temps = {temp, temp.parent} if temp.name.startswith("tfdist-task-") else {temp}
    for f in files[1:]:
        parent = f.parent
        with contextlib.suppress(OSError):
            if parent.name.startswith("tfdist-") and parent.resolve().parent in temps \
                    and parent.stat().st_uid == os.geteuid():
                return parent
    return None


def end_descendants() -> int:
    """SIGKILL every process this one started (and theirs); how many there were."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.send_signal(signal.SIGKILL)
    return len(children)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ParentWatch(threading.Thread):
    """Ends this kernel when its parent (the controller) is gone."""

    def __init__(self, parent_pid: int, connection_file: str,
                 interval: float = INTERVAL_S) -> None:
        super().__init__(name="tfdist-parent-watch", daemon=True)
        self.parent_pid = parent_pid
        self.connection_file = connection_file
        self.interval = interval

    def run(self) -> None:
        if os.getppid() == self.parent_pid:
            while os.getppid() == self.parent_pid:
                time.sleep(self.interval)
        else:  # ipykernel's rule when the parent named is not the parent: until left to init;
            # also until the one named ends (it may have ended while this kernel started)
            while os.getppid() != 1 and running(self.parent_pid):
                time.sleep(self.interval)
        self.leave()

    def leave(self) -> None:
        files = kernel_files(self.connection_file)
        end_descendants()
        for f in files:
            with contextlib.suppress(OSError):
                f.unlink()
        if (scratch := private_socket_dir(files)) is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        os._exit(1)
