"""State has one owner passed in, never a module global (issue 39). No module under src/numa_pin
rebinds a module global (a ``global`` statement) or mutates a dict, list or set made at module
level, but for the few things that are the process's by nature, listed here with their reason.
The ledger's encode and decode memos and the boot time liveness reads once a second were such
globals; they live on their owners now (:class:`~numa_pin.ledger.reader.ReadCache`,
:class:`~numa_pin.ledger.liveness.BootTimes`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "numa_pin"

#: ``(module, name)``: the module state that stays process-wide, and why
ALLOWED = {
    ("base/deadline.py", "_main"): "the main thread's deadline owns SIGALRM, one per process",
    ("config/load.py", "_loader_class"): "a YAML loader class built from code only, once",
    ("enforcer/bpfdev.py", "_LIB"): "the libbpf handle: a library is loaded once per process",
    ("nri/messages.py", "_LOADED"): "the package's own protobuf descriptors, read once",
    ("resources/node/registry.py", "_EXTRA"): "the plugin registry: register() is process-wide by design",
}
#: what a call can be made to mutate a container with
MUTATORS = frozenset(("append", "add", "update", "clear", "pop", "popitem", "setdefault", "extend", "insert",
                      "remove", "discard", "sort", "reverse", "difference_update", "intersection_update",
                      "symmetric_difference_update", "appendleft", "extendleft", "popleft"))
#: the calls that make a mutable container
MAKERS = frozenset(("dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "bytearray"))


def _mutable(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in MAKERS
    return False


def _containers(tree: ast.Module) -> set[str]:
    """The names bound at module level to a mutable container."""
    out = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and _mutable(stmt.value):
            out |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and _mutable(stmt.value):
            out.add(stmt.target.id)
    return out


def module_state(source: str) -> list[tuple[str, int]]:
    """``(name, line)`` of each ``global`` statement's names and each mutation of a module-level
    container in the module ``source``."""
    tree = ast.parse(source)
    containers = _containers(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found += [(name, node.lineno) for name in node.names]
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            found += [(t.value.id, node.lineno) for t in targets
                      if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name)
                      and t.value.id in containers]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
              and isinstance(node.func.value, ast.Name) and node.func.value.id in containers):
            found.append((node.func.value.id, node.lineno))
    return found


def _package_state() -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for name, line in module_state(path.read_text()):
            out.setdefault((rel, name), []).append(line)
    return out


def test_no_module_holds_state_but_the_process_wide_few() -> None:
    stray = {f"{module}:{lines[0]} {name}" for (module, name), lines in _package_state().items()
             if (module, name) not in ALLOWED}
    assert not stray, f"module state; give it an owner that is passed in (issue 39): {sorted(stray)}"


def test_the_allowed_state_is_still_there() -> None:
    """An entry whose state went away goes from :data:`ALLOWED` too (the list stays short)."""
    assert set(ALLOWED) <= set(_package_state())


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("_C = None\ndef f():\n    global _C\n    _C = 1\n", ["_C"]),
        ("_D: dict[str, int] = {}\ndef f(k):\n    _D[k] = 1\n", ["_D"]),
        ("_D = {}\ndef f():\n    _D.clear()\n    _D.update(x=1)\n", ["_D", "_D"]),
        ("_L = []\ndef f(x):\n    _L.append(x)\n", ["_L"]),
        ("_S = set()\ndef f(x):\n    _S.add(x)\n", ["_S"]),
        ("_D = dict()\ndef f(k):\n    del _D[k]\n", ["_D"]),
        ("_D = {}\ndef f(k):\n    _D[k] += 1\n", ["_D"]),
        ("_T = (1, 2)\nKEYS = frozenset()\n", []),
        ("_D = {'a': 1}\ndef f(k):\n    return _D.get(k)\n", []),
        ("def f():\n    d = {}\n    d['a'] = 1\n    d.clear()\n", []),
    ],
    ids=["global", "setitem", "clear-update", "append", "set-add", "delitem", "augmented", "immutable",
         "read-only", "local"],
)
def test_what_counts_as_module_state(source: str, found: list[str]) -> None:
    """The scanner's own table: it finds what the package test must refuse, and no more."""
    assert [name for name, _ in module_state(source)] == found
