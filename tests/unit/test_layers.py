"""The package's import graph points one way: each layer imports only the layers below it, so no
import needs a TYPE_CHECKING guard to break a cycle (CONTRIBUTING.md, The code)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import psoperator

PACKAGE = Path(psoperator.__file__).parent
# Lowest first; the units of one layer do not import each other.
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer.split())
    for layer in (
        "psoperator contract timeutil managed_fields faults fields",
        "api",
        "sizing",
        "observe render",
        "status",
        "policies",
        "plan",
        "kube metrics",
        "control reference",
        "handlers cli",
        "__main__",
    )
)


def _unit(module: str) -> str:
    """The layer unit of a module `psoperator.x[.y]`: its subpackage or top-level module, `x`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "psoperator"


def _layer(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def _imports(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name for name in found if name == "psoperator" or name.startswith("psoperator.")]


@functools.cache
def _sources() -> list[tuple[str, ast.Module]]:
    """Each module of the package, as (its unit, its syntax tree)."""
    sources = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        unit = "psoperator" if parts == ("__init__",) else parts[0]
        sources.append((unit, ast.parse(path.read_text(), str(path))))
    return sources


def test_every_unit_of_the_package_has_a_layer() -> None:
    units = {unit for unit, _ in _sources()}
    placed = set().union(*LAYERS)
    assert units == placed, f"unplaced: {sorted(units - placed)}; gone: {sorted(placed - units)}"


@pytest.mark.parametrize("unit", sorted(set().union(*LAYERS)))
def test_a_unit_imports_only_the_layers_below_it(unit: str) -> None:
    upward = sorted(
        {
            name
            for source, tree in _sources()
            if source == unit
            for name in _imports(tree)
            if _unit(name) != unit and _layer(_unit(name)) >= _layer(unit)
        }
    )
    assert upward == [], f"{unit} (layer {_layer(unit)}) imports {upward}"


def test_no_import_is_guarded_by_type_checking() -> None:
    guarded = [
        unit
        for unit, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
    ]
    assert guarded == []
