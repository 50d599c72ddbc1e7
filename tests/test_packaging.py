"""Static contracts: the shipped kernel spec, the public API names, cheap import, layering."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_shipped_kernel_spec_matches_the_launcher() -> None:
    from tfdist_nb.launchers.local import worker_kernel_spec

    shipped = json.loads((REPO / "kernels" / "tfdist-worker" / "kernel.json").read_text())
    built = worker_kernel_spec("python").to_dict()
    for key in ("argv", "display_name", "language", "interrupt_mode", "metadata"):
        assert shipped[key] == built[key], key


def test_public_names_of_the_spec() -> None:
    import tfdist_nb
    from tfdist_nb import Cluster

    for name in ("Cluster", "current", "load_ipython_extension", "unload_ipython_extension",
                 "CheckReport", "check_tf_config", "RunResult", "TaskResult", "IsolateReport"):
        assert hasattr(tfdist_nb, name)
    for method in ("start", "run", "status", "logs", "stacks", "env", "check", "interrupt",
                   "restart", "stop", "dashboard", "isolate", "report", "export", "__enter__",
                   "__exit__"):
        assert callable(getattr(Cluster, method)), method


def test_importing_the_package_is_cheap() -> None:
    code = ("import sys, tfdist_nb, tfdist_nb.worker; "
            "heavy = [m for m in ('tensorflow', 'pandas', 'jupyter_client', 'zmq', 'IPython') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_layering_contracts_hold() -> None:
    """Pure modules import no IPython/zmq/widgets; the worker side imports no controller code."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_types_check_in_the_controller_and_pure_modules() -> None:
    """mypy over the files ``[tool.mypy]`` in pyproject.toml names."""
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "tfdist_nb", "tests", "bench"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_quickstart_notebook_runs_the_tested_training_cells() -> None:
    """The quickstart's training cells are the ones the test suite runs (tests/cells/)."""
    import nbformat

    nb = nbformat.read(REPO / "examples" / "01_quickstart.ipynb", as_version=4)
    bodies = [c.source.split("\n", 1)[1] for c in nb.cells
              if c.cell_type == "code" and c.source.startswith("%%tfcluster 2 workers")]
    cells = REPO / "tests" / "cells"
    assert bodies == [(cells / "mwms_loop.py").read_text(), (cells / "tf_keras_fit.py").read_text()]


def test_the_oldest_leg_pins_every_lower_bound_pyproject_claims() -> None:
    """.ci/oldest.txt (CI's oldest leg, docs/reference.md "Supported versions") pins each
    dependency at the lower bound pyproject.toml admits: a floor raised in one place only
    would leave a claimed version untested."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    claimed = [Requirement(r) for r in
               [*project["dependencies"], *project["optional-dependencies"]["lab"]]]
    floors = {}
    for req in claimed:
        low = [s.version for s in req.specifier if s.operator == ">="]
        assert len(low) == 1, f"{req}: one lower bound, tested in .ci/oldest.txt"
        floors[req.name] = low[0]
    pinned = {}
    for line in (REPO / ".ci" / "oldest.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pinned[name.strip()] = version.strip()
    assert set(pinned) == set(floors)
    for name, floor in floors.items():
        # the floor itself, or a release of it where the floor names none (tensorflow 2.16 was
        # first released as 2.16.1)
        low, pin = Version(floor), Version(pinned[name])
        assert pin.release[:len(low.release)] == low.release, (name, floor, pinned[name])


def test_no_import_cycle_and_no_module_over_450_lines() -> None:
    """The package's modules import one way (imports under ``TYPE_CHECKING`` and inside
    functions counted: grimp reads every import statement), and none outgrows one job."""
    import grimp

    graph = grimp.build_graph("tfdist_nb")
    inside = {m for m in graph.modules if m.startswith("tfdist_nb.")}
    cycles = [(a, b) for a in sorted(inside) for b in graph.find_modules_directly_imported_by(a)
              if b in inside and b != a and graph.chain_exists(importer=b, imported=a)]
    assert not cycles, f"modules that import each other, directly or around: {cycles[:5]}"
    long = {str(p.relative_to(REPO)): n for p in (REPO / "tfdist_nb").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 450}
    assert not long, f"modules over 450 lines: {long}"


def test_every_module_the_package_imports_is_a_declared_dependency() -> None:
    """What a user's ``pip install`` brings is enough (the Binder image and the README's
    first command have nothing else): every module tfdist_nb imports, also lazily, is the
    standard library's or comes with pyproject's dependencies or one of its extras, directly
    or through theirs (never only through the test tools)."""
    import importlib.metadata as md
    import re

    import grimp
    tomllib = __import__("tomllib")

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = {k: v for k, v in project["optional-dependencies"].items() if k != "test"}
    wanted = [*project["dependencies"], *(r for reqs in extras.values() for r in reqs)]

    def name(req: str) -> str:
        return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower().replace("_", "-")

    brought: set[str] = set()
    todo = [name(r) for r in wanted]
    while todo:
        dist = todo.pop()
        if dist in brought:
            continue
        brought.add(dist)
        try:
            needs = md.requires(dist) or []
        except md.PackageNotFoundError:
            continue  # an extra not installed here (ray): its own name is enough
        todo.extend(name(r) for r in needs if "extra ==" not in r)
    graph = grimp.build_graph("tfdist_nb", include_external_packages=True)
    imported = {m for m in graph.modules if not m.startswith("tfdist_nb")}
    owners = md.packages_distributions()
    missing = {m: owners.get(m) for m in imported - set(sys.stdlib_module_names)
               if not {d.lower().replace("_", "-") for d in owners.get(m, [m])} & brought}
    assert not missing, f"imported but not brought by pyproject's dependencies: {missing}"
