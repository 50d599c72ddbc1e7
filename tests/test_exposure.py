"""A local cluster's TensorFlow ports: which listen on every interface, said once, and true."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import remote_hosts
from tests.remote_hosts import TestHosts
from tfdist_nb import Cluster
from tfdist_nb.cluster.exposure import describe, exposed, listening
from tfdist_nb.host_os import tcp_table_listeners

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
   0: 00000000:4E21 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0
   1: 0100007F:4E22 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0
   2: 0100007F:4E23 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0
"""
TCP6 = """  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:4E24 00000000000000000000000000000000:0000 0A
"""


def test_the_socket_tables_say_how_each_port_is_bound() -> None:
    tables = tcp_table_listeners(TCP) + tcp_table_listeners(TCP6)
    assert listening(tables) == {20001: {"every interface"}, 20002: {"loopback"},
                                 20004: {"every interface"}}
    # a connected socket (st 01) on 20003 is not a listener
    assert exposed({"worker:0": 20001, "worker:1": 20002, "worker:2": 20003,
                    "worker:3": 20004}, tables) == {"worker:0": 20001, "worker:3": 20004}
    assert describe({"worker:1": 20004, "worker:0": 20001}).startswith(
        "TensorFlow's gRPC server of worker:0 (port 20001), worker:1 (port 20004) listens on "
        "every interface of this host, without authentication")


def connect_from_host(hosts: TestHosts, address: str, port: int) -> str:
    """Connect from inside a fake host (a network namespace on the tests' own bridge)."""
    alias = hosts.aliases[0]
    probe = ("import socket, sys\ntry:\n"
             "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()\n"
             "    print('connected')\nexcept OSError as exc:\n    print('refused', exc)\n")
    out = subprocess.run(["ip", "netns", "exec", hosts.namespaces[alias], sys.executable, "-c",
                          probe, address, str(port)], capture_output=True, text=True,
                         timeout=30)
    return out.stdout.strip() or out.stderr.strip()


def this_host_on_the_bridge(hosts: TestHosts) -> str:
    """This machine's address on the fake hosts' bridge: how another host reaches it."""
    return str(ipaddress.IPv4Network(hosts.subnet)[1])


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_on_the_host_network_the_strategy_opens_every_tf_port_and_that_is_said_once(
        tmp_path: Path) -> None:
    with Cluster(workers=2, launcher_options={"net": "host"}) as c:
        assert c.network().startswith("host network (net='host'): the TF ports listen on "
                                      "every interface of this host")
        assert c.tf_exposure() == {}  # no TF server before a strategy
        assert c.exposure_note() is None
        ok = c.run("import tensorflow as tf\n"
                   "strategy = tf.distribute.MultiWorkerMirroredStrategy()")
        assert ok.ok, ok.summary()
        ports = {rt.name: int(rt.address.rpartition(":")[2]) for rt in c.tasks.values()}
        assert c.tf_exposure() == ports
        said = c.exposure_note()
        assert said is not None and said.startswith(
            f"TensorFlow's gRPC server of worker:0 (port {ports['worker:0']}), worker:1 (port "
            f"{ports['worker:1']}) listens on every interface of this host")
        assert said.endswith("They are not confined to a private network: net='host'")
        assert c.exposure_note() is None  # once per set of ports
        logs = c.logs()
        assert list(logs[logs["text"] == said]["task"]) == ["cluster"]  # kept in the log
        # and it is true: another host (a fake one, on the tests' own bridge) reaches it
        with remote_hosts.fake_hosts(1, tmp_path / "hosts") as hosts:
            assert connect_from_host(hosts, this_host_on_the_bridge(hosts),
                                     ports["worker:0"]) == "connected"


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_tf_port_another_program_took_is_explained_and_a_restart_moves_to_fresh_ports(
        ) -> None:
    """Two notebooks on the host's network can draw the same free port: the second strategy
    fails to bind it. Here this test is the other program."""
    with Cluster(workers=2, warm=False, launcher_options={"net": "host"}) as c:
        w1 = next(rt for rt in c.tasks.values() if rt.name == "worker:1")
        address = w1.address
        port = int(address.rpartition(":")[2])
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("", port))
            other.listen()
            # worker:0 waits in the strategy's start-up for worker:1 until the cell's timeout
            failed = c.run("import tensorflow as tf\n"
                           "strategy = tf.distribute.MultiWorkerMirroredStrategy()",
                           timeout=15)
            assert not failed.ok
            explained = failed.tasks["worker:1"].explanation or ""
            assert explained.startswith("TensorFlow could not listen on this task's TF port"), \
                failed.summary()
            c.restart()
            notes = [a for a in c.alerts() if "is taken on its host" in a]
            assert notes == [f"worker:1: TF port {address} is taken on its host (another "
                             "program holds it, perhaps another notebook's cluster): every "
                             "task moves to fresh TF ports"]
            assert w1.address != address
            # a restart without spares onto fresh ports says so, in each task's log
            said = [t for t in c.logs(on="worker:1")["text"] if t.startswith("restarted ")]
            assert said[-1].endswith(f", forked from the fork server, on a fresh TF port "
                                     f"({w1.address})"), said
            ok = c.run("import tensorflow as tf\n"
                       "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
                       "print(float(strategy.reduce('SUM', tf.constant(1.0), axis=None)))")
            assert ok.ok, ok.summary()
