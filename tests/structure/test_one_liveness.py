"""Every liveness decision in src/numa_pin goes through the service's one notion of alive
(issue 36, item 1): ``Node._alive`` in ``resources/node/base.py``, which adds the precreate grace
period and the boot check to :func:`~numa_pin.ledger.liveness.is_alive`. A second caller of the
plain check (``numa-pin recover`` was one) drops a pending grant whose CPUs a starting container
already holds."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "numa_pin"
#: the modules allowed to call the plain check: where it is defined, and the one notion of alive
ALLOWED = {"ledger/liveness.py", "resources/node/base.py"}


def callers(name: str) -> list[str]:
    """``module:line`` of every call of a function called ``name`` under src/numa_pin."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called == name:
                    out.append(f"{rel}:{node.lineno}")
    return out


def test_only_the_node_asks_the_plain_liveness_check() -> None:
    stray = [c for c in callers("is_alive") if c.split(":")[0] not in ALLOWED and "testing/" not in c]
    assert stray == [], f"use Node.alive (the pending grace and the boot check) instead: {stray}"
