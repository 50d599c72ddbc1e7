"""A launcher whose tasks are not processes: each "kernel" is a coroutine in the test process
that speaks the part of the Jupyter messaging protocol the core uses, so lifecycle, spares and
runner logic run in milliseconds without a process (tests/test_core_without_processes.py).

The worker agent's RPC calls (``describe``, ``warm``, ``adopt``, ...) are answered by
:class:`FakeKernel`'s ``agent`` table; a cell's code is a tiny script, one command per line:

- ``print TEXT``: TEXT on stdout;
- ``raise NAME: TEXT``: the cell fails with that error;
- ``sleep S``: takes S seconds (an interrupt ends it with KeyboardInterrupt);
- ``die CODE``: the "process" exits with CODE (negative: killed by that signal);
- ``worker:1> COMMAND``: that task alone runs the command.

It fakes what cannot be real without processes (a kernel); everything above the launcher
interface is the real core. Real kernels are covered by the rest of the suite.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from tfdist_nb.launchers.base import Launcher, StopPath, StopReport, TaskHandle, TaskLaunch
from tfdist_nb.topology import TaskId

_CALL = re.compile(r"\.call\((\".*\")\)$")
_pids = itertools.count(900000)
_wires = itertools.count()


def _wire() -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
    """A channel as an inproc zmq pair (the kernel's end, the client's), so the controller
    reads it as it reads a real kernel's (tfdist_nb/transport/receive.py). No high-water mark:
    the fake kernel sends from the loop that reads, and must never block on a full pipe."""
    ends = [zmq.asyncio.Context.instance().socket(zmq.PAIR) for _ in range(2)]
    address = f"inproc://fake-kernel-{next(_wires)}"
    for end in ends:
        end.sndhwm = end.rcvhwm = end.linger = 0
    ends[0].bind(address)
    ends[1].connect(address)
    return ends[0], ends[1]


class FakeKernel:
    """One task's "kernel": answers on shell/control/iopub queues."""

    def __init__(self, launch: TaskLaunch, behaviour: dict[str, Any]) -> None:
        self.launch = launch
        self.env = dict(launch.env)
        self.session = Session(key=b"fake")
        self.shell, self.shell_client = _wire()
        self.iopub, self.iopub_client = _wire()
        self.control_q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.exit_code: int | None = None
        self.interrupted = asyncio.Event()
        self.behaviour = behaviour
        self.calls: list[str] = []
        self.task = launch.env.get("TFDIST_TASK")
        self.agent: dict[str, Callable[..., Any]] = {
            "describe": self._describe, "warm": lambda **_: {"warm_s": 0.0},
            "adopt": self._adopt,
            "stacks": lambda: {"main": {"kind": "idle"}, "threads": {}, "in_tf": []},
            "abort_collectives": lambda reason: "aborted",
            "set_environment": lambda env: self.env.update(env) or "ok"}

    # -- the agent
    def _describe(self, preload: Sequence[str] = ()) -> dict[str, Any]:
        return {"task": (self.task or "spare:0").split(":"), "keras_flavour": "keras 3",
                "tensorflow": "fake", "port_free": True, "pid": self.launch.task.index}

    def _adopt(self, task: str, set_env: Mapping[str, str], unset_env: Sequence[str],
               log_path: str | None, preload: Sequence[str]) -> dict[str, Any]:
        if self.behaviour.get("adopt_fails"):
            raise RuntimeError("adoption refused")
        for key in unset_env:
            self.env.pop(key, None)
        self.env.update(set_env)
        self.task = task
        return {**self._describe(), "adopted": {"warm_s": 0.0, "low_priority_threads": 0}}

    # -- the protocol
    def reply(self, socket: zmq.asyncio.Socket, parent: dict[str, Any], kind: str,
              content: dict[str, Any]) -> None:
        if not socket.closed:
            self.session.send(socket, kind, content, parent=parent["header"])

    def status(self, parent: dict[str, Any], state: str) -> None:
        self.reply(self.iopub, parent, "status", {"execution_state": state})

    async def on_shell(self, msg: dict[str, Any]) -> None:
        if self.exit_code is not None:
            return
        if msg["msg_type"] == "kernel_info_request":  # it runs subshells, as ipykernel 7 does
            self.status(msg, "busy")
            self.reply(self.shell, msg, "kernel_info_reply",
                       {"supported_features": ["kernel subshells"]})
            self.status(msg, "idle")
            return
        content = msg["content"]
        self.status(msg, "busy")
        expressions = content.get("user_expressions") or {}
        if "out" in expressions:
            await self._rpc(msg, expressions["out"])
        else:
            await self._cell(msg, content["code"])
        if self.exit_code is None:
            self.status(msg, "idle")

    async def _rpc(self, msg: dict[str, Any], expr: str) -> None:
        request = json.loads(json.loads(_CALL.search(expr).group(1)))  # type: ignore[union-attr]
        self.calls.append(request["op"])
        delay = self.behaviour.get(f"{request['op']}_s", 0.0)
        if delay:
            await asyncio.sleep(delay)
        try:
            out = {"status": "ok", "data": {"application/json": {
                "result": self.agent[request["op"]](**request["args"])}}}
        except Exception as exc:
            out = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc)}
        self.reply(self.shell, msg, "execute_reply",
                   {"status": "ok", "user_expressions": {"out": out}})

    async def _cell(self, msg: dict[str, Any], code: str) -> None:
        for line in code.splitlines():
            who, sep, only = line.partition("> ")
            if sep and who != self.task:
                continue  # "worker:1> die -9": a line for one task only
            word, _, rest = (only if sep else line).strip().partition(" ")
            if word == "print":
                self.reply(self.iopub, msg, "stream", {"name": "stdout", "text": rest + "\n"})
            elif word == "raise":
                name, _, text = rest.partition(": ")
                self._error(msg, name, text)
                return
            elif word == "sleep":
                self.interrupted.clear()
                try:
                    await asyncio.wait_for(self.interrupted.wait(), float(rest))
                except asyncio.TimeoutError:
                    continue
                self._error(msg, "KeyboardInterrupt", "")
                return
            elif word == "die":
                self.exit_code = int(rest)
                return
        self.reply(self.shell, msg, "execute_reply", {"status": "ok"})

    def _error(self, msg: dict[str, Any], name: str, text: str) -> None:
        content = {"ename": name, "evalue": text, "traceback": [f"{name}: {text}"]}
        self.reply(self.iopub, msg, "error", content)
        self.reply(self.shell, msg, "execute_reply", {"status": "error", **content})

    async def on_control(self, msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "create_subshell_request" and self.exit_code is None:
            self.control_q.put_nowait(self.session.msg(
                "create_subshell_reply", {"subshell_id": "sub-1"}, parent=msg["header"]))

    def close(self) -> None:
        for socket in (self.shell, self.shell_client, self.iopub, self.iopub_client):
            socket.close()


class _Channel:
    def __init__(self, handler: Callable[[dict[str, Any]], Any] | None,
                 socket: zmq.asyncio.Socket | None = None) -> None:
        self.handler = handler
        self.socket = socket

    def send(self, msg: dict[str, Any]) -> None:
        asyncio.get_running_loop().create_task(self.handler(msg))  # type: ignore[misc]


class FakeClient:
    """The slice of ``AsyncKernelClient`` that ``KernelChannel`` uses."""

    def __init__(self, kernel: FakeKernel) -> None:
        self.kernel = kernel
        self.session = kernel.session
        self.shell_channel = _Channel(kernel.on_shell, kernel.shell_client)
        self.iopub_channel = _Channel(None, kernel.iopub_client)
        self.control_channel = _Channel(kernel.on_control)

    parent = None  # no KernelManager: alive while the fake task has not ended

    def start_channels(self, hb: bool = True) -> None:
        pass

    async def is_alive(self) -> bool:
        return self.kernel.exit_code is None

    def stop_channels(self) -> None:
        self.kernel.close()

    async def get_shell_msg(self) -> dict[str, Any]:
        frames = await self.kernel.shell_client.recv_multipart()
        return self.session.deserialize(self.session.feed_identities(frames)[1])

    async def get_iopub_msg(self) -> dict[str, Any]:
        frames = await self.kernel.iopub_client.recv_multipart()
        return self.session.deserialize(self.session.feed_identities(frames)[1])

    async def get_control_msg(self, timeout: float) -> dict[str, Any]:
        return await asyncio.wait_for(self.kernel.control_q.get(), timeout)


class FakeHandle(TaskHandle):
    def __init__(self, task: TaskId, kernel: FakeKernel) -> None:
        super().__init__(task=task, host="localhost", pid=next(_pids), client=FakeClient(kernel))
        self.kernel = kernel

    async def poll(self) -> int | None:
        return self.kernel.exit_code

    async def interrupt(self) -> None:
        self.kernel.interrupted.set()

    async def stop(self, grace_s: float) -> StopReport:
        self.close_channels()
        path = StopPath.ALREADY_DEAD if self.kernel.exit_code is not None else StopPath.REQUEST
        if self.kernel.exit_code is None:
            self.kernel.exit_code = 0
        return StopReport(str(self.task), path, self.kernel.exit_code, 0.0)


class FakeLauncher(Launcher):
    """Starts :class:`FakeKernel` tasks. ``behaviour``: per task name (``worker:1``, or
    ``spare`` for every spare), what its kernel does (see FakeKernel); ``start_fails``: task
    names whose start raises (a launcher error), each entry used once."""

    name = "fake"

    def __init__(self, behaviour: dict[str, dict[str, Any]] | None = None,
                 start_fails: Sequence[str] = ()) -> None:
        self.behaviour = behaviour or {}
        self.start_fails = list(start_fails)
        self.kernels: list[FakeKernel] = []
        self._ports = itertools.count(20000)

    @property
    def spares(self) -> bool:
        return True

    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        return {t: f"localhost:{next(self._ports)}" for t in tasks}

    async def start(self, launch: TaskLaunch) -> TaskHandle:
        name = str(launch.task) if launch.task.role != "spare" else "spare"
        if name in self.start_fails:
            self.start_fails.remove(name)
            raise OSError(f"could not start {name}")
        kernel = FakeKernel(launch, self.behaviour.get(name, {}))
        self.kernels.append(kernel)
        return FakeHandle(launch.task, kernel)
