"""What the wheel installs and declares: one top-level package, and exactly the dependencies it imports."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "agentwake"


def _runtime_imports(path: Path) -> set[str]:
    """Top-level module names a file imports at run time (not under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_distribution_installs_only_the_agentwake_package() -> None:
    top_level = importlib.metadata.distribution("agentwake").read_text("top_level.txt") or ""
    assert top_level.split() == ["agentwake"]


def test_the_declared_dependencies_are_exactly_the_distributions_the_package_imports() -> None:
    modules: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        modules |= _runtime_imports(path)
    modules -= set(sys.stdlib_module_names) | {"agentwake"}
    owners = importlib.metadata.packages_distributions()
    unknown = sorted(m for m in modules if m not in owners)
    assert not unknown, f"imported but installed by no distribution: {unknown}"
    imported = {_normalized(owners[m][0]) for m in modules}
    requirements = importlib.metadata.requires("agentwake") or []
    declared = {
        _normalized(re.split(r"[ <>=!~;\[]", requirement, maxsplit=1)[0])
        for requirement in requirements
        if "extra ==" not in requirement
    }
    assert imported == declared, (
        f"imported but not declared: {sorted(imported - declared)}; "
        f"declared but not imported: {sorted(declared - imported)}"
    )


def test_importing_agentwake_changes_nothing_in_the_environment() -> None:
    script = (
        "import json, os, sys; before = dict(os.environ);"
        "import agentwake, agentwake.cli, agentwake.config, agentwake.store;"
        "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))"
    )
    env = {"PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    assert json.loads(result.stdout) == {}


def test_the_public_names_load_on_first_use_and_import_agentwake_stays_light() -> None:
    script = (
        "import json, sys, agentwake;"
        "light = sorted(m for m in ('mcp', 'aiohttp', 'litellm', 'pydantic', 'sqlite_utils') if m in sys.modules);"
        "names = {n: type(getattr(agentwake, n)).__name__ for n in agentwake.__all__};"
        "print(json.dumps({'light': light, 'names': names, 'dir': sorted(set(agentwake.__all__) - set(dir(agentwake)))}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, check=True
    )
    report = json.loads(result.stdout)
    assert report["light"] == []
    assert report["dir"] == []
    import agentwake

    assert agentwake.__all__ == sorted(agentwake.__all__)
    assert agentwake.Outcome.__module__ == "agentwake.decide"
    assert report["names"]["StoreError"] == "type" and report["names"]["run_service"] == "function"
