"""One way to run a real Jupyter server (or JupyterLab) for a test, and to find Chromium.

Each server gets its own config and runtime directories (never the user's), its run-directory
base in ``TFDIST_RUNS_DIR``, a fresh token, a loopback port, and a log file kept beside it; it is
terminated (then killed) when the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support.processes import free_port, wait_for

CHROMIUM = os.environ.get("TFDIST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]
#: JupyterLab without its news and update checks (nothing leaves the machine)
LAB_QUIET = ["--LabApp.news_url=",
             "--LabApp.check_for_updates_class="
             "jupyterlab.handlers.announcements.NeverCheckForUpdate"]


@contextlib.contextmanager
def jupyter_server(root: Path, runs_dir: Path, app: str = "server",
                   extra_args: Sequence[str] = ()) -> Iterator[dict[str, str]]:
    """``jupyter <app>`` serving ``root``: yields ``{"base", "token", "log"}``."""
    token, port = secrets.token_hex(16), free_port()
    env = {**os.environ, "TFDIST_RUNS_DIR": str(runs_dir),
           "JUPYTER_CONFIG_DIR": str(root / "jupyter-config"),
           "JUPYTER_RUNTIME_DIR": str(root / "jupyter-runtime")}
    log_path = root / f"jupyter-{app}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", app, "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
             "--allow-root", *(LAB_QUIET if app == "lab" else ()), *extra_args],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                return True
        except OSError:
            return proc.poll() is not None

    try:
        wait_for(up, 60, f"jupyter {app} to answer")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        yield {"base": base, "token": token, "log": str(log_path)}
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def ensure_chromium() -> str:
    """Debian's chromium (Playwright's own browser download is not used): installed with apt-get
    when missing and we are root on Debian, as on CI; otherwise the test says what to install."""
    if Path(CHROMIUM).exists():
        return CHROMIUM
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=True, env=env,
                       timeout=900)
    assert Path(CHROMIUM).exists(), (
        f"{CHROMIUM} missing: install Debian's chromium (apt-get install chromium) or set "
        "TFDIST_CHROMIUM to a Chromium binary")
    return CHROMIUM
