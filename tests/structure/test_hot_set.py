"""The hot set: the numa_pin modules a hook imports, measured; the start-up workarounds only there.

A hook starts on every container start, so the modules it imports keep ``TYPE_CHECKING = False``
(annotations without importing ``typing``) and their lazy imports (DEVELOPERS.md, "The hot set");
every other module is ordinary Python. Which modules those are is measured, never listed:

* a fresh interpreter runs ``numa-pin-hook``'s ``main`` on a fake node (the kit's
  ``intel-2s-ht``) with no agent listening: the client path, then in-process a prestart admission
  with cold caches, its poststop release and a precreate; its ``sys.modules`` is the start;
* to it comes every numa_pin module those can import at run time that the runs did not (a lazy
  import inside a function: a GPU grant, SR-IOV, an isolation knob), and ``numa_pin.entry.runc``
  (``numa-pin-runc``, which runs the precreate stage before runc; not started here), each with
  what it imports in turn, read from the source. Imports under ``if TYPE_CHECKING:`` do not count.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_layers import modules  # beside this file: pytest puts the folder on the path

from numa_pin.testing.node import FakeNode

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
#: what runs outside the measured hook process, yet is the hook's path
ENTRY_POINTS = ("numa_pin.entry.runc",)
CLIENT_PATH = {"numa_pin.agent", "numa_pin.agent.client", "numa_pin.agent.protocol"}

HOOK_RUNS = """
import io, sys
from numa_pin.entry import hook

def call(stage, data):
    sys.stdin = io.TextIOWrapper(io.BytesIO(data))
    sys.stdout = io.TextIOWrapper(io.BytesIO())
    try:
        return hook.main(["--config", CONFIG, stage])
    finally:
        sys.stdout = sys.__stdout__

codes = [call("prestart", STATE), call("poststop", STATE), call("precreate", PROPOSED)]
print(codes)
print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] == "numa_pin")))
"""


MODULES = modules()


def _guarded(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(name: str, source: str, known: set[str], is_package: bool = False) -> set[str]:
    """The numa_pin modules ``name`` can import when it runs, at any depth of the file (a package
    with each module), leaving out what only ``if TYPE_CHECKING:`` imports."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _guarded(child):
                for other in child.orelse:
                    visit_one(other)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names)
        visit(node)

    visit(ast.parse(source))
    out = set()
    for module in found:
        parts = module.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in known)
    return out - {name}


def closure(start: set[str]) -> set[str]:
    known = set(MODULES)
    seen: set[str] = set()
    todo = [m for m in start if m in known]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            path = MODULES[module]
            todo += runtime_imports(module, path.read_text(), known, path.name == "__init__.py")
    return seen


@pytest.fixture(scope="module")
def hook_runs(tmp_path_factory) -> set[str]:
    """What a fresh hook process imported in the runs above (all three must succeed)."""
    root = tmp_path_factory.mktemp("hotset")
    node = FakeNode(root, "intel-2s-ht", parent="")
    node.add_container("c", 4242)
    config = node.write_config(policy="single-numa-node")
    bundle = root / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"annotations": {"numa-pin.io/cpus": "1"},
                                                    "linux": {"cgroupsPath": "/c"}}))
    state = json.dumps({"id": "hot", "bundle": str(bundle), "pid": 4242}).encode()
    proposed = json.dumps({"ociVersion": "1.0.2-dev", "process": {"args": ["sh"], "env": []},
                           "annotations": {"numa-pin.io/cpus": "1"},
                           "linux": {"cgroupsPath": "/libpod_parent/libpod-" + "a" * 64}}).encode()
    code = f"CONFIG, STATE, PROPOSED = {str(config)!r}, {state!r}, {proposed!r}\n{HOOK_RUNS}"
    env = dict(os.environ, NUMA_PIN_CACHE_DIR=str(node.cache_dir), NUMA_PIN_AGENT_AUTOSTART="0",
               NUMA_PIN_AGENT_SOCKET=str(root / "no-agent.sock"),
               PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    env.pop("NUMA_PIN_NO_AGENT", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    codes, loaded = (out.stdout.splitlines() + ["", ""])[:2]
    assert codes == "[0, 0, 0]", out.stderr
    return set(loaded.split())


@pytest.fixture(scope="module")
def hot_set(hook_runs) -> set[str]:
    return closure(hook_runs | set(ENTRY_POINTS))


def workaround_users() -> set[str]:
    """Modules that set ``TYPE_CHECKING = False`` at module level."""
    out = set()
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TYPE_CHECKING"
                                                    for t in node.targets):
                out.add(name)
    return out


def documented() -> set[str]:
    """The module names of what the first paragraph of DEVELOPERS.md's "The hot set" names: files
    (``errors.py``, ``agent/client.py``) and folders (``base/``) under ``src/numa_pin/``."""
    section = (ROOT / "DEVELOPERS.md").read_text().split("### The hot set", 1)[1].strip()
    paths = re.findall(r"`([\w/]+(?:\.py)?)`", section.split("\n\n", 1)[0])
    return {".".join(["numa_pin", *Path(p.removesuffix(".py")).parts]).removesuffix(".__init__")
            for p in paths if p != "src/numa_pin/"}


def spans(hot: set[str]) -> set[str]:
    """The packages (and root modules) the set spans; the agent by its client-path modules."""
    return {m if m.startswith("numa_pin.agent") else ".".join(m.split(".")[:2]) for m in hot}


def test_the_runs_measure_the_hook_path(hook_runs, hot_set):
    assert {"numa_pin.entry.hook", "numa_pin.agent.client", "numa_pin.hook.precreate",
            "numa_pin.service.node", "numa_pin.reporting.report"} <= hook_runs
    assert "numa_pin.entry.runcstage" in hot_set and "numa_pin.entry.runcstage" not in hook_runs
    leaks = sorted(m for m in hot_set if m.startswith(("numa_pin.cli", "numa_pin.nri", "numa_pin.testing")))
    assert leaks == [], "the CLI, the NRI plugin and the test kit are never on a hook's path"


#: the policies' modules, of which a hook loads the one its node runs
POLICY_MODULES = {f"numa_pin.policy.{m}" for m in ("none", "best_effort", "restricted", "single_numa_node")}


def test_a_hook_loads_only_what_its_node_and_request_use(hook_runs):
    """The node runs single-numa-node, has no kubelet checkpoint, and the request asks for CPUs:
    no other policy, no checkpoint reader, no config renderer, no parser of an absent annotation."""
    assert hook_runs & POLICY_MODULES == {"numa_pin.policy.single_numa_node"}
    unused = {"numa_pin.cluster.kubelet", "numa_pin.config.render", "numa_pin.requests.colocate",
              "numa_pin.requests.vfconfig"}
    assert hook_runs & unused == set()


def test_the_client_path_is_only_the_agents_client_and_protocol(hot_set):
    assert {m for m in hot_set if m.startswith("numa_pin.agent")} == CLIENT_PATH


def test_developers_md_names_what_the_hot_set_spans(hot_set):
    assert documented() == spans(hot_set)


def test_start_up_workarounds_only_in_the_hot_set(hot_set):
    outside = sorted(workaround_users() - hot_set)
    assert outside == [], f"ordinary Python here: `from typing import TYPE_CHECKING`, not `= False`: {outside}"


def test_runtime_imports_skip_type_checking_and_keep_lazy_imports():
    known = {"numa_pin", "numa_pin.a", "numa_pin.b", "numa_pin.c", "numa_pin.p", "numa_pin.p.d"}
    source = ("TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from numa_pin import a\n"
              "from numa_pin.p import d\n\ndef f():\n    import numa_pin.b\n    from . import c\n")
    assert runtime_imports("numa_pin.x", source, known) == {"numa_pin", "numa_pin.b", "numa_pin.c", "numa_pin.p",
                                                            "numa_pin.p.d"}
