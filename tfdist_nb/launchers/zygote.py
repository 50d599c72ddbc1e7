"""The fork server's own process: TensorFlow imported once, every local kernel forked from it.

Started by :mod:`.forkserver` as ``python -m tfdist_nb.launchers.zygote FD LOG PRELOAD...`` with
the tasks' environment less their identity (docs/design.md, "Fork server"). It imports
ipykernel and then ``PRELOAD`` (TensorFlow), in a spawned kernel's order, says ``ready`` on the
Unix socket ``FD`` (``SOCK_SEQPACKET``: one JSON message per packet, a task's stdout/stderr
descriptors passed with it), then forks one worker kernel per request. A child leads a session
of its own (so a stop can end its process group), takes the controller's umask and resource
limits of the request, the task's environment (plus what the imports set, ``TF2_BEHAVIOR``),
working directory and process log, gets a fresh NumPy seed and the command line a cold kernel
has as its process title, and runs ``tfdist_nb.worker.kernel`` exactly as ``python -m`` would;
:mod:`tfdist_nb.worker.forked` makes what the imports set up before any kernel existed (TF's
logger) again in the kernel. It ends as an interpreter does: its non-daemon threads waited
for, then its exit handlers, then ``os._exit``. Import-time output (TensorFlow's start-up
lines, written to ``LOG``) is copied to each child's log first, as a cold task's log would
have it. The server reaps its children and reports each exit code; it ends when the
controller's end of the socket closes, and its children then end with it (their parent watch,
:mod:`tfdist_nb.worker.lifeline`).

What the server swallows before it serves is logged at DEBUG (``TFDIST_LOG``, docs/reference.md,
Environment) to its stderr, ``LOG``, so it leads each child's log like the import-time output. A
forked child swallows silently: its stderr is already the task's own (the fds passed in), and
may be closed when the kernel has ended, so a record would go into the task's output or nowhere.

Nothing of tfdist_nb's worker side is imported before a fork: ``tfdist_nb.worker`` reads the
task's identity when it is imported, in the child.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

from tfdist_nb.debuglog import swallowed

# named, not __name__: run with ``python -m`` this module is __main__, outside tfdist_nb's loggers
logger = logging.getLogger("tfdist_nb.launchers.zygote")

#: imported too, so a kernel's own start costs a fraction of a second; before ``PRELOAD``, in
#: the order a spawned kernel imports them (docs/design.md, "Fork server")
KERNEL_MODULES = ("ipykernel.kernelapp", "ipykernel.ipkernel", "IPython", "zmq", "psutil",
                  "jupyter_client.session")
KERNEL_MODULE = "tfdist_nb.worker.kernel"
MAX_MESSAGE = 1 << 20
#: seconds between two looks at whether the controller is still there
LOOK_S = 1.0


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        sock.send(json.dumps(message).encode())


def main(argv: list[str]) -> int:
    fd, log_path, preload = int(argv[0]), argv[1], argv[2:]
    sock = socket.socket(fileno=fd)
    began = time.monotonic()
    started = dict(os.environ)
    # the kernel's modules first, as a spawned kernel imports them before its handshake imports
    # ``preload``: the warnings filters each import adds land in that order
    if failed := import_aside(KERNEL_MODULES):
        send(sock, {"failed": failed})
        return 1
    kernel_filters = list(warnings.filters)
    if failed := import_aside(tuple(preload)):
        send(sock, {"failed": failed})
        return 1
    with swallowed(logger):  # its set-up needs the environment as started
        import setproctitle

        setproctitle.getproctitle()
    imported = Imported(started, dict(os.environ), lead_filters(kernel_filters))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with open(log_path, "rb") as f:
            said = f.read()
    except OSError:
        said = b""
    send(sock, {"ready": os.getpid(), "seconds": round(time.monotonic() - began, 3),
                "files": own_files()})
    serve(sock, said, imported)
    return 0


@dataclass(frozen=True)
class Imported:
    """What the server's imports changed that a spawned kernel's would change in the kernel:
    the environment before and after them (TensorFlow sets ``TF2_BEHAVIOR``), and the warnings
    filters ``preload`` put in front of the kernel's (a spawned kernel imports it after its
    own start, so they come before what the kernel's start adds)."""

    started: dict[str, str]
    after: dict[str, str]
    filters: tuple[Any, ...]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` (the task's) with what the imports set or removed, unless the task gives such
        a variable a value of its own (not the one the server started with)."""
        out = dict(env)
        for key in self.started.keys() | self.after.keys():
            before, now = self.started.get(key), self.after.get(key)
            if before == now or out.get(key) != before:
                continue
            if now is None:
                out.pop(key, None)
            else:
                out[key] = now
        return out


def lead_filters(before: list[Any]) -> tuple[Any, ...]:
    """The warnings filters the import of ``preload`` put in front of ``before`` (the list as the
    kernel's modules left it)."""
    lead = []
    for item in warnings.filters:
        if item in before:
            break
        lead.append(item)
    return tuple(lead)


def own_files() -> dict[str, int]:
    """The files of the imported modules that are not installed with Python (the user's own
    code, an editable install), with their mtimes: a kernel forked after one of them changed
    would run the old code, so the controller retires the server then."""
    import site

    installed = tuple(os.path.join(os.path.realpath(p), "") for p in {
        sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(),
        site.getusersitepackages()} if p)
    found = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path:
            continue
        real = os.path.realpath(path)
        if real.startswith(installed):
            continue
        with contextlib.suppress(OSError):
            found[real] = os.stat(real).st_mtime_ns
    return found


def import_aside(names: tuple[str, ...]) -> str | None:
    """Import ``names`` on a thread of its own; the traceback if one failed.

    Not on the thread that forks: TensorFlow's logger keeps the thread id of each thread that
    logged (absl's cached ``gettid``), and a child would print the server's id on every line its
    main thread logs. A child's main thread is this process's main thread, which never logged.
    """
    failed: list[str] = []

    def run() -> None:
        try:
            for name in names:
                importlib.import_module(name)
        except BaseException:
            failed.append(traceback.format_exc(limit=8))

    thread = threading.Thread(target=run, name="tfdist-fork-import")
    thread.start()
    thread.join()
    return failed[0] if failed else None


def serve(sock: socket.socket, said: bytes, imported: Imported) -> None:
    """Fork a kernel per request, report exits, until the controller is gone."""
    wake_r, wake_w = os.pipe()
    for end in (wake_r, wake_w):
        os.set_blocking(end, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    parent = os.getppid()
    while os.getppid() == parent:
        readable, _, _ = select.select([sock, wake_r], [], [], LOOK_S)
        if wake_r in readable:
            with contextlib.suppress(OSError):
                os.read(wake_r, 4096)
        reap(sock)
        if sock not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
        except OSError:
            return
        if not data:
            return  # the controller closed its end (or ended)
        fork_one(sock, json.loads(data), fds, said, imported, closing=(wake_r, wake_w))


def reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def fork_one(sock: socket.socket, request: dict[str, Any], fds: list[int], said: bytes,
             imported: Imported, closing: tuple[int, ...]) -> None:
    """Fork the kernel ``request`` asks for; answer with its pid once it leads its session."""
    sync_r, sync_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(sync_r)
            os.setsid()
            os.close(sync_w)  # the server may answer now: killpg(pid) reaches this session
            for end in closing:
                os.close(end)
            sock.close()
            code = become_kernel(request, fds, said, imported)
        except BaseException:
            with contextlib.suppress(Exception):  # silent: stderr itself failed
                traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):  # silent: a record's stream failed
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    os.close(sync_w)
    for end in fds:
        os.close(end)
    with contextlib.suppress(OSError):
        os.read(sync_r, 1)  # end of file once the child called setsid (or died)
    os.close(sync_r)
    send(sock, {"forked": request["id"], "pid": pid})


def become_kernel(request: dict[str, Any], fds: list[int], said: bytes,
                  imported: Imported) -> int:
    """In the child: the task's stdio, limits, directory, environment and title; then the
    kernel, and the end a spawned kernel's interpreter has."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out, err = (fds + fds)[:2] if fds else (os.open(os.devnull, os.O_WRONLY),) * 2
    os.dup2(out, 1)
    os.dup2(err, 2)
    for end in set(fds):
        if end > 2:
            os.close(end)
    if said:
        with contextlib.suppress(OSError):  # a full disk must not keep the kernel from starting
            os.write(2, said)
    take_limits(request)
    os.chdir(request["cwd"])
    env = imported.env(request["env"])
    os.environ.clear()
    os.environ.update(env)
    fresh_seeds()
    set_title(request["title"])
    if "JPY_PARENT_PID" in os.environ:
        parent_default(int(os.environ["JPY_PARENT_PID"]))
    sys.argv = [KERNEL_MODULE, *request["args"]]
    from tfdist_nb.worker import forked

    forked.note(imported.filters, said)  # what the imports set up: made again in the kernel
    import runpy

    code = 0
    try:
        runpy.run_module(KERNEL_MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException:
        traceback.print_exc()  # as the interpreter says an uncaught exception
        code = 1
    finally:
        interpreter_end()
    return code


def exit_code(exc: SystemExit) -> int:
    """The status ``sys.exit(arg)`` ends an interpreter with (a message is printed, status 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    with contextlib.suppress(Exception):  # silent: a forked child (module doc)
        print(exc.code, file=sys.stderr)
    return 1


def interpreter_end() -> None:
    """What a spawned kernel's interpreter does on its way out, before the child's
    ``os._exit``: wait for the non-daemon threads (and the executors' jobs) the cells started,
    then run the exit handlers."""
    with contextlib.suppress(Exception):  # silent: a forked child (module doc)
        threading._shutdown()  # type: ignore[attr-defined]  # Py_FinalizeEx's first step
    import atexit

    with contextlib.suppress(Exception):  # silent: a forked child (module doc)
        atexit._run_exitfuncs()


def take_limits(request: dict[str, Any]) -> None:
    """The controller's umask and resource limits when it asked for this kernel, as a spawned
    kernel inherits them at its start (the server's are the controller's at the first start)."""
    import resource

    if isinstance(request.get("umask"), int):
        os.umask(request["umask"])
    for name, (soft, hard) in (request.get("rlimits") or {}).items():
        which = getattr(resource, name, None)
        if not isinstance(which, int):
            continue
        with contextlib.suppress(ValueError, OSError):  # silent: a forked child (module doc)
            if resource.getrlimit(which) != (soft, hard):
                resource.setrlimit(which, (soft, hard))


def parent_default(pid: int) -> None:
    """ipykernel read ``JPY_PARENT_PID`` when this server imported it (a class default): the
    parent watch needs the child's value, given as the default so ``sys.argv`` stays a spawned
    kernel's."""
    from ipykernel.kernelapp import IPKernelApp

    trait = IPKernelApp.class_traits()["parent_handle"]
    trait.default_value = pid
    # traitlets copies immutable defaults into each new instance from this table
    initial = getattr(IPKernelApp, "_static_immutable_initial_values", None)
    if isinstance(initial, dict) and "parent_handle" in initial:
        initial["parent_handle"] = pid


def fresh_seeds() -> None:
    """A forked child has its parent's random state: NumPy's global generator (seeded once, in
    the server) would give every task the same numbers. ``random`` reseeds itself at fork."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):  # silent: a forked child (module doc)
            numpy.random.seed()


def set_title(title: str) -> None:
    """``ps`` and process tools see the command a cold kernel has (where setproctitle is)."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    with contextlib.suppress(Exception):  # silent: a forked child (module doc)
        setproctitle(title)


if __name__ == "__main__":
    # no interpreter shutdown: TensorFlow's import left threads and exit handlers that can hold
    # it up, and the controller is gone (or done with this server) when main returns
    code = main(sys.argv[1:])
    with contextlib.suppress(Exception):  # silent: a record's stream failed
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
