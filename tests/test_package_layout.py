"""The folders show the architecture: each subpackage owns one concern, imports run
one way, from studies down to the ground floor, and no modules import each other in
a cycle."""

import ast
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "serving_study"

# Lower layers never import higher ones. Peers of one rank may import each other.
# The ground floor is config/ and the single modules beside the subpackages.
LAYERS = {
    "config": 0,
    "workloads": 0,
    "files": 0,
    "metric_catalogue": 0,
    "sources": 1,
    "engine": 1,
    "launch": 2,
    "servers": 3,
    "measure": 4,
    "analysis": 5,
    "report": 6,
    "studies": 7,
}

# Imports that the layers allow but a concern must not make. The report draws
# finished runs: what a metric is sits on the ground floor, not in measure/. The
# analysis is arithmetic on finished runs: whatever measures (runs a process, starts
# a server) lives in measure/ or studies/.
FORBIDDEN_IMPORTS = {
    "report": ("serving_study.measure",),
    "analysis": ("subprocess", "serving_study.servers"),
}


def concern(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def source_file(name: str) -> Path | None:
    """This package's file of the dotted module ``name``; None for another's."""
    parts = name.split(".")
    if parts[0] != "serving_study":
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """The dotted names of the modules ``path`` imports, anywhere in it: ``from a
    import b`` imports ``a``, and ``a.b`` too where that is one of this package's
    modules."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            submodules = (f"{node.module}.{alias.name}" for alias in node.names)
            found.update(name for name in submodules if source_file(name))
    return found


def imported_concerns(path: Path) -> set[str]:
    return {
        name.split(".")[1]
        for name in imported_modules(path)
        if name.startswith("serving_study.")
    }


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if concern(p) in LAYERS)


def module_name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


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


def test_single_modules_are_on_the_ground_floor():
    """A module beside the subpackages is what several concerns share (the
    workloads, file digests, the metric catalogue), so it imports only config/ and
    its peers."""
    singles = sorted(p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert [name for name in singles if LAYERS.get(name) != 0] == []


@pytest.mark.parametrize("module", MODULES, ids=module_name)
def test_imports_run_one_way(module):
    mine = LAYERS[concern(module)]
    upward = sorted(c for c in imported_concerns(module) if LAYERS.get(c, -1) > mine)
    assert upward == [], f"{concern(module)} may not import {upward}"


@pytest.mark.parametrize(
    "module",
    [p for p in MODULES if concern(p) in FORBIDDEN_IMPORTS],
    ids=module_name,
)
def test_no_concern_makes_an_import_it_must_not(module):
    forbidden = FORBIDDEN_IMPORTS[concern(module)]
    made = sorted(
        name
        for name in imported_modules(module)
        if any(name == f or name.startswith(f"{f}.") for f in forbidden)
    )
    assert made == [], f"{concern(module)} may not import {made}"


def test_no_modules_import_each_other_in_a_cycle():
    """Imports inside functions count too: deferring one hides a cycle from the
    interpreter, not from the design."""
    imports = {
        module: {source_file(name) for name in imported_modules(module)} - {None}
        for module in PACKAGE.rglob("*.py")
    }
    try:
        graphlib.TopologicalSorter(imports).prepare()
    except graphlib.CycleError as error:
        # graphlib lists each module before the modules that import it.
        cycle = " -> ".join(module_name(path) for path in reversed(error.args[1]))
        pytest.fail(f"modules import each other: {cycle}")


@pytest.mark.parametrize("module", MODULES, ids=module_name)
def test_no_module_outgrows_one_idea(module):
    assert len(module.read_text().splitlines()) <= 400
