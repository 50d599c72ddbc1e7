"""Launchers by short name: the built-in ones are imported only when asked for, and other
packages add theirs through the ``tfdist_nb.launchers`` entry-point group (name -> class)."""

from __future__ import annotations

import difflib
import importlib
import logging
from collections.abc import Mapping
from importlib.metadata import entry_points

from tfdist_nb.debuglog import swallowed
from tfdist_nb.errors import SpecError
from tfdist_nb.launchers.base import Launcher

logger = logging.getLogger(__name__)

BUILTIN = {
    "local": "tfdist_nb.launchers.local:LocalLauncher",
    "ssh": "tfdist_nb.launchers.ssh:SSHLauncher",
    "attach": "tfdist_nb.launchers.attach:AttachLauncher",
    "slurm": "tfdist_nb.launchers.slurm:SlurmLauncher",
    "ray": "tfdist_nb.launchers.ray_launcher:RayLauncher",
}
_added: dict[str, type[Launcher]] = {}


def register(name: str, cls: type[Launcher]) -> None:
    """Make ``cls`` available as ``launcher=name`` in this process."""
    _added[name] = cls


_scanned: list[dict[str, str]] = []  # the entry-point group, as last read


def _plugins(fresh: bool = False) -> dict[str, str]:
    """The launchers other packages add (name -> ``module:Class``), read once per process (it
    takes milliseconds, asked on every line); ``fresh``: read again."""
    if fresh or not _scanned:
        _scanned[:] = [{ep.name: ep.value for ep in entry_points(group="tfdist_nb.launchers")}]
    return _scanned[0]


def available(fresh: bool = False) -> list[str]:
    return sorted({*BUILTIN, *_plugins(fresh), *_added})


def unknown(name: str) -> SpecError:
    """The error for a launcher name no launcher has: the closest name, and all of them."""
    close = difflib.get_close_matches(str(name), available(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return SpecError(f"unknown launcher {name!r}{hint}; choose one of {', '.join(available())}")


def launcher_class(name: str) -> type[Launcher]:
    if name in _added:
        return _added[name]
    target = BUILTIN.get(name) or _plugins().get(name) or _plugins(fresh=True).get(name)
    if target is None:
        raise unknown(name)
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def launcher_classes() -> dict[str, type[Launcher]]:
    """Every available launcher's class, built-in first, for their flags; one that cannot be
    imported is left out (logged), so a broken plugin takes no other's flags away."""
    classes: dict[str, type[Launcher]] = {}
    for name in [*BUILTIN, *(n for n in available() if n not in BUILTIN)]:
        with swallowed(logger):
            classes[name] = launcher_class(name)
    return classes


def get_launcher(name: str, **options: object) -> Launcher:
    """A launcher by short name (``local``, ``ssh``, ``attach``, ``slurm``, ``ray``) made with
    ``options``."""
    cls = launcher_class(name)
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"launcher {name!r}: {exc}") from None


def make_launcher(name: str, hosts: list[str] | None, python: str | None,
                  options: Mapping[str, object] | None) -> Launcher:
    """The named launcher with what it takes of the cluster's arguments."""
    cls = launcher_class(name)
    return get_launcher(name, **cls.cluster_options(hosts, python, dict(options or {})))
