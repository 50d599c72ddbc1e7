"""Hatch build hook: the prebuilt lab extension, built only if it is missing ("skip if exists").

``tfdist_nb/labextension/`` is committed, so ``pip install`` (editable too) needs no Node. Without
it (a checkout that deleted it), the hook runs ``jlpm install --immutable`` and ``jlpm build`` in
``labextension/``; a wheel then fails if that fails, an editable install only warns.
"""

from __future__ import annotations

import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

OUTPUT = Path("tfdist_nb", "labextension")
NEEDED = ("package.json", "static/style.js")


class LabExtensionHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        if all((root / OUTPUT / name).exists() for name in NEEDED):
            return
        jlpm = shutil.which("jlpm")
        try:
            if jlpm is None:
                raise RuntimeError("jlpm not found (pip install jupyterlab) and the prebuilt "
                                   f"extension {OUTPUT} is missing")
            src = root / "labextension"
            subprocess.run([jlpm, "install", "--immutable"], cwd=src, check=True)
            subprocess.run([jlpm, "build"], cwd=src, check=True)
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            if version == "editable":
                warnings.warn(f"tfdist-nb lab extension not built: {exc}", stacklevel=1)
                return
            raise
