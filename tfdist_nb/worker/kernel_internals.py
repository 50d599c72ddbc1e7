"""Every ipykernel internal and protocol extension a task kernel leans on, in one place, with the
ipykernel releases they were read against (docs/design.md, "Kernel internals").

Private names can move in any release: each use goes through :func:`lacking`, which says a
missing one once as a WARNING with the task instead of quietly losing what it bought.

Private internals (what breaks without them):

- ``OutStream._buffers``, ``_buffer_lock``, ``_flush_buffers``, ``register_hook`` and
  ``flush_interval`` (``ipykernel.iostream``): output order and write times
  (:mod:`.ordered_output`), and output flushed every 50 ms instead of 200 ms.
- ``Kernel._execute_sleep`` (``ipykernel.kernelbase``): 0.5 ms less per cell round trip.
- ``IPKernelApp.poller`` as a ``ParentPollerUnix`` and ``parent_handle``: the parent watch that
  cleans up after a killed controller (:mod:`.lifeline`).

Protocol extensions (fields other Jupyter clients ignore):

- IOPub message type ``tfdist_telemetry`` (:mod:`.telemetry`): heartbeats, samples, notes;
- ``content["tfdist_marks"]`` on ``stream`` messages: each write's sequence number and time;
- ``metadata["tfdist_cell"]`` on ``execute_request``: the controller's cell number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypedDict

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell
    from jupyter_client.session import Session

    class ParentRequest(TypedDict, total=False):
        """A channel's current request, as ``get_parent`` gives it ({} before the first)."""
        header: dict[str, object]
        metadata: dict[str, object]  # ``tfdist_cell``: the controller's cell number

    class TaskKernel(Protocol):
        """What the agent uses of its ``ipykernel.ipkernel.IPythonKernel`` once it runs (its
        traits allow None only before the kernel app sets them)."""
        shell: InteractiveShell
        session: Session
        iopub_socket: Any  # an ipykernel.iostream.BackgroundSocket, duck-typed as zmq socket
        _execute_sleep: float

        def get_parent(self, channel: str = ...) -> ParentRequest: ...

#: the oldest and the newest ipykernel (major, minor) whose source these names were read in
CHECKED = ((7, 1), (7, 4))

OUT_STREAM = ("_buffers", "_buffer_lock", "_flush_buffers", "register_hook", "flush_interval")
EXECUTE_SLEEP = "_execute_sleep"


def ipykernel_version() -> tuple[int, int] | None:
    """The installed ipykernel's (major, minor), or None when it cannot be read."""
    try:
        from importlib.metadata import version

        major, minor = version("ipykernel").split(".")[:2]
        return int(major), int(minor)
    except Exception:  # not installed, or a version string of another shape
        return None


def checked(found: tuple[int, int] | None = None) -> bool:
    """Whether ``found`` (default: the installed ipykernel) is within ``CHECKED``."""
    found = found or ipykernel_version()
    return found is not None and CHECKED[0] <= found <= CHECKED[1]


def lacking(obj: object, part: str, stops: str, names: tuple[str, ...]) -> bool:
    """True, and said once for ``part`` (a WARNING with the task), when ``obj`` lacks any of
    ``names``; False when every one is there."""
    missing = [n for n in names if not hasattr(obj, n)]
    if not missing:
        return False
    from tfdist_nb.worker import state

    found = ipykernel_version()
    release = f"ipykernel {found[0]}.{found[1]}" if found else "this ipykernel"
    state.instrumentation_failed(part, stops, AttributeError(
        f"{release} has no {', '.join(missing)} on {type(obj).__name__} (read against "
        f"{CHECKED[0][0]}.{CHECKED[0][1]}-{CHECKED[1][0]}.{CHECKED[1][1]})"))
    return True
