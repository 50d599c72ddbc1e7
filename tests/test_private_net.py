"""A local cluster's TensorFlow ports are reachable by its tasks alone (docs/security.md).

Real tasks in the private network namespace the local launcher makes: the strategy trains over
its ports, which nothing outside answers (this process on the host's network, another uid,
another network namespace, another host), while the tasks still reach out (a server on another
host). The other hosts are the tests' own (tests/remote_hosts.py): no traffic leaves the machine.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import remote_hosts
from tests.remote_hosts import TestHosts
from tfdist_nb import Cluster
from tfdist_nb.errors import SpecError
from tfdist_nb.launchers import private_net
from tfdist_nb.launchers.private_net import needs_own_resolver

CONNECT = ("import socket, sys\n"
           "try:\n"
           "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()\n"
           "    print('connected')\n"
           "except OSError as exc:\n"
           "    print('refused', exc)\n")


def test_a_resolver_on_loopback_needs_one_of_its_own() -> None:
    assert needs_own_resolver("nameserver 127.0.0.53\noptions edns0\n")
    assert needs_own_resolver("nameserver ::1\n")
    assert not needs_own_resolver("nameserver 10.255.255.53\n")
    assert not needs_own_resolver("nameserver 127.0.0.53\nnameserver 1.1.1.1\n")
    assert not needs_own_resolver("")  # no nameserver: glibc's default, nothing to mend


def test_a_resolver_on_loopback_is_replaced_inside_the_namespace_alone(tmp_path: Path) -> None:
    if why := private_net_missing():
        pytest.skip(f"this machine cannot make the private network: {why}")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.53\n")  # systemd-resolved's stub, out of reach
    net = private_net.create(resolv=resolv)
    try:
        inside = subprocess.run(net.enter(["cat", str(resolv)]), capture_output=True,
                                text=True, timeout=30)
        assert inside.stdout == f"nameserver {private_net.SLIRP_DNS}\n", inside.stderr
        assert resolv.read_text() == "nameserver 127.0.0.53\n"  # the host's is untouched
    finally:
        net.close()
    assert net.scratch is not None and not net.scratch.exists()


def private_net_missing() -> str | None:
    try:
        private_net.create(outbound=False).close()
    except private_net.PrivateNetUnavailable as exc:
        return str(exc)
    if shutil.which("slirp4netns") is None:
        return "slirp4netns not found (apt-get install slirp4netns)"
    return None


@pytest.fixture(scope="module")
def confined() -> Iterator[Cluster]:
    if why := private_net_missing():
        pytest.skip(f"this machine cannot make the private network: {why}")
    with Cluster(workers=2, launcher_options={"net": "private"}) as c:
        result = c.run("import tensorflow as tf\n"
                       "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
                       "print(float(strategy.reduce('SUM', tf.constant(1.0), axis=None)))")
        assert result.ok, result.summary()
        assert [r.stdout.strip().splitlines()[-1] for r in result.tasks.values()] == \
            ["2.0", "2.0"]  # the tasks reach each other's TF ports
        yield c


def tf_ports(c: Cluster) -> list[int]:
    return [int(rt.address.rpartition(":")[2]) for rt in c.tasks.values()]


def connect_from(prefix: list[str], host: str, port: int,
                 preexec: object = None) -> str:
    # another uid may not read this interpreter's directory: the system's python3 then
    python = sys.executable if preexec is None else shutil.which("python3", path="/usr/bin")
    out = subprocess.run([*prefix, python or sys.executable, "-c", CONNECT, host, str(port)],
                         capture_output=True, text=True, timeout=30, cwd="/",
                         preexec_fn=preexec)  # type: ignore[arg-type]
    return out.stdout.strip() or out.stderr.strip()


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_no_one_outside_the_cluster_reaches_its_tf_ports(confined: Cluster) -> None:
    c = confined
    assert c.network().startswith("private network: the TF ports are reachable by these "
                                  "tasks alone (a network namespace of their own; outbound "
                                  "through slirp4netns)")
    assert c.tf_exposure() == {} and c.exposure_note() is None  # nothing to say: not open
    for port in tf_ports(c):
        # this process, on the host's network
        assert connect_from([], "127.0.0.1", port).startswith("refused")
        # another network namespace (made unprivileged, as any local user can)
        assert connect_from(["unshare", "--user", "--map-root-user", "--net"], "127.0.0.1",
                            port).startswith("refused")
    # the tasks' own view: their TF ports listen, in their namespace alone
    same = c.run("import os\nprint(os.environ['TFDIST_NETNS'])")
    assert {r.stdout.strip() for r in same.tasks.values()} == {"cluster"}
    assert set(c.status()["net_scope"]) == {"cluster-netns"}


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another uid needs root to "
                    "become one (the namespace test above covers every non-root user)")
def test_another_user_on_this_host_cannot_reach_them(confined: Cluster) -> None:
    def nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)

    for port in tf_ports(confined):
        assert connect_from([], "127.0.0.1", port, nobody).startswith("refused")
    # the same user in the same place reaches a port it opens: the probe itself works
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert connect_from([], "127.0.0.1", server.getsockname()[1], nobody) == "connected"


@pytest.fixture(scope="module")
def another_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """A fake host on the tests' own bridge (a network namespace with its own address)."""
    with remote_hosts.fake_hosts(1, tmp_path_factory.mktemp("hosts")) as hosts:
        yield hosts


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_another_host_cannot_reach_them(confined: Cluster, another_host: TestHosts) -> None:
    here = str(ipaddress.IPv4Network(another_host.subnet)[1])  # this machine, on the bridge
    netns = another_host.namespaces[another_host.aliases[0]]
    for port in tf_ports(confined):
        assert connect_from(["ip", "netns", "exec", netns], here, port).startswith("refused")
    # the probe itself works from there: sshd of the fake host answers it
    assert connect_from(["ip", "netns", "exec", netns], another_host.addresses[
        another_host.aliases[0]], 2222) == "connected"


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_the_tasks_keep_their_outbound_network(confined: Cluster,
                                               another_host: TestHosts) -> None:
    """The tasks reach a server on another host (through slirp4netns and this machine)."""
    alias = another_host.aliases[0]
    address = another_host.addresses[alias]
    server = subprocess.Popen(
        ["ip", "netns", "exec", another_host.namespaces[alias], sys.executable, "-c",
         "import socket, sys\ns = socket.socket()\ns.bind((sys.argv[1], 0))\ns.listen()\n"
         "print(s.getsockname()[1], flush=True)\nfor _ in range(2):\n"
         "    c, _ = s.accept()\n    c.sendall(b'hello from another host')\n    c.close()\n",
         address], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        result = confined.run(f"import socket\nwith socket.create_connection(({address!r}, "
                              f"{port}), timeout=10) as s:\n    print(s.recv(64).decode())")
        assert result.ok, result.summary()
        assert {r.stdout.strip() for r in result.tasks.values()} == {"hello from another host"}
    finally:
        server.kill()
        server.wait()


def test_a_private_network_with_tcp_kernel_channels_is_refused_with_why() -> None:
    with pytest.raises(SpecError, match="net='private' cannot be used with transport='tcp'"):
        Cluster(workers=2, launcher_options={"net": "private", "transport": "tcp"})
    with pytest.raises(SpecError, match="net='lan': choose one of auto, private, host"):
        Cluster(workers=2, launcher_options={"net": "lan"})


SERVE = b"a data set from the host's network"
FETCH = ("import urllib.request\n"
         "try:\n"
         "    print(urllib.request.urlopen({url!r}, timeout=10).read().decode())\n"
         "except OSError as exc:\n"
         "    print('unreachable', exc)\n")
#: a download as a tutorial's first cell does it: its error is the cell's
DOWNLOAD = ("import urllib.request\n"
            "print(urllib.request.urlopen({url!r}, timeout=10).read().decode())")


@pytest.fixture
def host_server() -> Iterator[str]:
    """An HTTP server on this host's own non-loopback address (what a task downloading a data
    set reaches through the host's network), serving ``SERVE``."""
    import http.server
    import threading

    import psutil

    address = next((a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                    if a.family == socket.AF_INET and not a.address.startswith("127.")), None)
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(SERVE)))
            self.end_headers()
            self.wfile.write(SERVE)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{address}:{server.server_address[1]}/data.csv"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.user
@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_without_slirp4netns_the_default_keeps_the_tasks_network_and_says_how_to_confine(
        host_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The machine most users have (no slirp4netns): net=auto puts the tasks on the host's
    network, where a download works, and the ready line (logged for a script) says so and the
    one step that confines them; --net private still confines them, says they have no outbound
    network, and a download's error there is explained with the cause and the fix, as is the
    network check's way out."""
    from tests.support.processes import path_without

    if private_net._missing_tools():
        pytest.skip("no unshare/nsenter/ip: the private network is never chosen here")
    monkeypatch.setenv("PATH", path_without("slirp4netns", tmp_path / "bin"))
    private_net.close_shared()  # a namespace with slirp4netns from an earlier test is not ours
    fetch = FETCH.format(url=host_server)
    with caplog.at_level("INFO", logger="tfdist_nb"), \
            Cluster(workers=2, preload=(), warm=False) as c:
        said = c.network()
        assert said.startswith("host network (slirp4netns not found, and a private network "
                               "without it would cost the tasks their outbound network"), said
        assert "install slirp4netns" in said and "--net private" in said
        # what a script sees: the same line, as a warning (the TF ports are open to the host's
        # network)
        logged = [r for r in caplog.records if r.name.startswith("tfdist_nb")
                  and said in r.getMessage()]
        assert [r.levelname for r in logged] == ["WARNING"], caplog.text
        result = c.run(fetch)
        assert {r.stdout.strip() for r in result.tasks.values()} == {SERVE.decode()}
        check = c.check("network")
        assert check.ok, str(check)  # the way out is there: nothing said against it
        assert list(check.table.columns) == ["worker:0", "worker:1", "outside"]
        assert check.table["outside"].notna().all(), str(check)
    if why := private_net_missing_namespace():
        pytest.skip(f"no network namespace here: {why}")
    caplog.clear()
    with caplog.at_level("INFO", logger="tfdist_nb"), Cluster(
            workers=1, preload=(), warm=False, launcher_options={"net": "private"}) as c:
        assert c.network().startswith("private network: the TF ports are reachable by these "
                                      "tasks alone (a network namespace of their own; no "
                                      "outbound network (slirp4netns not found))")
        assert "no outbound network" in caplog.text and "WARNING" in caplog.text
        out = c.run(fetch).tasks["worker:0"].stdout
        assert out.startswith("unreachable") and "Network is unreachable" in out, out
        failed = c.run(DOWNLOAD.format(url=host_server)).tasks["worker:0"]
        assert "Network is unreachable" in failed.error.evalue  # type: ignore[union-attr]
        assert failed.explanation == (
            "This task has no outbound network here: the tasks run in a private network "
            "without a path out (net='private' and slirp4netns not found). Fix: start the "
            "cluster with --net auto (the host's network here) or install slirp4netns (apt "
            "install slirp4netns, dnf install slirp4netns).")
        check = c.check("network")
        assert not check.ok and check.summary.startswith(
            "1 task(s) cannot reach this host's address"), str(check)
        assert any(d.startswith("no way out: worker:0 cannot reach") and
                   "Network is unreachable" in d and "slirp4netns not found" in d
                   for d in check.details), check.details
    private_net.close_shared()


def private_net_missing_namespace() -> str | None:
    try:
        private_net.create(outbound=False).close()
    except private_net.PrivateNetUnavailable as exc:
        return str(exc)
    return None


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_with_slirp4netns_the_default_confines_the_ports_and_keeps_the_download(
        host_server: str) -> None:
    """Beside the test above: where slirp4netns is, net=auto confines the TF ports and the
    task still downloads from the host's address."""
    if why := private_net_missing():
        pytest.skip(f"this machine cannot make the private network: {why}")
    with Cluster(workers=1, preload=(), warm=False) as c:
        assert c.network().startswith("private network: the TF ports are reachable by these "
                                      "tasks alone (a network namespace of their own; outbound "
                                      "through slirp4netns)")
        out = c.run(FETCH.format(url=host_server)).tasks["worker:0"].stdout
        assert out.strip() == SERVE.decode()


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_slirp4netns_ending_is_said_once_and_the_next_restart_brings_the_network_back(
        host_server: str) -> None:
    """slirp4netns killed under a running cluster: an alert names it at once (and only once),
    a download's error is explained by it, and a restart gives the tasks a new one."""
    import signal
    import time

    from tests.support.processes import wait_for

    if why := private_net_missing():
        pytest.skip(f"this machine cannot make the private network: {why}")
    private_net.close_shared()
    with Cluster(workers=1, preload=(), warm=False) as c:
        assert c.check("network").ok
        assert not [a for a in c.alerts() if "slirp4netns" in a]  # silent while it runs
        net = private_net._shared
        assert net is not None and net.slirp is not None
        pid = net.slirp.pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: [a for a in c.alerts() if "slirp4netns" in a], 10,
                 "an alert naming slirp4netns")
        failed = c.run(DOWNLOAD.format(url=host_server)).tasks["worker:0"]
        assert failed.explanation == (
            f"This task has no outbound network here: slirp4netns (pid {pid}) killed by "
            "SIGKILL: it was the tasks' path out of their private network. Fix: "
            "%tfdist_restart (or cluster.restart()) starts a new one.")
        assert f"no outbound network: slirp4netns (pid {pid}) killed by SIGKILL" in c.network()
        time.sleep(2 * 1.0)  # two more rounds of the watch (lifecycle.WATCH_S): still one alert
        said = [a for a in c.alerts() if "slirp4netns" in a]
        assert len(said) == 1 and said[0].endswith(
            "the tasks have no outbound network now (downloads and DNS fail): %tfdist_restart "
            "(or cluster.restart()) starts a new one"), said
        c.restart()
        assert net.slirp is not None and net.slirp.pid != pid and net.slirp.poll() is None
        assert c.network().endswith("outbound through slirp4netns)")
        out = c.run(FETCH.format(url=host_server)).tasks["worker:0"].stdout
        assert out.strip() == SERVE.decode()
    private_net.close_shared()


def test_a_misspelt_environment_switch_is_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFDIST_NET", "bogus")
    with pytest.raises(SpecError, match="TFDIST_NET=bogus: choose one of auto, private, host"):
        Cluster(workers=2)
    monkeypatch.delenv("TFDIST_NET")
    monkeypatch.setenv("TFDIST_FORK", "disable")  # it used to leave forking on, unsaid
    with pytest.raises(SpecError, match="TFDIST_FORK=disable: choose on or off"):
        Cluster(workers=2)
    monkeypatch.setenv("TFDIST_FORK", "off")
    assert not Cluster(workers=2).launcher.fork


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() != 0, reason="a root notebook's tasks (containers run as root)")
def test_a_root_notebooks_tasks_keep_roots_file_access_in_the_private_network(
        tmp_path: Path) -> None:
    """Root's tasks used to be root mapped into a user namespace: an unprivileged uid outside
    it, refused another user's 0600 file the notebook and net=host tasks read, chown EINVAL.
    Root makes the network namespace alone: its tasks stay root."""
    if why := private_net_missing_namespace():
        pytest.skip(f"no network namespace here: {why}")
    private_net.close_shared()
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    os.chmod(data, 0o600)
    os.chown(data, 65534, 65534)
    with Cluster(workers=1, preload=(), warm=False,
                 launcher_options={"net": "private"}) as c:
        out = c.run(f"import os\nprint(os.getuid(), open({str(data)!r}).read().split()[0])\n"
                    f"os.chown({str(data)!r}, 0, 0)\nprint('chowned')")
        assert out.ok, out.summary()
        assert out.tasks["worker:0"].stdout.split() == ["0", "a,b", "chowned"]
        assert os.environ.get("TFDIST_NETNS") is None  # the notebook itself is not inside
        said = c.run("import os\nprint(os.environ.get('TFDIST_NETNS'))").tasks["worker:0"]
        assert said.stdout.strip() == "cluster"  # the task is in the private network
    private_net.close_shared()
