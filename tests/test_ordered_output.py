"""The worker's ordered output on ipykernel's own stream and IO thread, without a kernel.

A real ``OutStream`` publishing through a real ``IOPubThread`` on a zmq PUB socket, read by a
SUB socket: what a kernel's IOPub subscriber receives.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from ipykernel.iostream import IOPubThread, OutStream
from jupyter_client.session import Session

from tfdist_nb.worker.ordered_output import MARKS, OrderedOutput

pytestmark = [pytest.mark.compat, pytest.mark.timeout(60)]


@pytest.fixture
def iopub() -> Iterator[tuple[OutStream, IOPubThread, zmq.Socket[Any], Session]]:
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    session = Session(key=b"test")
    thread = IOPubThread(pub)
    thread.start()
    stream = OutStream(session, thread, "stdout", watchfd=False)
    stream.flush_timeout = 20  # a wait that should not happen fails the test, not a warning
    OrderedOutput().install([stream])
    # a subscriber misses what is sent before it has joined: send until one arrives
    while not sub.poll(50):
        stream.write("hello\n")
        stream.flush()
    while sub.poll(50):
        sub.recv_multipart()
    try:
        yield stream, thread, sub, session
    finally:
        # stop the IO loop as thread.stop() does, but before it marks the thread stopped, so
        # the thread cancels its own pending task (no "Task was destroyed" at exit)
        thread.io_loop.add_callback(thread.io_loop.stop)
        thread.thread.join(20)
        thread.stop()
        thread.close()
        context.destroy(linger=0)  # the event pipes the test threads opened, and the SUB


def received(sub: zmq.Socket[Any], session: Session) -> dict[str, Any]:
    assert sub.poll(5000), "nothing arrived on IOPub"
    _, frames = session.feed_identities(sub.recv_multipart())
    return session.deserialize(frames)["content"]


def test_a_flush_returns_at_once_when_everything_written_is_out(iopub: Any) -> None:
    """ipykernel flushes both streams before every reply and before every idle status, each
    time waiting for its IO thread. With nothing unsent there is nothing to wait for: a flush
    returns even while the IO thread is busy (ipykernel's own would wait out flush_timeout)."""
    stream, thread, sub, session = iopub
    stream.write("a\n")
    stream.flush()
    content = received(sub, session)
    assert content["text"] == "a\n" and content[MARKS]["marks"][0][2] == 2
    busy = threading.Event()
    thread.schedule(lambda: busy.wait(20))  # the IO thread is held until the end
    try:
        flushed = threading.Event()
        threading.Thread(target=lambda: (stream.flush(), flushed.set()), daemon=True).start()
        assert flushed.wait(10), "a flush with nothing unsent waited for the IO thread"
    finally:
        busy.set()


def test_a_flush_with_unsent_output_returns_only_after_it_went_out(iopub: Any) -> None:
    """The cell-end barrier holds: what was written before a flush is sent before the flush
    returns (so before the reply and the idle status that follow it)."""
    stream, thread, sub, session = iopub
    order: list[str] = []

    def seen_sent(msg: dict[str, Any]) -> dict[str, Any]:
        order.append(f"sent {msg['content']['text']!r}")
        return msg

    thread.schedule(lambda: stream.register_hook(seen_sent))  # hooks are per sending thread
    busy = threading.Event()
    thread.schedule(lambda: busy.wait(20))
    stream.write("b\n")

    def flush() -> None:
        stream.flush()
        order.append("flush returned")

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    busy.set()
    flusher.join(20)
    assert order == ["sent 'b\\n'", "flush returned"]
    assert received(sub, session)["text"] == "b\n"
    stream.flush()  # and nothing is sent twice
    assert not sub.poll(0)


def test_a_control_requests_idle_leaves_a_half_written_line_whole() -> None:
    """A kernel goes idle after every control request too (a debugger's ``continue``), and after
    a probe on a subshell: an idle while the writer still runs must not cut
    ``print('double', f(21))``'s line in two, and the writer's own idle still ends an
    unfinished line."""
    from jupyter_client.asynchronous import AsyncKernelClient

    from tfdist_nb.events import OutputLine
    from tfdist_nb.transport.channel import KernelChannel

    seen: list[Any] = []
    channel = KernelChannel("worker:1", AsyncKernelClient(), seen.extend)

    def message(kind: str, parent: str, content: dict[str, Any]) -> dict[str, Any]:
        request = "debug_request" if parent == "continue" else "execute_request"
        return {"msg_type": kind, "header": {"msg_type": kind, "date": None},
                "parent_header": {"msg_id": parent, "session": "console", "msg_type": request},
                "content": content}

    def said(*messages: dict[str, Any]) -> list[tuple[str, str | None]]:
        for msg in messages:
            channel._on_iopub(msg)
        lines = [(e.text, e.origin) for e in seen if isinstance(e, OutputLine)]
        seen.clear()
        return lines

    stdout = {"name": "stdout"}
    busy, idle = {"execution_state": "busy"}, {"execution_state": "idle"}
    # a debugger's continue and a probe on a subshell go idle while the cell runs
    assert said(message("status", "run", busy),
                message("stream", "run", {**stdout, "text": "double"}),
                message("status", "continue", busy), message("status", "continue", idle),
                message("stream", "run", {**stdout, "text": " 42\nno newline"}),
                message("status", "probe", busy),
                message("status", "probe", idle)) == [("double 42", "console")]
    assert said(message("status", "run", idle)) == [("no newline", "console")]
    # what a thread writes after its cell ended goes out at the next request's idle
    assert said(message("stream", "run", {**stdout, "text": "tick"}),
                message("status", "continue", idle)) == []
    assert said(message("status", "next", busy),
                message("status", "next", idle)) == [("tick", "console")]
