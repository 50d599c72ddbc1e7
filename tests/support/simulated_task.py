"""Simulated tasks: many worker "kernels" per OS process, without TensorFlow, that the controller
cannot tell from real ones (issue 40: the controller measured at 1,024 tasks on 2 cores).

Each simulated task binds the five Jupyter sockets of a connection file (zmq, ``ipc``) and speaks
the real wire: jupyter_client ``Session`` messages signed with the task's key, busy/idle status on
iopub, ``kernel_info`` with subshells, the heartbeat echo. It answers the worker agent's RPC as
``tfdist_nb.worker.rpc.call`` does (``describe``, ``stacks``, ``abort_collectives``, ...), sends
telemetry samples once a ``$TFDIST_TELEMETRY_INTERVAL`` (``tfdist_telemetry`` on iopub, with its
step records) and keeps a real collective ledger (``tfdist_nb.worker.ledger.Ledger``) whose rows
travel with them, so the controller's hang rules and stall watch judge it as they judge a real one.

A cell is a script, one command a line (the fake launcher's words, and more):

- ``print TEXT``; ``raise NAME: TEXT``; ``sleep S`` (an interrupt ends it); ``die CODE``;
- ``steps N [MS]``: N training steps of MS ms (default 10), one all-reduce each, step records;
- ``strategy``: the strategy's start-up (a ``startup`` row naming every member);
- ``wait [SHAPE]``: enter an all-reduce of float32[SHAPE] (default 1) that never completes until
  ``abort_collectives`` (UnavailableError) or an interrupt (KeyboardInterrupt): a hang;
- ``silence S``: the task's heartbeats and telemetry stop for S seconds while it sleeps (a stall);
- ``worker:1> COMMAND``: that task alone runs the command.

Run as ``python -m tests.support.simulated_task``: it reads JSON commands on stdin (``start``,
``interrupt``, ``kill``) and writes JSON events on stdout (``started``, ``exit``); the launcher
is :mod:`tests.support.sim_launcher`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from tfdist_nb.worker.ledger import Ledger, Op
from tfdist_nb.worker.telemetry import INTERVAL_ENV, MSG_TYPE, telemetry_interval

CHANNELS = ("shell", "control", "stdin", "iopub", "hb")
LEDGER_TICK_S = 0.25  # as the real telemetry thread: an open collective goes out within 0.5 s
RESOURCES = {"cpu_percent": 1.0, "rss_mb": 60.0, "threads": 4, "host_cpu_percent": 10.0,
             "load1": 0.5, "cpus": os.cpu_count(), "host_mem_total_mb": 24000.0,
             "mem_limit_mb": None, "mem_limit_source": None, "mem_limit_used_mb": None,
             "oom_kills": None, "mem_cgroup": None, "host_mem_available_mb": 20000.0,
             "net_rx_mb_s": 0.0, "net_tx_mb_s": 0.0, "net_scope": "host", "gpus": None,
             "gpu_reason": "simulated"}


class Released(Exception):
    """A scripted cell ended early: ``ename`` says how (interrupt, aborted collectives)."""

    def __init__(self, ename: str, evalue: str) -> None:
        super().__init__(evalue)
        self.ename, self.evalue = ename, evalue


class SimTask:
    """One simulated worker kernel and its agent, on this process's event loop."""

    def __init__(self, ctx: zmq.asyncio.Context, key: str, name: str, conn: dict[str, Any],
                 env: dict[str, str], out: Any) -> None:
        self.key, self.name, self.env, self._out = key, name, env, out
        cluster = json.loads(env.get("TF_CONFIG") or "{}").get("cluster", {})
        self.members = [f"{r}:{i}" for r, hosts in cluster.items() if r in ("chief", "worker")
                        for i in range(len(hosts))]
        self.session = Session(key=conn["key"].encode(), signature_scheme=conn["signature_scheme"])
        kinds = {"shell": zmq.ROUTER, "control": zmq.ROUTER, "stdin": zmq.ROUTER,
                 "iopub": zmq.PUB, "hb": zmq.REP}
        self.sock = {}
        for channel in CHANNELS:
            s = ctx.socket(kinds[channel])
            s.linger = 0
            s.bind(f"{conn['transport']}://{conn['ip']}-{conn[channel + '_port']}")
            self.sock[channel] = s
        self.interval = telemetry_interval(env.get(INTERVAL_ENV))
        self.ledger = Ledger()
        self.steps: list[list[Any]] = []
        self.step_count = self.seq = self.count = 0
        self.silent_until = 0.0
        self.main = asyncio.Lock()
        self.where: dict[str, Any] = {"kind": "idle", "at": "simulated idle", "line": None}
        self.abort = asyncio.Event()
        self.interrupted = asyncio.Event()
        self.exit_code: int | None = None
        self._requests: set[asyncio.Future[None]] = set()
        self._jobs = [asyncio.ensure_future(j) for j in (
            self._serve("shell"), self._serve("control"), self._echo(), self._telemetry())]

    # -- the wire
    def send(self, channel: str, kind: str, content: dict[str, Any],
             parent: dict[str, Any] | None = None, ident: Any = None) -> None:
        if self.exit_code is None:
            self.session.send(self.sock[channel], kind, content, parent=parent, ident=ident)

    async def _serve(self, channel: str) -> None:
        sock = self.sock[channel]
        while True:
            frames = await sock.recv_multipart(copy=True)
            idents, msg_list = self.session.feed_identities(frames)
            msg = self.session.deserialize(msg_list)
            job = asyncio.ensure_future(self._on(channel, idents, msg))
            self._requests.add(job)  # kept until done (a request outlives no task)
            job.add_done_callback(self._requests.discard)

    async def _echo(self) -> None:
        while True:
            ping = await self.sock["hb"].recv()
            if time.monotonic() >= self.silent_until:
                await self.sock["hb"].send(ping)

    async def _on(self, channel: str, idents: list[bytes], msg: dict[str, Any]) -> None:
        kind, header = msg["msg_type"], msg["header"]
        reply_kind = kind.replace("_request", "_reply")
        if kind == "shutdown_request":
            self.send(channel, reply_kind, {"status": "ok", "restart": False}, header, idents)
            await asyncio.sleep(0.01)
            self.end(0)
            return
        if kind == "create_subshell_request":
            self.send(channel, reply_kind, {"status": "ok", "subshell_id": "sim-1"}, header,
                      idents)
            return
        if kind == "interrupt_request":
            self.interrupted.set()
            self.send(channel, reply_kind, {"status": "ok"}, header, idents)
            return
        self.send("iopub", "status", {"execution_state": "busy"}, header)
        if kind == "kernel_info_request":
            self.send(channel, reply_kind, {
                "status": "ok", "protocol_version": "5.3", "implementation": "tfdist-sim",
                "language_info": {"name": "python"}, "supported_features": ["kernel subshells"]},
                header, idents)
        elif kind == "execute_request":
            if header.get("subshell_id") or msg["content"].get("user_expressions"):
                content = self._rpc(msg["content"])  # the agent: never behind the main thread
            else:
                async with self.main:
                    content = await self._cell(msg)
            if self.exit_code is not None:
                return
            self.send(channel, "execute_reply", content, header, idents)
        self.send("iopub", "status", {"execution_state": "idle"}, header)

    # -- the agent (tfdist_nb.worker.rpc)
    def _rpc(self, content: dict[str, Any]) -> dict[str, Any]:
        expressions, out = content.get("user_expressions") or {}, {}
        for key, expr in expressions.items():
            try:
                text = expr[expr.index(".call(") + len(".call("):expr.rindex(")")]
                request = json.loads(json.loads(text))
                result = getattr(self, "op_" + request["op"])(**request.get("args", {}))
                out[key] = {"status": "ok", "data": {"application/json": {"result": result}},
                            "metadata": {}}
            except Exception as exc:
                out[key] = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc),
                            "traceback": []}
        return {"status": "ok", "execution_count": self.count, "user_expressions": out}

    def op_describe(self, preload: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
        role, _, index = self.name.partition(":")
        return {"pid": None, "host": "simulated", "python": sys.version.split()[0],
                "executable": sys.executable, "task": [role, int(index or 0)],
                "tf_config": self.env.get("TF_CONFIG"), "tensorflow": "simulated",
                "keras": None, "tf_keras": None, "keras_flavour": "simulated", "numpy": None,
                "os": "simulated", "port": None, "port_free": None, "gpus": None,
                "imported": {name: "simulated" for name in preload},
                "instrumentation_errors": {}}

    def op_stacks(self) -> dict[str, Any]:
        trace = f'  File "{self.where["at"]}", in simulated\n'
        return {"threads": {"MainThread": trace}, "main": dict(self.where),
                "in_tf": ["MainThread"] if self.where["kind"] == "tensorflow" else []}

    def op_abort_collectives(self, reason: str) -> str:
        self.abort.set()
        return "aborted"

    def op_set_environment(self, env: dict[str, str]) -> str:
        self.env.update(env)
        return "ok"

    def op_set_log_level(self, level: str) -> str:
        return level

    def op_last_exception(self) -> None:
        return None

    # -- a cell
    async def _cell(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.count += 1
        cell = (msg.get("metadata") or {}).get("tfdist_cell") or self.count
        header = msg["header"]
        self.abort.clear()
        self.interrupted.clear()
        try:
            for lineno, line in enumerate(msg["content"]["code"].splitlines(), 1):
                who, sep, only = line.partition("> ")
                if sep and who != self.name:
                    continue
                word, _, rest = (only if sep else line).strip().partition(" ")
                self.where = {"kind": "python", "at": f"cell {cell} line {lineno}",
                              "line": f"cell {cell} line {lineno}"}
                await self._command(word, rest, header, f"cell {cell} line {lineno}")
                if self.exit_code is not None:
                    return {}
        except Released as end:
            return self._error(header, end.ename, end.evalue)
        finally:
            self.where = {"kind": "idle", "at": "simulated idle", "line": None}
            self.flush(end_of_cell=True)  # post_execute: the cell's steps before its idle
        return {"status": "ok", "execution_count": self.count, "user_expressions": {}}

    async def _command(self, word: str, rest: str, header: dict[str, Any], where: str) -> None:
        if word == "print":
            self.send("iopub", "stream", {"name": "stdout", "text": rest + "\n"}, header)
        elif word == "raise":
            name, _, text = rest.partition(": ")
            raise Released(name, text)
        elif word in ("sleep", "silence"):
            if word == "silence":
                self.silent_until = time.monotonic() + float(rest)
            await self._until(self.interrupted, float(rest))
        elif word == "die":
            self.end(int(rest))
        elif word == "steps":
            n, _, ms = rest.partition(" ")
            for _ in range(int(n)):
                await self._step(float(ms or 10) / 1000.0, where)
        elif word == "strategy":
            op = Op("startup", None, None, "", None, None, where)
            rows = self.ledger.enter([op], "MultiWorkerMirroredStrategy", where=where,
                                     members=self.members)
            self.ledger.close(rows)
        elif word == "wait":
            shape = [int(rest)] if rest else [1]
            op = Op("all_reduce", len(self.members), 1, "float32", tuple(shape), 4 * shape[0],
                    where)
            rows = self.ledger.enter([op], "eager", where=where)
            self.where = {"kind": "tensorflow", "at": "collective_ops.py in all_reduce",
                          "line": where}
            try:
                await self._until(None, None)
            except Released as end:
                self.ledger.close(rows, "aborted")
                raise end
        elif word:
            raise Released("NameError", f"simulated task: unknown command {word!r}")

    async def _step(self, seconds: float, where: str) -> None:
        """A step that ends on the next multiple of ``seconds`` of the wall clock, so the
        tasks' steps end together, as an all-reduce makes them (no straggler unless scripted)."""
        begin = time.time()
        op = Op("all_reduce", len(self.members), 1, "float32", (256,), 1024, where)
        rows = self.ledger.enter([op], "train_step", where=where, called_at=where)
        await self._until(self.interrupted, (begin // seconds + 1) * seconds - begin)
        self.ledger.close(rows)
        self.step_count += 1
        self.steps.append([self.step_count, begin, 1000.0 * (time.time() - begin), 0.1, begin,
                           None, []])

    async def _until(self, event: asyncio.Event | None, seconds: float | None) -> None:
        """Sleep ``seconds`` (None: for ever) unless interrupted or the collectives aborted."""
        waits = [asyncio.ensure_future(self.interrupted.wait()),
                 asyncio.ensure_future(self.abort.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if self.interrupted.is_set():
            raise Released("KeyboardInterrupt", "")
        if self.abort.is_set() and event is None:
            raise Released("UnavailableError", "Collective ops is aborted by: tfdist_nb")

    def _error(self, header: dict[str, Any], name: str, text: str) -> dict[str, Any]:
        content = {"ename": name, "evalue": text, "traceback": [f"{name}: {text}"]}
        self.send("iopub", "error", content, header)
        return {"status": "error", "execution_count": self.count, **content}

    # -- telemetry
    async def _telemetry(self) -> None:
        due = time.monotonic() + self.interval
        while True:
            await asyncio.sleep(min(LEDGER_TICK_S, self.interval))
            if time.monotonic() < self.silent_until:
                continue
            if time.monotonic() >= due:
                self.flush()
                due = time.monotonic() + self.interval
            elif self.ledger.waiting_unsent(0.2):
                self.send("iopub", MSG_TYPE, {"kind": "ledger", "time": time.time(),
                                              "ledger": self.ledger.drain(),
                                              "step": self.step_count}, ident=MSG_TYPE.encode())

    def flush(self, end_of_cell: bool = False) -> None:
        if end_of_cell and not (self.steps or self.ledger.pending()):
            return
        steps, self.steps = self.steps, []
        ledger = self.ledger.drain()
        self.seq += 1
        self.send("iopub", MSG_TYPE, {"kind": "sample", "seq": self.seq, "time": time.time(),
                                      **RESOURCES, "step": self.step_count, "total_steps": None,
                                      "steps": steps, **({"ledger": ledger} if ledger else {})},
                  ident=MSG_TYPE.encode())

    def end(self, code: int) -> None:
        if self.exit_code is not None:
            return
        self.exit_code = code
        for job in (*self._jobs, *self._requests):
            job.cancel()
        for s in self.sock.values():
            s.close(linger=0)
        self._out({"exit": self.key, "code": code})


async def host() -> None:
    """Serve the tasks the launcher asks for, until stdin closes (then every task ends)."""
    ctx = zmq.asyncio.Context()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: dict[str, SimTask] = {}

    def out(event: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    while line := await reader.readline():
        cmd = json.loads(line)
        try:
            if "start" in cmd:
                s = cmd["start"]
                with open(s["connection_file"]) as f:
                    conn = json.load(f)
                tasks[s["key"]] = SimTask(ctx, s["key"], s["name"], conn, s["env"], out)
                out({"started": s["key"]})
            elif "interrupt" in cmd and (t := tasks.get(cmd["interrupt"])):
                t.interrupted.set()
            elif "kill" in cmd and (t := tasks.pop(cmd["kill"], None)):
                t.end(cmd.get("code", -9))
        except Exception:
            key = (cmd.get("start") or {}).get("key") or cmd.get("kill") or cmd.get("interrupt")
            out({"failed": key, "why": traceback.format_exc()})
    for t in tasks.values():
        t.end(-15)
    ctx.destroy(linger=0)


if __name__ == "__main__":
    asyncio.run(host())
