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


@pytest.mark.compat  # also against the oldest jupyter_client and JupyterLab .ci/oldest.txt pins
def test_the_jupyter_server_internals_a_console_leans_on_are_there() -> None:
    """A console on a task (tfdist_nb/lab/consoles.py) registers the task's kernel with the
    server's kernel manager through a few private names: the installed jupyter_server and
    jupyter_client are releases they were read in, and have them (a server lacking one refuses
    the console saying so, tests/test_lab_console.py)."""
    from importlib.metadata import version

    from jupyter_server.services.kernels.kernelmanager import (
        AsyncMappingKernelManager,
        ServerKernelManager,
    )

    from tfdist_nb.lab import consoles

    for dist, (oldest, newest) in consoles.CHECKED.items():
        found = tuple(int(x) for x in version(dist).split(".")[:2])
        assert oldest <= found <= newest, (
            f"{dist} {found} is outside the releases tfdist_nb/lab/consoles.py was read against "
            f"({oldest}-{newest}): read its kernel manager for SERVER_INTERNALS, then widen "
            "CHECKED")
    manager = AsyncMappingKernelManager()
    kernel = ServerKernelManager(owns_kernel=False)
    for obj, kind in ((manager, "MappingKernelManager"), (kernel, "KernelManager")):
        assert [n for n in consoles.SERVER_INTERNALS[kind] if not hasattr(obj, n)] == [], kind


def test_a_server_without_those_internals_refuses_the_console_saying_so() -> None:
    """A jupyter_server release whose kernel manager moved one of them: the console is refused
    (501) naming what is missing and what to do instead, not an AttributeError half-way."""
    import asyncio

    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    from tfdist_nb.lab import consoles

    class Moved(AsyncMappingKernelManager):  # as if a release renamed the start's last step
        _finish_kernel_start = property()  # type: ignore[assignment]

        def __getattribute__(self, name: str) -> Any:
            if name == "_finish_kernel_start":
                raise AttributeError(name)
            return super().__getattribute__(name)

    kernels = consoles.TaskKernels(Moved(), index=None)  # type: ignore[arg-type]
    info = {"key": "k", "transport": "tcp", "ip": "127.0.0.1"}
    with pytest.raises(consoles.Refused) as refused:
        asyncio.run(kernels.kernel_for("c1", "worker:0", "/x/kernel.json", info))
    assert refused.value.status == 501
    assert "_finish_kernel_start" in str(refused.value) and "jupyter console --existing" in str(
        refused.value)
    assert kernels.known == {}
