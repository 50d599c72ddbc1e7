"""Binder and the worker kernel spec, proven (issue 12).

``test_binder_install_runs_the_quickstart`` builds the environment the way Binder (repo2docker)
does: a fresh virtual environment (not ``--system-site-packages``), ``pip install -r
binder/requirements.txt``, then ``binder/postBuild`` run from the repository root, and in it
imports the extension and runs the quickstart. It installs TensorFlow and the rest into a new
venv (minutes), so it runs when ``TFDIST_BINDER_TEST=1`` is set, and under CI (``CI`` set) when
what decides the image changed since it last passed: ``binder/verified.txt`` holds the
fingerprint of binder/'s files and pyproject's dependencies it passed with (the run prints the
new one to record). The rest of what it proves is proven on every run: the package on
pyproject's dependencies alone (tests/test_packaging.py), the quickstart (tests/test_notebook.py).
The kernel spec tests are quick and always run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BINDER = REPO / "binder"
SHIPPED = REPO / "kernels" / "tfdist-worker"


def _requirements(text: str) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line.replace(" ", "") for line in lines if line]


def test_binder_requirements_are_the_package_requirements() -> None:
    """binder/requirements.txt is pyproject's dependencies plus its "lab" extra, no more, no
    less, so a Binder image has what ``pip install -e ".[lab]"`` would give; postBuild installs
    the package itself without touching them."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["lab"]
    assert sorted(_requirements((BINDER / "requirements.txt").read_text())) == sorted(
        r.replace(" ", "") for r in wanted)
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert runtime.startswith("python-3.")
    low = tuple(int(x) for x in project["requires-python"].lstrip(">=").split("."))
    assert tuple(int(x) for x in runtime.removeprefix("python-").split(".")) >= low
    post = BINDER / "postBuild"
    assert os.access(post, os.X_OK) and post.read_text().startswith("#!/usr/bin/env bash")
    assert "pip install --no-cache-dir -e ." in post.read_text()


def _repo_copy(dest: Path) -> Path:
    """What a clone of this checkout holds: tracked files and new ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _venv_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTEST_CURRENT_TEST")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def binder_fingerprint() -> str:
    """What decides the Binder image: binder/'s files and the dependencies they mirror."""
    tomllib = __import__("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    digest = hashlib.sha256()
    for name in ("requirements.txt", "postBuild", "runtime.txt"):
        digest.update((BINDER / name).read_bytes())
    digest.update(json.dumps([project["requires-python"], project["dependencies"],
                              project["optional-dependencies"]["lab"]]).encode())
    return digest.hexdigest()[:16]


def _verified() -> str:
    path = BINDER / "verified.txt"
    return path.read_text().split()[0] if path.exists() else ""


def _binder_run() -> str | None:
    """Why the Binder install is not run now; None: run it."""
    if os.environ.get("TFDIST_BINDER_TEST"):
        return None
    if not os.environ.get("CI"):
        return ("installs TensorFlow into a fresh venv (minutes): set TFDIST_BINDER_TEST=1 (CI "
                "runs it when binder/ or the dependencies changed)")
    if _verified() == binder_fingerprint():
        return (f"binder/ and the dependencies are as when it last passed "
                f"(binder/verified.txt: {_verified()}); TFDIST_BINDER_TEST=1 runs it anyway")
    return None


def test_the_recorded_binder_fingerprint_is_well_formed() -> None:
    """binder/verified.txt holds a fingerprint of the form binder_fingerprint() makes (else
    CI would run the install every time without saying why)."""
    assert len(_verified()) == 16 and int(_verified(), 16) >= 0


@pytest.mark.cluster
@pytest.mark.timeout(1800)
def test_binder_install_runs_the_quickstart(tmp_path: Path) -> None:
    if why := _binder_run():
        pytest.skip(why)
    repo = _repo_copy(tmp_path / "repo")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = _venv_env(venv)
    python = str(venv / "bin" / "python")

    def step(cmd: list[str], timeout: float,
             cwd: Path = repo) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        return proc

    # repo2docker: requirements first (Binder passes --no-cache-dir; here pip's cache is used
    # so that a second run does not download TensorFlow again), then postBuild from the root
    step([python, "-m", "pip", "install", "-r", "binder/requirements.txt"], 1500)
    step(["bash", "binder/postBuild"], 600)

    # installed (asked from outside the checkout): the package of this copy, in the venv only
    where = step([python, "-c", "import sys, tfdist_nb, tensorflow, tf_keras; "
                  "print(tfdist_nb.__file__); print(sys.prefix)"], 300, tmp_path).stdout.split()
    assert where[0].startswith(str(repo)) and where[1] == str(venv)
    loaded = step([python, "-c", "from IPython.core.interactiveshell import InteractiveShell; "
                   "ip = InteractiveShell.instance(); ip.run_line_magic('load_ext', 'tfdist_nb'); "
                   "print('tfcluster' in ip.magics_manager.magics['cell'])"], 300, tmp_path)
    assert loaded.stdout.strip() == "True"

    saved = tmp_path / "quickstart.ipynb"
    run = step([python, "-m", "tfdist_nb", "quickstart", "--no-colour", "--save", str(saved),
                "--notebook", str(repo / "examples" / "01_quickstart.ipynb")], 600, tmp_path)
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] {task} final loss" in run.stdout
        assert f"[{task}] keras tf_keras" in run.stdout
    assert "stopped 2 task(s) of 2 workers" in run.stdout
    assert saved.is_file()
    print(f"passed: record it with: echo '{binder_fingerprint()} <date>' > binder/verified.txt")


def test_the_kernel_spec_installs_with_jupyter_kernelspec(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "install",
                           str(SHIPPED), "--prefix", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    installed = tmp_path / "share" / "jupyter" / "kernels" / "tfdist-worker" / "kernel.json"
    assert json.loads(installed.read_text()) == json.loads((SHIPPED / "kernel.json").read_text())
    listed = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"],
                            env={**os.environ, "JUPYTER_PATH": str(tmp_path / "share" /
                                                                  "jupyter")},
                            capture_output=True, text=True, timeout=120, check=True)
    assert "tfdist-worker" in json.loads(listed.stdout)["kernelspecs"]


def _install_marked_spec(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped spec installed where Jupyter looks (JUPYTER_PATH), with one variable added
    to its ``env``: an administrator's local change."""
    target = base / "share" / "jupyter" / "kernels" / "tfdist-worker"
    shutil.copytree(SHIPPED, target)
    spec = json.loads((target / "kernel.json").read_text())
    spec["env"] = {"TFDIST_SPEC_MARK": "installed"}
    (target / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(base / "share" / "jupyter"))


def test_the_launcher_takes_the_installed_spec_when_there_is_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tfdist_nb.launchers.local import task_kernel_spec, worker_kernel_spec

    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "none"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    built = task_kernel_spec("/opt/py/bin/python3")
    if built.resource_dir:  # one installed outside the test's reach (system-wide)
        pytest.skip(f"a tfdist-worker kernel spec is installed at {built.resource_dir}")
    assert built.to_dict() == worker_kernel_spec("/opt/py/bin/python3").to_dict()
    _install_marked_spec(tmp_path, monkeypatch)
    spec = task_kernel_spec("/opt/py/bin/python3")
    assert spec.resource_dir.startswith(str(tmp_path))
    assert spec.argv[0] == "/opt/py/bin/python3"  # the bare "python" is the worker interpreter
    assert spec.argv[1:] == worker_kernel_spec("python").argv[1:]
    assert spec.env == {"TFDIST_SPEC_MARK": "installed"}


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_task_starts_from_the_installed_spec(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from tfdist_nb import Cluster

    _install_marked_spec(tmp_path, monkeypatch)
    with Cluster(workers=1, preload=()) as cluster:
        result = cluster.run("import os, sys; print(os.environ.get('TFDIST_SPEC_MARK'), "
                             "sys.executable)", timeout=60)
    assert result.ok, result.summary()
    mark, executable = result.tasks["worker:0"].stdout.split()
    assert mark == "installed" and executable == sys.executable
