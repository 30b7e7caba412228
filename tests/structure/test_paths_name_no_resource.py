"""The paths where the runtime applies a grant (podman's precreate, NRI) loop over the
resources and name none: they import no resource's module, so adding a resource changes
neither (tests/nri/test_every_path.py shows one reaching both)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import numa_pin
from numa_pin.resources.node.registry import node_resources

SRC = Path(numa_pin.__file__).parent
PATHS = [SRC / "hook" / "precreate.py", *sorted((SRC / "nri").glob("*.py"))]


def _resource_modules() -> set[str]:
    """Every module that defines a registered resource's class or one of its bases."""
    out: set[str] = set()
    for resource in node_resources():
        for cls in type(resource).__mro__:
            module = cls.__module__
            if module.startswith("numa_pin.resources.") and not module.endswith((".base", ".runtime")):
                out.add(module)
    return out


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_resource_modules_are_known():
    assert {"numa_pin.resources.node.cpu", "numa_pin.resources.node.gpu", "numa_pin.resources.node.vf",
            "numa_pin.resources.memory"} <= _resource_modules()


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_a_path_imports_no_resource(path):
    named = _imports(path) & _resource_modules()
    assert not named, f"{path.relative_to(SRC)} names resources: {sorted(named)}"
