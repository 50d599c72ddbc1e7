"""The fast layer's guard (tests/conftest.py): ``pytest -m "not cluster"`` starts no kernel,
server, browser or fake host, and a test that starts one unmarked fails saying how to mark it."""

from __future__ import annotations

import pytest

from tests.conftest import heavy_command

PY = "/venv/bin/python"


@pytest.mark.parametrize("line", [
    f"nsenter --target=1 --net -- {PY} -m tfdist_nb.worker.kernel -f kernel-connection.json",
    f"{PY} -m tfdist_nb.worker --task worker:0 --connection-dir /tmp/c",
    f"{PY} -m tfdist_nb.launchers.zygote 34 server.log tensorflow",
    f"{PY} -m ipykernel_launcher -f kernel.json",
    f"ssh -F cfg -- tfdhost1 cd /w && exec {PY} -m tfdist_nb.worker.remote --pid-file x",
    f"{PY} -m jupyter server --no-browser --ServerApp.port=8888",
    f"{PY} -m jupyter lab",
    "ip netns exec tfdh-1 /usr/sbin/sshd -D -e -f sshd_config-1",
    "nsenter --net=/run/netns/n1 /usr/sbin/slurmd -D",
    "/venv/lib/python3.11/site-packages/playwright/driver/node cli.js run-driver",
])
def test_kernels_servers_browsers_and_fake_hosts_are_heavy(line: str) -> None:
    assert heavy_command(line.split())


@pytest.mark.parametrize("line", [
    f"{PY} -c import sys, tfdist_nb, tfdist_nb.worker; print(sys.modules)",
    f"unshare --net {PY} -c from tfdist_nb.worker.telemetry import Telemetry",
    f"{PY} -m jupyter kernelspec list --json",
    f"{PY} -m jupyter server extension list",
    f"{PY} -m jupyter labextension list",
    f"{PY} -m mypy",
    "ip netns pids tfdh-1",
    "sleep 300",
])
def test_plain_commands_are_not_heavy(line: str) -> None:
    assert not heavy_command(line.split())


def test_an_unmarked_test_that_starts_a_kernel_fails_and_a_marked_one_passes(
        pytester: pytest.Pytester) -> None:
    """Runs the guard's hooks in an inner session; the "kernel" is ``sh`` given a worker
    kernel's words as arguments, so nothing heavy really starts."""
    pytester.makeini("[pytest]\nmarkers = cluster: heavy\n")
    pytester.makeconftest("from tests.conftest import pytest_runtest_protocol, "
                          "pytest_runtest_teardown  # noqa: F401\n")
    pytester.makepyfile("""
        import subprocess
        import pytest

        KERNEL = ["sh", "-c", "exit 0", "-m", "tfdist_nb.worker.kernel"]

        def test_unmarked():
            subprocess.run(KERNEL, check=True)

        @pytest.mark.cluster
        def test_marked():
            subprocess.run(KERNEL, check=True)

        def test_plain():
            subprocess.run(["sh", "-c", "exit 0"], check=True)
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines([
        "*test_unmarked is not marked cluster but started*tfdist_nb.worker.kernel*: mark it "
        "@pytest.mark.cluster*"])
