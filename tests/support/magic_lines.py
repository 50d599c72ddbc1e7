"""A parsed ``%%tfcluster`` line without IPython: the namespace its arguments make."""

from __future__ import annotations

import argparse

from tfdist_nb.magics.request import ClusterRequest, build_request


def request(spec: str = "", **kw: object) -> ClusterRequest:
    """``build_request`` of a line with SPEC ``spec`` and the given options."""
    ns = argparse.Namespace(spec=spec.split(), on=None, env=None, timeout=None,
                            stall_timeout=None, restart=False, python=None, hosts=None,
                            launcher=None, connection_dir=None, no_dashboard=False)
    for key, value in kw.items():
        setattr(ns, key, value)
    return build_request(ns)
