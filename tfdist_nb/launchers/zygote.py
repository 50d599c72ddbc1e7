"""The fork server's own process: TensorFlow imported once, every local kernel forked from it.

Run as ``python -m tfdist_nb.launchers.zygote FD LOG PRELOAD...`` by :mod:`.fork_handle`; one
JSON message per ``SOCK_SEQPACKET`` packet on ``FD``. What a child takes to be a spawned kernel
for all a user sees: docs/design.md, "Fork server".

Before serving, what the server swallows is logged at DEBUG to ``LOG`` (it leads each child's
log). A forked child swallows silently: its stderr is the task's own and may be closed once the
kernel ended, so a record would land in the task's output or nowhere. Nothing of
``tfdist_nb.worker`` is imported before a fork: it reads the task's identity at import.
"""

from __future__ import annotations

import contextlib
import functools
import gc
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, final

from tfdist_nb.debuglog import swallowed

if TYPE_CHECKING:
    from tfdist_nb.worker.forked import WarningFilter

# named, not __name__: run with ``python -m`` this module is __main__, outside tfdist_nb's loggers
logger = logging.getLogger("tfdist_nb.launchers.zygote")

#: imported too, so a kernel's own start costs a fraction of a second; before ``PRELOAD``, in
#: the order a spawned kernel imports them (docs/design.md, "Fork server"). The debugger (its
#: debugpy, 0.15 s) is imported by every kernel's start, whether or not one debugs.
KERNEL_MODULES = ("ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.debugger", "IPython",
                  "zmq", "psutil", "jupyter_client.session")
KERNEL_MODULE = "tfdist_nb.worker.kernel"
MAX_MESSAGE = 1 << 20
#: seconds between two looks at whether the controller is still there
LOOK_S = 1.0
#: the files of TensorFlow's error paths (an op's failed status, a tf.function's call) and of a
#: collective's under a strategy: IPython's first traceback over one parses it (stack_data),
#: about 1 s in all in a fresh kernel. Parsed here, one per idle moment (0.25 s at most each),
#: a forked kernel's first TensorFlow traceback takes a tenth of that, and a task an abort
#: released answers sooner (docs/design.md, "Fork server"). Those not imported are skipped.
TRACEBACK_MODULES = (
    "tensorflow.python.framework.ops", "tensorflow.python.eager.execute",
    "tensorflow.python.util.traceback_utils", "tensorflow.python.ops.collective_ops",
    "tensorflow.python.ops.gen_collective_ops", "tensorflow.python.distribute.distribute_lib",
    "tensorflow.python.distribute.collective_all_reduce_strategy",
    "tensorflow.python.distribute.cross_device_ops",
    "tensorflow.python.distribute.cross_device_utils", "multiprocessing.pool",
    "tensorflow.python.eager.polymorphic_function.polymorphic_function",
    "tensorflow.python.eager.polymorphic_function.concrete_function")
#: seconds of quiet before the next step of that warm-up
WARM_IDLE_S = 0.25


def quietly(*calls: Callable[[], object]) -> None:
    """Each call, what it raises swallowed silently: a forked child's stderr is the task's own
    and may be gone (module doc)."""
    for call in calls:
        with contextlib.suppress(Exception):
            call()


def flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


class ForkRequest(TypedDict):
    """A fork request (``ForkServer._fork``); ``rlimits``' pairs arrive as JSON lists."""

    id: int
    args: list[str]
    env: dict[str, str]
    cwd: str
    title: str
    umask: int
    rlimits: Mapping[str, Sequence[int]]


@final
class ServerReady(TypedDict):
    ready: int  # the server's pid
    seconds: float
    files: dict[str, int]  # own_files()


@final
class ServerFailed(TypedDict):
    failed: str  # the import's traceback


@final
class KernelExited(TypedDict):
    exit: int  # pid
    code: int


@final
class KernelForked(TypedDict):
    forked: int  # the request's id
    pid: int


ServerMessage = ServerReady | ServerFailed | KernelExited | KernelForked  # one a packet


def send(sock: socket.socket, message: ServerMessage) -> None:
    with contextlib.suppress(OSError):
        sock.send(json.dumps(message).encode())


def main(argv: list[str]) -> int:
    fd, log_path, preload = int(argv[0]), argv[1], argv[2:]
    sock = socket.socket(fileno=fd)
    began = time.monotonic()
    started = dict(os.environ)
    # the kernel's modules first, as a spawned kernel imports them before its handshake imports
    # ``preload``: the warnings filters each import adds land in that order
    failed = import_aside(KERNEL_MODULES)
    kernel_filters = list(warnings.filters)
    if failed := failed or import_aside(tuple(preload)):
        send(sock, {"failed": failed})
        return 1
    with swallowed(logger):  # its set-up needs the environment as started
        import setproctitle

        setproctitle.getproctitle()
    imported = Imported(started, dict(os.environ), lead_filters(kernel_filters))
    flush()
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
    """What the server's imports changed, which a spawned kernel's would change in the kernel:
    the environment (``TF2_BEHAVIOR``) and the warnings filters ``preload`` put in front."""

    started: dict[str, str]
    after: dict[str, str]
    filters: tuple[WarningFilter, ...]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """The task's ``env`` with what the imports set or removed, unless the task gives such
        a variable a value of its own."""
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


def lead_filters(before: list[WarningFilter]) -> tuple[WarningFilter, ...]:
    """The warnings filters the import of ``preload`` put in front of ``before``."""
    lead = []
    for item in warnings.filters:
        if item in before:
            break
        lead.append(item)
    return tuple(lead)


def own_files() -> dict[str, int]:
    """The imported files not installed with Python, with their mtimes: once one changes, the
    controller retires the server (its forks would run the old code)."""
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
    warm_up = traceback_warm_up()
    while os.getppid() == parent:
        readable, _, _ = select.select([sock, wake_r], [], [], WARM_IDLE_S if warm_up else LOOK_S)
        if wake_r in readable:
            with contextlib.suppress(OSError):
                os.read(wake_r, 4096)
        reap(sock)
        if not readable and warm_up:
            with swallowed(logger):
                warm_up.pop(0)()
        if sock not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
        except OSError:
            return
        if not data:
            return  # the controller closed its end (or ended)
        fork_one(sock, json.loads(data), fds, said, imported, closing=(wake_r, wake_w))


def traceback_warm_up() -> list[Callable[[], object]]:
    """Steps of a quarter second or less that leave IPython's traceback machinery warm for
    every later fork: one traceback of plain Python (its pygments lexer, ``inspect``'s table of
    module files), then each of ``TRACEBACK_MODULES`` parsed as stack_data reads it. No
    TensorFlow op runs: a fork after one would inherit a started runtime."""
    try:
        import stack_data
        from IPython.core import ultratb
    except ImportError:
        return []

    def plain() -> None:
        def raised() -> None:
            raise ValueError("a traceback to warm up IPython's formatting")
        try:
            raised()
        except ValueError:
            ultratb.AutoFormattedTB(mode="Context").structured_traceback(*sys.exc_info())

    def parsed(path: str) -> None:
        source = stack_data.Source.for_filename(path)
        source.asttext()  # the node positions a frame's highlight needs (not its tokens)
        _ = source.pieces  # type: ignore[attr-defined]  # a cached property, untyped

    files = [getattr(sys.modules.get(name), "__file__", None) for name in TRACEBACK_MODULES]
    return [plain, *(functools.partial(parsed, f) for f in files if f)]


def reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def fork_one(sock: socket.socket, request: ForkRequest, fds: list[int], said: bytes,
             imported: Imported, closing: tuple[int, ...]) -> None:
    """Fork the kernel ``request`` asks for; answer with its pid once it leads its session."""
    sync_r, sync_w = os.pipe()
    flush()
    # what the server holds goes where the cyclic collector never looks: a child's collections
    # would otherwise write into every object of TensorFlow's import, and each task would keep
    # its own copy of those pages (80 MB) instead of sharing the server's
    gc.freeze()
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
            quietly(traceback.print_exc)
        finally:
            quietly(flush)
            os._exit(code)
    os.close(sync_w)
    for end in fds:
        os.close(end)
    with contextlib.suppress(OSError):
        os.read(sync_r, 1)  # end of file once the child called setsid (or died)
    os.close(sync_r)
    send(sock, {"forked": request["id"], "pid": pid})


def become_kernel(request: ForkRequest, fds: list[int], said: bytes,
                  imported: Imported) -> int:
    """In the child: the task's stdio, limits, directory, environment and title; then the
    kernel, ending as a spawned kernel's interpreter does."""
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
    quietly(lambda: print(exc.code, file=sys.stderr))
    return 1


def interpreter_end() -> None:
    """A spawned interpreter's way out, before ``os._exit``: wait for the cells' non-daemon
    threads, then run the exit handlers."""
    import atexit

    # threading._shutdown: Py_FinalizeEx's first step
    quietly(threading._shutdown, atexit._run_exitfuncs)  # type: ignore[attr-defined]


def take_limits(request: ForkRequest) -> None:
    """The controller's umask and resource limits of the request, which a spawned kernel would
    inherit (the server's are those of the first start)."""
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
    """ipykernel read ``JPY_PARENT_PID`` as a class default at the server's import: the child's
    is given as the default so ``sys.argv`` stays a spawned kernel's."""
    from ipykernel.kernelapp import IPKernelApp

    trait = IPKernelApp.class_traits()["parent_handle"]
    trait.default_value = pid
    # traitlets copies immutable defaults into each new instance from this table
    initial = getattr(IPKernelApp, "_static_immutable_initial_values", None)
    if isinstance(initial, dict) and "parent_handle" in initial:
        initial["parent_handle"] = pid


def fresh_seeds() -> None:
    """NumPy's global generator, seeded once in the server, would give every task the same
    numbers (``random`` reseeds itself at fork)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        quietly(lambda: numpy.random.seed())


def set_title(title: str) -> None:
    """``ps`` and process tools see the command a cold kernel has (where setproctitle is)."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    quietly(lambda: setproctitle(title))


if __name__ == "__main__":
    # no interpreter shutdown: TensorFlow's import left threads and exit handlers that can hold
    # it up, and the controller is gone (or done with this server) when main returns
    code = main(sys.argv[1:])
    quietly(flush)
    os._exit(code)
