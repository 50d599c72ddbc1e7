"""What Ray says when a notebook cannot connect, in the notebook's terms (docs/remote.md, Ray).

Ray refuses a notebook whose Ray or Python minor version differs from the cluster's
(``ray._private.utils.check_version_info``). Ray Client's proxy forks a server per connection
from a multi-threaded gRPC process and some forks die ("Starting Ray client server failed",
Ray's issue 63202); a new connection gets a new fork, so the launcher tries ``SPAWN_TRIES``.
"""

from __future__ import annotations

import re

#: connections tried while the head's Ray Client proxy fails to start their servers
SPAWN_TRIES = 3
_SPAWN_FAILED = "Starting Ray client server failed"
#: "Version mismatch: The cluster was started with: Ray: X Python: Y
#: This process on ... was started with: Ray: A Python: B"
_MISMATCH = re.compile(r"cluster was started with:\s*Ray: (\S+)\s*Python: (\S+)\s*"
                       r"This process on .*? was started with:\s*Ray: (\S+)\s*Python: (\S+)",
                       re.S)


def spawn_failed(text: str, tries: int = 0) -> str:
    """What to add to a failure to connect when ``text`` is Ray Client's server failing to
    start (how often, ``tries``, and why), else nothing."""
    if _SPAWN_FAILED not in text:
        return ""
    return (f" (its Ray Client server on the head failed to start {tries} time(s) in a row: "
            "Ray's proxy forks one per connection and some forks die, Ray's issue 63202; "
            "its logs: ray_client_server_*.err in the head's Ray session logs)")


def version_mismatch(text: str, target: str) -> str | None:
    """Ray's refusal of a notebook whose Ray (or Python minor) differs from the cluster's, said
    with both versions and the one step that fixes it; None when ``text`` is not one."""
    if (m := _MISMATCH.search(text)) is None:
        return None
    ray_there, py_there, ray_here, py_here = m.groups()
    fix = (f"pip install 'ray[client]=={ray_there}' in the notebook's environment, then "
           "restart the notebook's kernel" if ray_there != ray_here else
           f"run the notebook on Python {py_there.rpartition('.')[0]}, as the cluster does")
    return (f"Ray's version differs between this notebook and the Ray cluster at {target}: "
            f"the notebook has Ray {ray_here} (Python {py_here}), the cluster Ray {ray_there} "
            f"(Python {py_there}), and Ray connects only the same Ray (and Python minor "
            f"version); {fix}")
