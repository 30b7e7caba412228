"""The layer table of DEVELOPERS.md holds for every import under src/numa_pin.

The table is read from DEVELOPERS.md itself, so the document and the code cannot drift apart.
Imports are read from the source (AST), function-level imports included.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
FACADES = {"numa_pin.config", "numa_pin.ledger", "numa_pin.testing"}


def layer_table(text: str) -> list[tuple[int, str]]:
    """``[(rank, pattern)]`` from the markdown table whose header starts with ``| rank |``."""
    rows: list[tuple[int, str]] = []
    in_table = False
    for line in text.splitlines():
        if line.startswith("| rank |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            break
        if in_table and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows += [(int(cells[0]), name) for name in re.findall(r"`(numa_pin[\w.*]*)`", cells[2])]
    return rows


def rank_of(module: str, table: list[tuple[int, str]]) -> int | None:
    exact = [r for r, p in table if p == module]
    if exact:
        return exact[0]
    matches = sorted(((len(p), r) for r, p in table
                      if "*" in p and (fnmatch.fnmatchcase(module, p) or f"{module}.*" == p)), reverse=True)
    return matches[0][1] if matches else None


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "numa_pin").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every numa_pin module ``name`` imports, at any depth of the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


MODULES = modules()
GRAPH = {name: imports_of(name, path, set(MODULES)) for name, path in MODULES.items()}
TABLE = layer_table((ROOT / "DEVELOPERS.md").read_text())


def test_the_table_is_read():
    assert len(TABLE) > 20 and {r for r, _ in TABLE} == set(range(11))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_has_a_layer(module):
    assert rank_of(module, TABLE) is not None, f"{module} is not placed in DEVELOPERS.md's layer table"


def test_no_upward_import():
    upward = []
    for src, targets in GRAPH.items():
        for dst in targets:
            if rank_of(dst, TABLE) > rank_of(src, TABLE):
                upward.append(f"{src} (rank {rank_of(src, TABLE)}) imports {dst} (rank {rank_of(dst, TABLE)})")
    assert not upward, "\n".join(sorted(upward))


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; returns every component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle():
    assert strongly_connected(GRAPH) == []


def test_cycle_finder_finds_a_cycle():
    """The checker itself can fail: a planted cycle is reported."""
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_rank_lookup_prefers_the_most_specific_entry():
    table = [(1, "numa_pin.policy.hint"), (2, "numa_pin.policy.*"), (6, "numa_pin.*")]
    assert rank_of("numa_pin.policy.hint", table) == 1
    assert rank_of("numa_pin.policy.merge", table) == 2
    assert rank_of("numa_pin.policy", table) == 2  # a package's pattern covers the package itself
    assert rank_of("numa_pin.reporting.report", table) == 6


@pytest.mark.parametrize("package", sorted(n for n, p in MODULES.items() if p.name == "__init__.py"))
def test_package_inits_import_nothing(package):
    if package == "numa_pin" or package in FACADES:
        return
    assert GRAPH[package] == set(), f"{package}/__init__.py imports {sorted(GRAPH[package])}"


def test_only_tests_use_the_test_kit():
    users = sorted(s for s, t in GRAPH.items() if not s.startswith("numa_pin.testing")
                   and any(d.startswith("numa_pin.testing") for d in t))
    assert users == []


def package_graph(graph: dict[str, set[str]], rank=lambda module: 0) -> dict[str, set[str]]:
    """The import graph between packages: the modules of ``numa_pin.X`` that share a ``rank``
    are one node, ``numa_pin.X (rank N)``."""
    def package(module: str) -> str:
        return f"{'.'.join(module.split('.')[:2])} (rank {rank(module)})"

    out: dict[str, set[str]] = {}
    for src, targets in graph.items():
        out.setdefault(package(src), set()).update(package(d) for d in targets if package(d) != package(src))
    for targets in list(out.values()):
        for d in targets:
            out.setdefault(d, set())
    return out


def test_no_import_loop_between_packages():
    """Packages of one rank may import each other module by module without a module cycle (the
    agent's server ran numa_pin.entry.hook, whose hook asks the agent's client); such a loop
    between packages is still a tangle and fails here."""
    assert strongly_connected(package_graph(GRAPH, lambda m: rank_of(m, TABLE))) == []


def test_package_loop_finder_finds_a_loop_without_a_module_cycle():
    graph = {"numa_pin.a.x": {"numa_pin.b.y"}, "numa_pin.b.z": {"numa_pin.a.w"}, "numa_pin.a.w": set(),
             "numa_pin.b.y": set()}
    assert strongly_connected(graph) == []
    assert strongly_connected(package_graph(graph)) == [["numa_pin.a (rank 0)", "numa_pin.b (rank 0)"]]
    ranks = {"numa_pin.a.x": 1, "numa_pin.b.y": 0, "numa_pin.b.z": 1, "numa_pin.a.w": 0}
    assert strongly_connected(package_graph(graph, ranks.__getitem__)) == []  # one way between ranks


def test_no_import_loop_between_folders():
    """The folders (and the modules loose at the package root), whatever the ranks of their
    modules: a loop between them is a tangle a newcomer meets whichever way in."""
    assert strongly_connected(package_graph(GRAPH)) == []


def test_the_folder_loop_finder_ignores_ranks():
    graph = {"numa_pin.a.x": {"numa_pin.b.y"}, "numa_pin.b.z": {"numa_pin.a.w"}, "numa_pin.a.w": set(),
             "numa_pin.b.y": set()}
    assert strongly_connected(package_graph(graph)) == [["numa_pin.a (rank 0)", "numa_pin.b (rank 0)"]]
