"""What the Ray launcher says without a Ray cluster (the fast layer): Ray's own version check
in the notebook's terms, and Ray's version as ``%tfdist_env`` rows (docs/remote.md, Ray). The
same on a real head node of another Ray release: tests/test_ray_launcher.py."""

from __future__ import annotations

import sys

import pytest

from tfdist_nb.diagnostics.env_check import env_frame, with_launcher_rows
from tfdist_nb.launchers.ray_said import version_mismatch

PYTHON = ".".join(map(str, sys.version_info[:3]))


def _ray_refusal(cluster_ray: str, cluster_python: str) -> str:
    """The text Ray's own check raises (ray.init's, and Ray Client's handshake)."""
    utils = pytest.importorskip("ray._private.utils")
    with pytest.raises(RuntimeError) as err:
        utils.check_version_info({"ray_version": cluster_ray, "python_version": cluster_python},
                                 "Ray Client", raise_on_mismatch=True,
                                 python_version_match_level="minor")
    return str(err.value)


def test_a_ray_version_mismatch_is_named_with_both_versions_and_the_fix() -> None:
    import ray

    said = version_mismatch(_ray_refusal("2.0.1", PYTHON), "ray://head:10001")
    assert said == (
        "Ray's version differs between this notebook and the Ray cluster at ray://head:10001: "
        f"the notebook has Ray {ray.__version__} (Python {PYTHON}), the cluster Ray 2.0.1 "
        f"(Python {PYTHON}), and Ray connects only the same Ray (and Python minor version); "
        "pip install 'ray[client]==2.0.1' in the notebook's environment, then restart the "
        "notebook's kernel")


def test_a_python_minor_mismatch_names_the_python_to_run() -> None:
    import ray

    said = version_mismatch(_ray_refusal(ray.__version__, "3.9.18"), "ray://head:10001")
    assert said is not None and said.endswith("run the notebook on Python 3.9, as the "
                                              "cluster does")


def test_other_failures_are_not_called_a_version_mismatch() -> None:
    assert version_mismatch("Failed to connect to GCS at address head:6379", "head:6379") is None


def test_env_shows_rays_version_here_and_on_each_tasks_node() -> None:
    reports = {t: {"props": {"python": PYTHON}} for t in ("worker:0", "worker:1")}
    same = with_launcher_rows(env_frame(reports),
                              {"ray": ("2.60.0", {"worker:0": "2.60.0", "worker:1": "2.60.0"})})
    assert same.loc["ray", "worker:1"] == "2.60.0"
    assert same.loc["ray (notebook)", "worker:0"] == "2.60.0"
    assert not same["mismatch"].any()
    differ = with_launcher_rows(env_frame(reports),
                                {"ray": ("2.60.0", {"worker:0": "2.60.0", "worker:1": "2.58.0"})})
    assert list(differ.index[differ["mismatch"]]) == ["ray", "ray (notebook)"]
    assert differ.loc["ray", "worker:1"] == "2.58.0"


#: what Ray Client raises when the head's proxy could not start the connection's own server
#: (ray/util/client/server/proxier.py, Datapath; Ray's issue 63202)
SPAWN_FAILED = ("Initialization failure from server:\nTraceback (most recent call last):\n"
                '  File ".../ray/util/client/server/proxier.py", line 772, in Datapath\n'
                "    raise RuntimeError(\nRuntimeError: Starting Ray client server failed. See "
                "ray_client_server_23000.err for detailed logs.\n")


def test_a_ray_client_server_that_failed_to_start_is_tried_again_then_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's fork failing is Ray's (issue 63202): a new connection gets a new fork. The
    real retry on a real head: tests/test_ray_launcher.py (three starts in a row)."""
    import socket

    import ray

    from tfdist_nb.errors import ClusterStartError
    from tfdist_nb.launchers.ray_launcher import RayLauncher
    from tfdist_nb.launchers.ray_said import SPAWN_TRIES

    calls: list[str] = []

    def init(address: str, **_: object) -> None:
        calls.append(address)
        raise ConnectionAbortedError(SPAWN_FAILED)

    monkeypatch.setattr(ray, "init", init)
    with socket.socket() as head:  # the address answers: the failure is the proxy's
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"ray://127.0.0.1:{head.getsockname()[1]}"
        with pytest.raises(ClusterStartError) as err:
            RayLauncher(address=address)._connect(1)
    assert calls == [address] * SPAWN_TRIES
    assert (f"cannot connect to Ray at {address} (its Ray Client server on the head failed to "
            f"start {SPAWN_TRIES} time(s) in a row: Ray's proxy forks one per connection and "
            "some forks die, Ray's issue 63202") in str(err.value)
