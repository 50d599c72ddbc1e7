"""tfdist_nb: launch, drive and debug multi-worker TensorFlow clusters from a Jupyter notebook.

``%load_ext tfdist_nb`` registers the magics. Importing the package is cheap: the cluster core
(jupyter_client, pandas) loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["CheckReport", "Cluster", "IsolateReport", "RunResult", "TaskResult",
           "check_tf_config", "current", "load_ipython_extension", "unload_ipython_extension"]

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from tfdist_nb.cluster.checks import check_tf_config
    from tfdist_nb.cluster.facade import Cluster
    from tfdist_nb.cluster.registry import current
    from tfdist_nb.diagnostics.isolate_report import IsolateReport
    from tfdist_nb.diagnostics.report import CheckReport
    from tfdist_nb.results import RunResult, TaskResult


#: what a public name is imported from, on first use
_LAZY = {"Cluster": "tfdist_nb.cluster.facade", "current": "tfdist_nb.cluster.registry",
         "check_tf_config": "tfdist_nb.cluster.checks",
         "IsolateReport": "tfdist_nb.diagnostics.isolate_report",
         "CheckReport": "tfdist_nb.diagnostics.report",
         "RunResult": "tfdist_nb.results", "TaskResult": "tfdist_nb.results"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfdist_nb' has no attribute {name!r}")


def load_ipython_extension(ipython: InteractiveShell) -> None:
    from tfdist_nb.errors import platform_refusal

    if said := platform_refusal():
        from IPython.core.error import UsageError

        raise UsageError(said)
    from tfdist_nb.magics.tfcluster import MAGICS

    for magics in MAGICS:
        ipython.register_magics(magics)


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """Unloading ends what the extension started (the session's one close), and persistent
    mode, whose input transformer would otherwise send later cells to a cluster that is gone."""
    from tfdist_nb.cluster.session import SESSION
    from tfdist_nb.magics.run import RunMagics

    for magics in ipython.magics_manager.registry.values():
        if isinstance(magics, RunMagics):
            magics.mode.turn_off()
    SESSION.close()
