"""The folders show the architecture: each subpackage owns one concern, and imports
run one way, from studies down to config."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "serving_study"

# Lower layers never import higher ones. Peers of one rank may import each other.
LAYERS = {
    "config": 0,
    "sources": 1,
    "workloads": 1,
    "engine": 1,
    "servers": 2,
    "measure": 3,
    "analysis": 4,
    "report": 5,
    "studies": 6,
}


def concern(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_concerns(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "serving_study" and len(parts) > 1:
                found.add(parts[1])
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if concern(p) in LAYERS)


def test_every_module_belongs_to_a_known_concern():
    strays = [
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" or p.parent != PACKAGE
        if concern(p) not in LAYERS
    ]
    assert strays == []


def test_every_subpackage_says_what_it_owns():
    for directory in {p.parent for p in MODULES if p.parent != PACKAGE}:
        docstring = ast.get_docstring(
            ast.parse((directory / "__init__.py").read_text())
        )
        assert docstring and len(docstring) > 20, directory


def module_name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("module", MODULES, ids=module_name)
def test_imports_run_one_way(module):
    mine = LAYERS[concern(module)]
    upward = sorted(c for c in imported_concerns(module) if LAYERS.get(c, -1) > mine)
    assert upward == [], f"{concern(module)} may not import {upward}"


@pytest.mark.parametrize("module", MODULES, ids=module_name)
def test_no_module_outgrows_one_idea(module):
    assert len(module.read_text().splitlines()) <= 400
