"""Which run directories the server can see (the rules: docs/reference.md, JupyterLab panes).
Top-level folders are looked into because a notebook's kernel runs in the notebook's folder, so
its runs land next to it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from tfdist_nb.owned_files import regular_stat
from tfdist_nb.store.rundir import DEFAULT_ROOT

CLUSTER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
MAX_SUBDIRS = 200    # top-level folders of the root looked into
MAX_CLUSTERS = 200   # per base, newest first (ids begin with their start time)


def bases(root_dir: str | os.PathLike[str], extra: Iterable[str] = (),
          scan_subdirs: bool = True) -> list[Path]:
    root = Path(root_dir).expanduser()
    found = [root / DEFAULT_ROOT]
    if scan_subdirs:
        try:
            children = sorted(e.name for e in os.scandir(root)
                              if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
        except OSError:
            children = []
        found += [root / name / DEFAULT_ROOT for name in children[:MAX_SUBDIRS]]
    env = os.environ.get("TFDIST_RUNS_DIR")
    if env:
        found.append(Path(env).expanduser())
    found += [Path(p).expanduser() for p in extra]
    unique: dict[str, Path] = {}
    for base in found:
        try:
            key = str(base.resolve())
        except OSError:
            continue
        if key not in unique and base.is_dir():
            unique[key] = Path(key)
    return list(unique.values())


def is_run_dir(path: Path) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False
    return any(regular_stat(path / name) is not None for name in ("state.json", "events.jsonl"))


def find_clusters(base_dirs: Iterable[Path]) -> dict[str, Path]:
    """Cluster id -> run directory, newest first; the first base wins an id seen twice."""
    out: dict[str, Path] = {}
    for base in base_dirs:
        try:
            names = sorted((n for n in os.listdir(base) if CLUSTER_ID.match(n)), reverse=True)
        except OSError:
            continue
        kept = 0
        for name in names:
            if kept >= MAX_CLUSTERS:
                break
            if name not in out and is_run_dir(base / name):
                out[name] = base / name
                kept += 1
    return dict(sorted(out.items(), reverse=True))
