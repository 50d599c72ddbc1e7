"""The ipykernel internals a task kernel leans on (tfdist_nb/worker/kernel_internals.py) exist in
the installed ipykernel, which is one the list was read against; a missing one is said, not
silently lost. Real ipykernel classes, no kernel process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tfdist_nb.worker import kernel_internals, state


@pytest.fixture
def out_stream() -> Iterator[Any]:
    import zmq
    from ipykernel.iostream import IOPubThread, OutStream
    from jupyter_client.session import Session

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    pub = IOPubThread(sock)  # never started: the stream is only looked at
    try:
        yield OutStream(Session(), pub, "stdout", watchfd=False)
    finally:
        pub.close()
        ctx.destroy(linger=0)


def test_the_installed_ipykernel_was_read() -> None:
    found = kernel_internals.ipykernel_version()
    assert kernel_internals.checked(), (
        f"ipykernel {found} is outside the releases tfdist_nb/worker/kernel_internals.py was "
        f"read against {kernel_internals.CHECKED}: read that release's iostream.py, "
        "kernelbase.py, kernelapp.py and compiler.py for the names listed there, then widen "
        "CHECKED")
    assert not kernel_internals.checked((7, 0)) and not kernel_internals.checked((8, 0))


def test_every_private_name_is_there(out_stream: Any) -> None:
    from ipykernel import compiler
    from ipykernel.kernelapp import IPKernelApp
    from ipykernel.kernelbase import Kernel
    from ipykernel.parentpoller import ParentPollerUnix

    assert [n for n in kernel_internals.OUT_STREAM if not hasattr(out_stream, n)] == []
    assert isinstance(out_stream._buffers, dict)
    assert hasattr(Kernel, kernel_internals.EXECUTE_SLEEP)
    assert callable(compiler.get_tmp_directory) and ParentPollerUnix
    assert {"poller", "parent_handle"} <= set(IPKernelApp.class_trait_names())


def test_a_missing_one_is_said_once_with_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "instrumentation_errors", {})
    said: list[tuple[str, str]] = []
    monkeypatch.setattr(state, "note", lambda text, level="INFO", *a, **k: said.append(
        (text, level)))

    class Moved:
        _buffers: dict[str, Any] = {}

    for _ in range(2):
        assert kernel_internals.lacking(Moved(), "output order (stdout)", "stops",
                                        kernel_internals.OUT_STREAM)
    assert len(said) == 1 and said[0][1] == "WARNING"
    error = state.instrumentation_errors["output order (stdout)"]
    assert "has no _buffer_lock, _flush_buffers, register_hook, flush_interval on Moved" in error
    assert "read against 7.1-7.4" in error
    assert not kernel_internals.lacking(Moved(), "present", "stops", ("_buffers",))
