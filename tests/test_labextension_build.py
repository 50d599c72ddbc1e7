"""The prebuilt JupyterLab extension: shipped, installed, enabled, and still built by its source.

``tfdist_nb/labextension/`` is built from ``labextension/`` and committed, so installing the
package needs no Node. These tests check that the installed copy is that output and enabled
(with the server extension), that a wheel carries both, and (CI) that a clean rebuild from
``yarn.lock`` gives the same files; ``remoteEntry.<hash>.js`` and the ``_build.load`` entry that
names it may change with the absolute build path, so those two are left out of the comparison
(``labextension/rspack.config.js`` names modules and chunks by their relative paths, which keeps
the chunks themselves the same wherever they are built).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.remote_hosts import in_ci

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "labextension"
PREBUILT = REPO / "tfdist_nb" / "labextension"
NAME = "tfdist-nb"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _without_remote_entry(files: dict[str, bytes]) -> dict[str, bytes]:
    out = {k: v for k, v in files.items() if not re.fullmatch(r"static/remoteEntry\.\w+\.js", k)}
    meta = json.loads(out["package.json"])
    meta["jupyterlab"]["_build"].pop("load")
    out["package.json"] = json.dumps(meta, sort_keys=True).encode()
    return out


def test_prebuilt_output_is_whole_and_small() -> None:
    files = _files(PREBUILT)
    meta = json.loads(files["package.json"])
    assert meta["name"] == NAME
    assert meta["version"] == json.loads((SOURCE / "package.json").read_text())["version"]
    entry = meta["jupyterlab"]["_build"]["load"]
    assert entry in files, f"{entry} named by package.json is missing"
    # every chunk is one the remote entry loads: no stale output of an earlier build
    remote = files[entry].decode()
    chunks = [m for name in files
              if (m := re.fullmatch(r"static/(?!remoteEntry\.)(\w+)\.(\w+)\.js", name))]
    assert chunks
    for chunk in chunks:
        assert chunk.group(2) in remote, f"{chunk.group(0)} is not loaded by {entry}: rebuild"
    total = sum(len(v) for v in files.values())
    assert total < 200_000, f"prebuilt output is {total} bytes"


@pytest.mark.cluster
def test_installed_copy_is_the_prebuilt_output_and_enabled() -> None:
    prefix_ext = Path(sysconfig.get_paths()["data"]) / "share" / "jupyter" / "labextensions" / NAME
    assert prefix_ext.is_dir(), f"{prefix_ext} missing: pip install -e . (it installs shared data)"
    installed = _files(prefix_ext)
    assert installed.pop("install.json")
    assert installed == _files(PREBUILT), (
        "the installed lab extension differs from tfdist_nb/labextension: pip install -e . again")
    out = _jupyter("labextension", "list")
    assert re.search(r"^\s*tfdist-nb v\S+ enabled OK", out, re.M), out
    out = _jupyter("server", "extension", "list")
    assert re.search(r"^\s*tfdist_nb\.lab enabled", out, re.M), out
    assert re.search(r"Validating tfdist_nb\.lab\.\.\.\s*tfdist_nb\.lab +OK", out), out


def _jupyter(*args: str) -> str:
    """What ``jupyter ARGS`` prints, without colours, outside any user config."""
    env = {**os.environ, "JUPYTER_CONFIG_DIR": "/nonexistent-tfdist-test"}
    proc = subprocess.run([sys.executable, "-m", "jupyter", *args], capture_output=True,
                          text=True, timeout=120, env=env)
    return re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_wheel_ships_the_lab_extension_and_the_server_config(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheel = next(tmp_path.glob("tfdist_nb-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"{wheel.name.split('-py3')[0]}.data/data/"
    for rel in _files(PREBUILT):
        assert f"{data}share/jupyter/labextensions/{NAME}/{rel}" in names, rel
    assert f"{data}share/jupyter/labextensions/{NAME}/install.json" in names
    assert f"{data}etc/jupyter/jupyter_server_config.d/tfdist_nb.json" in names
    assert "tfdist_nb/lab/handlers.py" in names
    assert not any("node_modules" in n for n in names)


def _tool_or_skip(cmd: list[str], what: str) -> None:
    try:
        ok = subprocess.run(cmd, capture_output=True, text=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        if in_ci():
            pytest.fail(f"{what} is needed to rebuild the lab extension under CI")
        pytest.skip(f"{what} not available here")


@pytest.mark.cluster
@pytest.mark.timeout(420)
def test_rebuild_from_yarn_lock_gives_the_committed_output(tmp_path: Path) -> None:
    """A clean ``jlpm install --immutable`` (the lock must be current) and build."""
    # this interpreter's scripts first (jlpm, and jupyter-builder that the build runs): the
    # README's test command runs the venv's python without activating the venv
    path = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
    jlpm = shutil.which("jlpm", path=path)
    if jlpm is None:
        if in_ci():
            pytest.fail("jlpm missing: the test extra installs jupyterlab, which brings it")
        pytest.skip("jlpm missing")
    _tool_or_skip(["node", "--version"], "Node.js")
    _tool_or_skip(["npm", "view", "@jupyterlab/application", "version"], "the npm registry")
    work = tmp_path / "labextension"
    work.mkdir()
    for name in ("package.json", "yarn.lock", ".yarnrc.yml", "tsconfig.json", "rspack.config.js"):
        shutil.copy(SOURCE / name, work / name)
    for name in ("src", "style"):
        shutil.copytree(SOURCE / name, work / name)
    env = {**os.environ, "PATH": path, "YARN_ENABLE_PROGRESS_BARS": "false"}
    for cmd in ([jlpm, "install", "--immutable"], [jlpm, "build:lib"],
                [sys.executable, "-m", "jupyter", "labextension", "build", "."]):
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300,
                              env=env)
        assert proc.returncode == 0, f"{cmd}: {proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    built = _files(tmp_path / "tfdist_nb" / "labextension")
    committed = _files(PREBUILT)
    assert _without_remote_entry(built) == _without_remote_entry(committed), (
        "the committed tfdist_nb/labextension is not what labextension/ builds: run "
        "`jlpm install && jlpm build` in labextension/ and commit the output")
    assert len(built) == len(committed)
