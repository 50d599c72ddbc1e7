"""A local cluster's TensorFlow ports are reachable by its tasks alone (docs/security.md).

Real tasks in the private network namespace the local launcher makes: the strategy trains over
its ports, which nothing outside answers (this process on the host's network, another uid, another
network namespace), while the tasks still reach out (a server on the host's outside address).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def outside_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


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
        # this process, on the host's network: loopback and the outside address
        assert connect_from([], "127.0.0.1", port).startswith("refused")
        if (address := outside_address()) is not None:
            assert connect_from([], address, port).startswith("refused")
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


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_the_tasks_keep_their_outbound_network(confined: Cluster) -> None:
    address = outside_address()
    if address is None:
        pytest.skip("this host has no address but loopback to reach out to")
    with socket.socket() as server:
        server.bind((address, 0))
        server.listen()
        port = server.getsockname()[1]

        def serve() -> None:
            for _ in range(2):
                conn, _ = server.accept()
                with conn:
                    conn.sendall(b"hello from outside")

        threading.Thread(target=serve, daemon=True).start()
        result = confined.run(f"import socket\nwith socket.create_connection(({address!r}, "
                              f"{port}), timeout=10) as s:\n    print(s.recv(64).decode())")
    assert result.ok, result.summary()
    assert {r.stdout.strip() for r in result.tasks.values()} == {"hello from outside"}


def test_a_private_network_with_tcp_kernel_channels_is_refused_with_why() -> None:
    with pytest.raises(SpecError, match="net='private' cannot be used with transport='tcp'"):
        Cluster(workers=2, launcher_options={"net": "private", "transport": "tcp"})
    with pytest.raises(SpecError, match="net must be one of auto, private, host, not 'lan'"):
        Cluster(workers=2, launcher_options={"net": "lan"})
