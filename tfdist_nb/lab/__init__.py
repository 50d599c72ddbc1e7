"""The Jupyter server extension behind the JupyterLab panes (docs/reference.md, JupyterLab panes):
the run directories, read-only, under the server's own auth. It imports no controller code (an
import-linter contract), so the panes work while a kernel is busy or dead; its one way to a kernel
is a console on a live task (:mod:`tfdist_nb.lab.consoles`). Enabled by
``etc/jupyter/jupyter_server_config.d/tfdist_nb.json``, installed with the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from traitlets import Bool, Float, List, Unicode
from traitlets.config import Configurable

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

LABEXTENSION_NAME = "tfdist-nb"
LABEXTENSION_DIR = Path(__file__).resolve().parents[1] / "labextension"


class TfdistLab(Configurable):
    """Settings of the tfdist server extension (``c.TfdistLab.runs_dirs = [...]``)."""

    runs_dirs = List(Unicode(), help="More bases of run directories to serve").tag(config=True)
    scan_subdirs = Bool(True, help="Also look for tfdist_runs in the root's top-level "
                        "folders").tag(config=True)
    poll_interval = Float(0.5, help="Seconds between polls of the watched runs' "
                          "files").tag(config=True)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "tfdist_nb.lab"}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": str(LABEXTENSION_DIR), "dest": LABEXTENSION_NAME}]


def _load_jupyter_server_extension(serverapp: ServerApp) -> None:
    from jupyter_server.utils import url_path_join

    from tfdist_nb.lab.consoles import ConsoleHandler, TaskKernels
    from tfdist_nb.lab.discovery import bases
    from tfdist_nb.lab.handlers import (
        ClusterHandler,
        ClusterIndex,
        ClustersHandler,
        StreamHandler,
    )

    config = TfdistLab(parent=serverapp)
    index = ClusterIndex(lambda: bases(serverapp.root_dir, config.runs_dirs,
                                       config.scan_subdirs), serverapp.log,
                         poll_interval=config.poll_interval)
    web_app = serverapp.web_app
    web_app.settings["tfdist_index"] = index
    web_app.settings["tfdist_kernels"] = TaskKernels(serverapp.kernel_manager, index)
    base = url_path_join(web_app.settings["base_url"], "tfdist", "api", "clusters")
    cid = r"([A-Za-z0-9][A-Za-z0-9_-]{0,99})"
    web_app.add_handlers(".*$", [
        (base, ClustersHandler),
        (url_path_join(base, cid), ClusterHandler),
        (url_path_join(base, cid, "stream"), StreamHandler),
        (url_path_join(base, cid, "console"), ConsoleHandler),
    ])
    serverapp.log.info("tfdist_nb.lab: serving run directories at %s", base)
