"""A private network for local tasks: their TensorFlow ports reachable by them alone.

One network namespace (in a user namespace this user owns) per controller process, shared by
its local clusters so a spare fits whichever takes it; slirp4netns gives it outbound network.
Why and what it keeps out: docs/security.md. It ends with the controller: the holder exits when
its stdin closes, slirp4netns when its exit pipe does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tfdist_nb.debuglog import swallowed
from tfdist_nb.diagnostics.crash import describe_exit
from tfdist_nb.errors import TfdistError
from tfdist_nb.owned_files import private_temp_dir

logger = logging.getLogger(__name__)

NET_MODES = ("auto", "private", "host")
READY_TIMEOUT_S = 10.0
#: slirp4netns's own confinement, most first (docs/security.md): its sandbox (a mount
#: namespace of its own, capabilities dropped) needs privileges an ordinary user's slirp4netns
#: lacks outside the namespace's user namespace; seccomp needs a build with libseccomp
CONFINEMENTS = (("--enable-sandbox", "--enable-seccomp"), ("--enable-seccomp",), ())
SLIRP_DNS = "10.0.2.3"
_LOOPBACK_NS = ("127.", "::1")


class PrivateNetUnavailable(TfdistError, RuntimeError):
    """This machine cannot give local tasks a private network (the message says why)."""


def needs_own_resolver(resolv_conf: str) -> bool:
    """Whether every nameserver is on the host's loopback, out of the namespace's reach."""
    servers = [parts[1] for line in resolv_conf.splitlines()
               if len(parts := line.split()) >= 2 and parts[0] == "nameserver"]
    return bool(servers) and all(s.startswith(_LOOPBACK_NS) for s in servers)


@dataclass
class PrivateNetwork:
    """The namespace's holder process, and slirp4netns giving it the outbound network."""

    holder: subprocess.Popen[bytes]
    slirp: subprocess.Popen[bytes] | None = None
    scratch: Path | None = None  # the private resolv.conf's directory
    wants_outbound: bool = True  # made to have one (slirp4netns started, where found)
    #: in a user namespace (an ordinary user); not for root, whose tasks would lose root's
    #: file access (root mapped into a user namespace is unprivileged outside it)
    user_ns: bool = True
    _slirp_exit: int | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.holder.pid

    def alive(self) -> bool:
        return self.holder.poll() is None

    @property
    def outbound(self) -> str:
        """How the tasks reach out now, said in the cluster's start line."""
        if self.slirp is None:
            return ("no outbound network (slirp4netns not found)" if self.wants_outbound else
                    "no outbound network")
        if ended := self.slirp_ended():
            return f"no outbound network: {ended}"
        return "outbound through slirp4netns"

    def slirp_ended(self) -> str | None:
        """How slirp4netns ended, when it did (the tasks lost their outbound network)."""
        if self.slirp is None or (code := self.slirp.poll()) is None:
            return None
        return f"slirp4netns (pid {self.slirp.pid}) {describe_exit(code)}"

    def revive_outbound(self) -> None:
        """A new slirp4netns after the last one ended, for the running tasks too. Blocking;
        ``PrivateNetUnavailable`` if it does not come up."""
        if self.slirp_ended() is None:
            return
        self._close_exit_pipe()
        old, self.slirp = self.slirp, None
        if old is not None:
            old.wait()
            if old.stderr is not None:
                old.stderr.close()
        _start_slirp(self)

    def _close_exit_pipe(self) -> None:
        """Close slirp4netns's exit pipe (it ends when the pipe does)."""
        if self._slirp_exit is not None:
            with contextlib.suppress(OSError):
                os.close(self._slirp_exit)
            self._slirp_exit = None

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace, as this user with this user's credentials."""
        user = ["--user"] if self.user_ns else []
        spaces = [*user, "--net"] + (["--mount"] if self.scratch is not None else [])
        return ["nsenter", f"--target={self.pid}", *spaces,
                *(["--preserve-credentials"] if user else []), "--", *argv]

    def close(self) -> None:
        with swallowed(logger):
            if self.holder.stdin is not None:
                self.holder.stdin.close()
        self._close_exit_pipe()
        for proc in (self.slirp, self.holder):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def _missing_tools() -> list[str]:
    return [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]


def create(outbound: bool = True, resolv: Path = Path("/etc/resolv.conf")) -> PrivateNetwork:
    """A new namespace with loopback up (and outbound, with slirp4netns); PrivateNetUnavailable
    says what is missing. ``resolv``: the resolver file the tasks would read."""
    if missing := _missing_tools():
        raise PrivateNetUnavailable(f"{', '.join(missing)} not found (util-linux, iproute2)")
    scratch = None
    setup = "ip link set lo up || exit 3"
    with contextlib.suppress(OSError):
        if outbound and needs_own_resolver(resolv.read_text()):
            scratch = private_temp_dir("net")  # 0700; a killed notebook's are removed
            (scratch / "resolv.conf").write_text(f"nameserver {SLIRP_DNS}\n")
            os.chmod(scratch / "resolv.conf", 0o644)
            setup += f" && mount --bind {scratch}/resolv.conf {resolv} || exit 4"
    user_ns = os.geteuid() != 0
    argv = ["unshare", *(["--user", "--map-current-user", "--keep-caps"] if user_ns else []),
            "--net", *(["--mount"] if scratch is not None else []), "--",
            "sh", "-c", f"{setup}; echo up; read _"]
    holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, start_new_session=True)
    net = PrivateNetwork(holder, scratch=scratch, wants_outbound=outbound, user_ns=user_ns)
    try:
        assert holder.stdout is not None  # its one line: "up", or nothing once it failed
        ready = select.select([holder.stdout], [], [], READY_TIMEOUT_S)[0]
        said = holder.stdout.readline().decode(errors="replace").strip() if ready else ""
        if said != "up":
            err = ""
            with contextlib.suppress(subprocess.TimeoutExpired):
                holder.wait(timeout=1)
                assert holder.stderr is not None
                err = holder.stderr.read().decode(errors="replace").strip()
            raise PrivateNetUnavailable(
                f"could not make a network namespace: {err or said or 'no answer'} (user "
                "namespaces may be off: sysctl kernel.unprivileged_userns_clone, or "
                "kernel.apparmor_restrict_unprivileged_userns)")
        if outbound:
            _start_slirp(net)
        return net
    except BaseException:
        net.close()
        raise


def _start_slirp(net: PrivateNetwork) -> None:
    """slirp4netns on the namespace (``tap0``, NAT, no inbound port), as confined as this user
    and build allow: it parses the tasks' packets."""
    slirp = shutil.which("slirp4netns")
    if slirp is None:
        return
    for flags in CONFINEMENTS:
        try:
            _run_slirp(net, slirp, flags)
            return
        except PrivateNetUnavailable as exc:
            if not flags:
                raise
            logger.debug("slirp4netns with %s failed (%s); trying with less", flags, exc)


def _run_slirp(net: PrivateNetwork, slirp: str, flags: tuple[str, ...]) -> None:
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    try:
        net.slirp = subprocess.Popen(
            [slirp, "--configure", "--mtu=65520", "--disable-host-loopback", *flags,
             *([f"--userns-path=/proc/{net.pid}/ns/user"] if net.user_ns else []),
             f"--ready-fd={ready_w}",
             f"--exit-fd={exit_r}", str(net.pid), "tap0"],
            pass_fds=(ready_w, exit_r), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True)
    finally:
        os.close(ready_w)
        os.close(exit_r)
    ready = select.select([ready_r], [], [], READY_TIMEOUT_S)[0]
    answer = os.read(ready_r, 1) if ready else b""
    os.close(ready_r)
    if answer != b"1":
        os.close(exit_w)  # a slirp4netns still starting ends with its exit pipe
        err = ""
        with contextlib.suppress(subprocess.TimeoutExpired):
            net.slirp.wait(timeout=2)
        if net.slirp.poll() is None:
            net.slirp.kill()
            net.slirp.wait()
        if net.slirp.stderr is not None:
            last = net.slirp.stderr.read().decode(errors="replace").strip().splitlines()[-1:]
            err = last[0] if last else ""
            net.slirp.stderr.close()
        net.slirp = None
        raise PrivateNetUnavailable(f"slirp4netns did not configure the namespace: "
                                    f"{err or 'no answer'}")
    net._slirp_exit = exit_w


# ------------------------------------------------------------------ one per process
_lock = threading.Lock()
_shared: PrivateNetwork | None = None


#: why ``net="auto"`` keeps the tasks on the host's network where slirp4netns is missing, and
#: the one step that confines them (docs/security.md)
NO_OUTBOUND = ("slirp4netns not found, and a private network without it would cost the tasks "
               "their outbound network (downloads, DNS); to confine the TF ports and keep it, "
               "install slirp4netns (apt install slirp4netns, dnf install slirp4netns); "
               "--net private confines them without it")


def shared(outbound: bool = False) -> PrivateNetwork:
    """This process's private network, made on first use (again if its holder ended);
    PrivateNetUnavailable where none can be made, or, with ``outbound`` (``net="auto"``), none
    with outbound network: asked again next time, a tool installed meanwhile counts."""
    global _shared
    with _lock:
        if outbound and shutil.which("slirp4netns") is None and (
                _shared is None or _shared.slirp is None):
            raise PrivateNetUnavailable(NO_OUTBOUND)
        if _shared is not None and _shared.alive() and (_shared.slirp or not outbound):
            _shared.revive_outbound()  # the next start makes a new one (docs/security.md)
            return _shared
        if _shared is not None:
            _shared.close()
        _shared = create()
        return _shared


def close_shared() -> None:
    """End this process's private network (the session's close, after its clusters)."""
    global _shared
    with _lock:
        if _shared is not None:
            _shared.close()
            _shared = None

