"""A notebook kernel driven the way JupyterLab drives it: execute requests with ``allow_stdin``,
and every ``input_request`` the kernel sends on its stdin channel answered with an
``input_reply``, as a person typing into the cell's input box would (the magics then prompt for
the tasks' ``input()`` and pdb, docs/reference.md, Input from the tasks).
"""

from __future__ import annotations

import contextlib
import queue
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: what answers one prompt: (prompt text, password) -> the line typed
Answer = Callable[[str, bool], str]


@dataclass
class Asked:
    text: str
    password: bool
    at: float  # when the input_request arrived (time.monotonic)
    answered_at: float = 0.0
    shown_before: str = ""  # the cell's text when the question was shown


@dataclass
class Ran:
    """One executed cell as the notebook shows it."""

    text: str = ""  # every stream, colours stripped
    error: tuple[str, str] | None = None  # ename, evalue
    traceback: str = ""
    prompts: list[Asked] = field(default_factory=list)
    seconds: float = 0.0


def answers(*lines: str) -> Answer:
    """Type ``lines`` in order, one per prompt; a prompt more than expected fails the test."""
    left = list(lines)

    def answer(text: str, password: bool) -> str:
        assert left, f"an unexpected prompt: {text!r}"
        return left.pop(0)

    return answer


class NotebookKernel:
    """A python3 kernel (this interpreter's ipykernel) with a client that answers prompts."""

    def __init__(self, cwd: Path) -> None:
        from jupyter_client import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, answer: Answer | None = None, timeout: float = 120,
            stdin: bool | None = None) -> Ran:
        """Execute ``code`` and wait for its idle status; ``answer`` types the replies (the
        request allows stdin when it is given, or as ``stdin`` says)."""
        allow = answer is not None if stdin is None else stdin
        msg_id = self.kc.execute(code, allow_stdin=allow, stop_on_error=False)
        ran = Ran()
        parts: list[str] = []
        started = time.monotonic()
        deadline = started + timeout
        idle = False
        while not idle:
            assert time.monotonic() < deadline, f"the cell did not end in {timeout}s: {code!r}"
            if allow:
                idle = self._answer(ran, parts, msg_id, answer)
            idle = self._take_output(ran, parts, msg_id, 0.05) or idle
        ran.text = ANSI.sub("", "".join(parts))
        ran.seconds = time.monotonic() - started
        return ran

    def _take_output(self, ran: Ran, parts: list[str], msg_id: str, timeout: float) -> bool:
        """One iopub message of the cell (waiting up to ``timeout``); True at its idle."""
        try:
            msg = self.kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return False
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            return False
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            parts.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            parts.append(content.get("data", {}).get("text/plain", "") + "\n")
        elif kind == "error":
            ran.error = (content["ename"], content["evalue"])
            ran.traceback = ANSI.sub("", "\n".join(content.get("traceback", [])))
        return kind == "status" and content.get("execution_state") == "idle"

    def _answer(self, ran: Ran, parts: list[str], msg_id: str, answer: Answer | None) -> bool:
        """Answer the kernel's question, if it asks one, after the output it sent before it
        (another socket: read for a moment first, as a person sees the cell, then the box)."""
        try:
            msg = self.kc.get_stdin_msg(timeout=0.01)
        except queue.Empty:
            return False
        if msg["msg_type"] != "input_request":
            return False
        asked = Asked(msg["content"]["prompt"], bool(msg["content"].get("password")),
                      time.monotonic())
        idle = False
        while time.monotonic() - asked.at < 0.2:
            idle = self._take_output(ran, parts, msg_id, 0.02) or idle
        asked.shown_before = ANSI.sub("", "".join(parts))
        ran.prompts.append(asked)
        assert answer is not None, f"a prompt with no one to answer it: {asked.text!r}"
        value = answer(asked.text, asked.password)
        asked.answered_at = time.monotonic()
        self.kc.input(value)
        return idle

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


@contextmanager
def notebook_kernel(cwd: Path) -> Iterator[NotebookKernel]:
    """A notebook kernel for one test; its clusters are stopped before it shuts down."""
    nb = NotebookKernel(cwd)
    try:
        yield nb
    finally:
        # a kernel that died in the test took its workers with it (their lifeline)
        with contextlib.suppress(Exception):
            nb.run("%tfdist_stop", timeout=60)
        nb.close()


def read_json(path: Path) -> Any:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
