"""Entry point of a worker kernel: ``python -m tfdist_nb.worker.kernel -f CONNECTION_FILE``.

An ordinary ipykernel with its agent started before the first cell, which ends with its
controller (:mod:`.lifeline`, on JPY_PARENT_PID); a spare kernel runs the same entry point.
"""

from __future__ import annotations

import os

import tfdist_nb.worker  # noqa: F401  - the task identity is read before any user code


def main() -> None:
    from ipykernel.kernelapp import IPKernelApp

    from tfdist_nb.worker import agent, forked

    own_temp_dir()
    app = IPKernelApp.instance()
    # The kernel's ipc sockets are created while it binds: owner-only, like every file of the
    # run (docs/security.md). The user's own files get the usual umask back before any cell.
    umask = os.umask(0o077)
    try:
        app.initialize()
    finally:
        os.umask(umask)
    watch_parent(app)
    agent.start(app.kernel)
    forked.settle()  # a forked kernel's TensorFlow logger as a spawned kernel's import makes it
    app.start()


def own_temp_dir() -> None:
    """The task's temporary files (TensorFlow's autograph writes the user's converted code
    there) go into an owner-only directory of its own, removed when the task ends: at exit,
    or, after a SIGKILL (every restart), by the next task started on this host
    (docs/reference.md, Worker side). Under ``$TMPDIR`` when the task has one."""
    import atexit
    import shutil
    import tempfile

    from tfdist_nb.owned_files import private_temp_dir

    tempfile.tempdir = None  # read $TMPDIR again: a forked kernel's was the fork server's
    path = private_temp_dir("task")
    os.environ["TMPDIR"] = tempfile.tempdir = str(path)  # also for its subprocesses
    atexit.register(shutil.rmtree, path, ignore_errors=True)


def watch_parent(app: object) -> None:
    """ipykernel's parent poller, replaced by one that cleans up (its start is the app's)."""
    from ipykernel.parentpoller import ParentPollerUnix

    from tfdist_nb.worker.lifeline import ParentWatch

    # the parent's pid is the app's parent_handle (JPY_PARENT_PID): ipykernel 6.29's poller
    # does not keep it
    poller = getattr(app, "poller", None)
    parent = getattr(app, "parent_handle", 0)
    if isinstance(poller, ParentPollerUnix) and parent:
        path = getattr(app, "abs_connection_file", None) or app.connection_file  # type: ignore[attr-defined]
        app.poller = ParentWatch(parent, os.path.abspath(path))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
