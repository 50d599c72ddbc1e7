"""Every magic class of the extension, by topic (docs/reference.md, Magics)."""

from __future__ import annotations

from tfdist_nb.magics.diagnose import DiagnoseMagics
from tfdist_nb.magics.inspect import InspectMagics
from tfdist_nb.magics.run import RunMagics
from tfdist_nb.magics.teach import TeachMagics

MAGICS = (RunMagics, InspectMagics, DiagnoseMagics, TeachMagics)

__all__ = ["MAGICS", "DiagnoseMagics", "InspectMagics", "RunMagics", "TeachMagics"]
