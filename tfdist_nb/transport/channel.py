"""One task's kernel channels turned into events, and execute requests turned into futures.

The iopub pump runs for the life of the task, so output outside a cell (background threads, the
C++ runtime writing late) is still kept with its task. Input prompts: docs/reference.md, Input
from the tasks. Another client of the kernel (a lab console) is told apart by its session and its
output marked ``origin="console"`` (docs/reference.md, Consoles on a task).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfdist_nb.debuglog import swallowed
from tfdist_nb.events import CONSOLE, Event, OutputLine, RichOutput, TelemetrySample
from tfdist_nb.transport.ordering import Line, StreamOrder
from tfdist_nb.transport.receive import bursts
from tfdist_nb.transport.session import faster_session, message_time

if TYPE_CHECKING:
    from jupyter_client.asynchronous import AsyncKernelClient

TELEMETRY_MSG = "tfdist_telemetry"  # what tfdist_nb.worker.telemetry publishes on iopub
MARKS = "tfdist_marks"  # the write numbers tfdist_nb.worker.ordered_output adds to a stream
#: what a closed stdin says: ipykernel raises EOFError in the task for this answer
EOF_ANSWER = "\x04"
#: how long a prompt waits for the iopub messages the task sent before it (another socket), so
#: what it printed before asking is shown before the question
PROMPT_SETTLE_S = 0.05

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Prompt:
    """A task's cell waiting for a line of input (``input()``, ``getpass``, a pdb prompt)."""

    task: str
    text: str  # the prompt the task shows, e.g. "your name? " or "(Pdb) "
    password: bool  # getpass: the answer is not echoed
    msg_id: str  # the execute request that asks
    #: False once answered, or once the cell ended or was left behind (no one asks any more)
    open: bool = True


@dataclass
class Execution:
    """One execute request in flight on one task."""

    msg_id: str
    cell: int | None
    started: float
    reply: asyncio.Future = field(repr=False)
    idle: asyncio.Future = field(repr=False)
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    error_at: float | None = None  # when the kernel published the cell's error (its clock)
    #: who is asked when the cell wants input; None: the cell was sent without stdin
    on_prompt: Callable[[Prompt], None] | None = field(default=None, repr=False)
    prompt: Prompt | None = None  # the input request waiting for its answer now


class KernelChannel:
    """Executes code on one task and publishes everything it says through ``sink``, in batches
    (all the lines of one stream message together)."""

    def __init__(self, task: str, client: AsyncKernelClient, sink: Callable[[list[Event]], None],
                 heartbeat: bool = False) -> None:
        self.task = task
        self.heartbeat = heartbeat  # start the heartbeat channel (``TaskHandle.heartbeat``)
        self.client = client
        client.session = faster_session(client.session)  # before the channels exist
        self._sink = sink
        self._held: list[Event] | None = None  # a burst's events, sunk together at its end
        self._pending: dict[str, Execution] = {}
        self._cells: dict[str, int] = {}
        self._console: set[str] = set()  # requests of another client (a console), by msg_id
        #: execute requests between their busy and idle status: their unfinished lines wait
        self._running: set[str] = set()
        #: JupyterLab's debugger holds the kernel at a breakpoint (a ``debug_event`` said
        #: ``stopped`` and nothing since said it goes on): a person is at it, not a hang
        self.debug_stopped = False
        self._order = StreamOrder()
        self._pumps: list[asyncio.Task] = []
        self.iopub_alive = asyncio.Event()  # set by the first iopub message: that channel works
        self.subshells = False  # whether the kernel runs subshells: known once started

    async def start(self, timeout: float) -> None:
        self.client.start_channels(hb=self.heartbeat)
        info = await self._ready(timeout)
        self.subshells = "kernel subshells" in info.get("supported_features", ())
        self._pumps = [asyncio.ensure_future(self._pump("iopub", self._on_iopub)),
                       asyncio.ensure_future(self._pump("shell", self._on_shell)),
                       asyncio.ensure_future(self._pump_stdin())]

    async def close(self) -> None:
        for pump in self._pumps:
            pump.cancel()
        for pump in self._pumps:
            with contextlib.suppress(asyncio.CancelledError), swallowed(logger):
                await pump
        self._flush_partials(keep=())
        for ex in self._pending.values():
            _close_prompt(ex)
            for fut in (ex.reply, ex.idle):
                if not fut.done():
                    fut.cancel()
        self._pending.clear()

    async def _ready(self, timeout: float) -> dict[str, Any]:
        """The kernel's ``kernel_info_reply`` content once shell and iopub both answer: the
        check of jupyter_client's ``wait_for_ready``, less its last 0.2 s of iopub silence
        (the pump reads what follows) and its second round trip for the features (JEP 91
        subshells, ipykernel >= 7): 0.4 s of every kernel start (docs/performance.md)."""
        from jupyter_client.manager import KernelManager

        client, deadline = self.client, time.monotonic() + timeout
        # a client of no KernelManager (a remote task) knows its kernel alive by heartbeats
        while not isinstance(client.parent, KernelManager) and not await client.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond to heartbeats in {timeout:.0f} s")
            await asyncio.sleep(0.2)
        while True:
            request = client.session.msg("kernel_info_request", {})
            client.shell_channel.send(request)
            try:
                while True:  # replies to an earlier, unanswered request may come first
                    reply = await asyncio.wait_for(client.get_shell_msg(), 1.0)
                    if reply.get("parent_header", {}).get("msg_id") == request["header"]["msg_id"]:
                        break
                await asyncio.wait_for(client.get_iopub_msg(), 0.2)  # iopub is connected
                return dict(reply["content"])
            except asyncio.TimeoutError:
                if not await client.is_alive():
                    raise RuntimeError("Kernel died before replying to kernel_info") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} s") from None

    async def create_subshell(self, timeout: float) -> str | None:
        """A kernel subshell (ipykernel >= 7): a second thread that runs requests while the main
        thread is blocked, e.g. inside a collective. None when the kernel has no subshells."""
        if not self.subshells:
            return None
        self.client.control_channel.send(self.client.session.msg("create_subshell_request", {}))
        try:
            reply = await self.client.get_control_msg(timeout=timeout)
        except Exception:  # no reply in time (an older ipykernel has no subshells)
            logger.debug("%s: no subshell", self.task, exc_info=True)
            return None
        return reply.get("content", {}).get("subshell_id")

    def execute(self, code: str, cell: int | None, *, silent: bool = False,
                user_expressions: dict[str, str] | None = None,
                subshell_id: str | None = None,
                on_prompt: Callable[[Prompt], None] | None = None) -> Execution:
        """Send ``code``; ``on_prompt``: the cell may ask for input (``allow_stdin``), each
        question handed to it as a :class:`Prompt`. Without it the task's ``input()`` raises
        ipykernel's StdinNotImplementedError, as under any frontend that takes no input."""
        loop = asyncio.get_running_loop()
        content = {"code": code, "silent": silent, "store_history": not silent,
                   "user_expressions": user_expressions or {},
                   "allow_stdin": on_prompt is not None,
                   "stop_on_error": subshell_id is None}
        # so the task says "cell N line L" in the notebook's numbering (worker.cellmap)
        metadata = {"tfdist_cell": cell} if cell is not None and not silent else {}
        msg = self.client.session.msg("execute_request", content, metadata=metadata)
        if subshell_id is not None:
            msg["header"]["subshell_id"] = subshell_id
        self.client.shell_channel.send(msg)
        msg_id = msg["header"]["msg_id"]
        ex = Execution(msg_id, cell, time.time(), loop.create_future(), loop.create_future(),
                       on_prompt=on_prompt)
        self._pending[msg_id] = ex
        if cell is not None:
            self._cells[msg_id] = cell
        return ex

    def abandon(self, ex: Execution) -> None:
        """Stop tracking ``ex``; its late output still goes to the log under its cell."""
        self._pending.pop(ex.msg_id, None)
        _close_prompt(ex)

    def answer(self, prompt: Prompt, value: str) -> None:
        """Send ``value`` as the answer to ``prompt`` (``EOF_ANSWER``: the task's ``input()``
        raises EOFError); a prompt no longer open (answered, its cell ended) is not answered."""
        ex = self._pending.get(prompt.msg_id)
        if ex is None or ex.prompt is not prompt or not prompt.open:
            return
        ex.prompt, prompt.open = None, False
        self.client.input(value)

    @property
    def prompting(self) -> Prompt | None:
        """The question this task's cell waits on now, if any."""
        return next((ex.prompt for ex in self._pending.values() if ex.prompt is not None), None)

    async def _pump_stdin(self) -> None:
        while True:
            msg = await self.client.get_stdin_msg()
            try:
                await self._on_stdin(msg)
            except Exception:  # one odd message must not leave the next question unheard
                logger.exception("tfdist_nb: could not handle a question from %s", self.task)

    async def _on_stdin(self, msg: dict[str, Any]) -> None:
        if msg.get("msg_type") != "input_request":
            return
        ex = self._pending.get(msg.get("parent_header", {}).get("msg_id", ""))
        if ex is None or ex.on_prompt is None:
            # a cell left behind (its run ended) asks on: no one will answer, so it ends
            self.client.input(EOF_ANSWER)
            return
        await asyncio.sleep(PROMPT_SETTLE_S)
        # "name: " printed before input() shows first
        self._flush_partials(keep=self._running - {ex.msg_id})
        content = msg.get("content", {})
        ex.prompt = Prompt(self.task, str(content.get("prompt", "")),
                           bool(content.get("password")), ex.msg_id)
        try:
            ex.on_prompt(ex.prompt)
        except Exception:  # the asker failed: the task's input() ends instead of hanging
            logger.exception("tfdist_nb: could not ask for %s's input", self.task)
            self.answer(ex.prompt, EOF_ANSWER)

    def _on_shell(self, msg: dict[str, Any]) -> None:
        ex = self._pending.get(msg.get("parent_header", {}).get("msg_id", ""))
        if ex and msg["msg_type"] == "execute_reply" and not ex.reply.done():
            ex.reply.set_result(msg["content"])

    async def _pump(self, which: str, handle: Callable[[dict[str, Any]], None]) -> None:
        """Every burst of the ``which`` channel handled, its events sunk together (one write)."""
        async for burst in bursts(self.client, which):
            held: list[Event] = []
            self._held = held
            try:
                for msg in burst:
                    try:  # one odd message must not stop the task's log
                        handle(msg)
                    except Exception:
                        logger.exception("tfdist_nb: could not handle a message from %s",
                                         self.task)
            finally:
                self._held = None
                if held:
                    self._sink(held)

    def _emit(self, events: list[Event]) -> None:
        if self._held is not None:
            self._held.extend(events)
        else:
            self._sink(events)

    def _on_iopub(self, msg: dict[str, Any]) -> None:
        kind = msg["msg_type"]
        header = msg.get("parent_header", {})
        parent = header.get("msg_id", "")
        cell = self._cells.get(parent)
        ex = self._pending.get(parent)
        content = msg.get("content", {})
        now = time.time()
        t = message_time(msg, now)
        self.iopub_alive.set()
        if parent and header.get("session") not in (None, self.client.session.session):
            self._console.add(parent)  # another client's request: a console on this task
        if kind != "stream":  # what waited for a gap to fill may be due; rich output and
            # tracebacks come after the streams were flushed: everything before them is in
            self._sink_lines(self._order.release(now, force=kind != TELEMETRY_MSG))
        if kind == TELEMETRY_MSG:
            self._emit([TelemetrySample(content.get("time", t), self.task, content)])
        elif kind == "debug_event":
            event = content.get("event")
            if event in ("stopped", "continued", "terminated", "exited"):
                self.debug_stopped = event == "stopped"
        elif kind == "stream":
            name = content.get("name", "stdout")
            text = content.get("text", "")
            if ex is not None:
                (ex.stdout if name == "stdout" else ex.stderr).append(text)
            self._sink_lines(self._order.add(name, text, content.get(MARKS), parent, now, t))
        elif kind in ("display_data", "execute_result", "update_display_data"):
            if ex is not None:
                ex.outputs.append({"output_type": kind, **content})
            self._emit([RichOutput(t, self.task, kind, content.get("data", {}),
                                   content.get("metadata", {}), cell, origin=self._origin(parent))])
            plain = content.get("data", {}).get("text/plain")
            if plain:
                self._emit_lines(t, "display", plain.splitlines(), parent)
        elif kind == "error":
            if ex is not None and ex.error_at is None:
                ex.error_at = t
            lines = "\n".join(content.get("traceback", [])).splitlines()
            self._emit_lines(t, "error", lines, parent)
        elif kind == "execute_input" and parent in self._console:
            self._emit_lines(t, "input", str(content.get("code", "")).splitlines(), parent)
        elif kind == "status" and content.get("execution_state") == "busy":
            if header.get("msg_type") == "execute_request":  # (a control request writes none)
                self._running.add(parent)
        elif kind == "status" and content.get("execution_state") == "idle":
            if header.get("msg_type") == "execute_request":
                self._running.discard(parent)
                self._flush_partials(keep=self._running)
            if ex is not None and not ex.idle.done():
                ex.idle.set_result(t)

    def _flush_partials(self, keep: Container[str]) -> None:
        """Unfinished lines go out as they are, but those of the requests in ``keep`` (still
        running: a debugger's or a probe's idle must not cut a cell's line in two)."""
        self._sink_lines(self._order.release(time.time(), force=True))
        self._sink_lines(self._order.partials(keep))

    def _origin(self, parent: str) -> str | None:
        return CONSOLE if parent in self._console else None

    def _sink_lines(self, lines: list[Line]) -> None:
        if lines:  # one batch per message: a flood costs one write, not one per line
            self._emit([OutputLine(t, self.task, stream, text, self._cells.get(parent),
                                   origin=self._origin(parent))
                        for t, stream, text, parent in lines])

    def _emit_lines(self, t: float, stream: str, lines: list[str], parent: str) -> None:
        self._sink_lines([(t, stream, line.rstrip("\r"), parent) for line in lines])


def _close_prompt(ex: Execution) -> None:
    if ex.prompt is not None:
        ex.prompt.open = False
        ex.prompt = None
