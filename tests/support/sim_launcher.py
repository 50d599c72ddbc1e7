"""A launcher of simulated tasks (:mod:`tests.support.simulated_task`): ``per_process`` of them
share one OS process, so 1,024 tasks run on a 2-core machine, while the controller talks to each
through the same jupyter_client ``AsyncKernelClient`` and signed zmq channels as to a real kernel.

A simulated task's pid is made up (above any real pid, so no check of this host's processes
finds it) and its host is ``simulated``; interrupt and kill go to its process as commands.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from jupyter_client.asynchronous import AsyncKernelClient

from tfdist_nb.launchers.base import Launcher, StopPath, StopReport, TaskHandle, TaskLaunch
from tfdist_nb.topology import TaskId

_pids = itertools.count(5_000_000)  # above Linux's pid_max: never a real process
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0


class SimHost:
    """One OS process serving simulated tasks; its events are read by a thread."""

    def __init__(self, env: Mapping[str, str] | None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.simulated_task"], cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)})
        self.exits: dict[str, int] = {}
        self.waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}
        self.count = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            event = json.loads(line)
            key = event.get("started") or event.get("exit") or event.get("failed")
            if "exit" in event:
                self.exits[event["exit"]] = int(event["code"])
            self._resolve(str(key), event)
        for key in list(self.waiting):  # the process ended: every task of it with it
            self.exits.setdefault(key, self.proc.wait())
            self._resolve(key, {"exit": key})

    def _resolve(self, key: str, event: dict[str, Any]) -> None:
        loop, fut = self.waiting.pop(key, (None, None))
        if loop is not None and fut is not None:
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(event))

    def command(self, cmd: dict[str, Any]) -> None:
        with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()

    async def ask(self, key: str, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self.waiting[key] = (loop, fut)
        self.command(cmd)
        return dict(await asyncio.wait_for(fut, timeout))

    def exit_code(self, key: str) -> int | None:
        code = self.exits.get(key)
        if code is None and self.proc.poll() is not None:
            return self.proc.returncode or -9
        return code

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class SimHandle(TaskHandle):
    def __init__(self, task: TaskId, client: Any, host: SimHost, key: str) -> None:
        super().__init__(task=task, host="simulated", pid=next(_pids), client=client)
        self.sim, self.key = host, key

    async def poll(self) -> int | None:
        return self.sim.exit_code(self.key)

    async def interrupt(self) -> None:
        self.sim.command({"interrupt": self.key})

    async def stop(self, grace_s: float) -> StopReport:
        began = self.close_channels()
        if (code := self.sim.exit_code(self.key)) is not None:
            return StopReport(str(self.task), StopPath.ALREADY_DEAD, code, 0.0)
        await self.sim.ask(self.key, {"kill": self.key, "code": 0}, max(grace_s, 1.0))
        return StopReport(str(self.task), StopPath.REQUEST, 0, time.monotonic() - began)


class SimulatedLauncher(Launcher):
    """Starts simulated tasks, ``per_process`` to an OS process."""

    name = "simulated"

    def __init__(self, per_process: int = 64) -> None:
        self.per_process = per_process
        self.hosts: list[SimHost] = []
        self._ports = itertools.count(30000)
        self._keys = itertools.count()
        self._dir: str | None = None

    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        return {t: f"simulated:{next(self._ports)}" for t in tasks}

    async def start(self, launch: TaskLaunch) -> TaskHandle:
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="tfsim-")
        host = next((h for h in self.hosts if h.count < self.per_process
                     and h.proc.poll() is None), None)
        if host is None:
            host = SimHost(self.base_environment())
            self.hosts.append(host)
        host.count += 1
        key = str(next(self._keys))
        conn = {"transport": "ipc", "ip": f"{self._dir}/{key}", "signature_scheme": "hmac-sha256",
                "key": secrets.token_hex(16), "kernel_name": "tfdist-simulated",
                **{f"{c}_port": i for i, c in enumerate(
                    ("shell", "iopub", "stdin", "control", "hb"), 1)}}
        launch.connection_file.write_text(json.dumps(conn))
        said = await host.ask(key, {"start": {"key": key, "name": str(launch.task),
                                              "connection_file": str(launch.connection_file),
                                              "env": launch.env}}, START_TIMEOUT_S)
        if "failed" in said:
            raise RuntimeError(f"simulated task {launch.task} did not start: {said['why']}")
        client = AsyncKernelClient()
        client.load_connection_info(conn)
        return SimHandle(launch.task, client, host, key)

    def release(self) -> None:
        for host in self.hosts:
            host.close()
        self.hosts = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
