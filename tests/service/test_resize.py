"""``numa-pin resize``: an exclusive grant grows or shrinks in place (issue 27, section 4).

KEP-5554's rules: the CPUs a container was admitted with stay; a grow adds CPUs on the grant's
NUMA affinity only; a shrink gives back only what grows added; anything else is refused with one
line and changes nothing. What the test reads is the fake node's cgroup files, as the enforcer
wrote them, and the ledger; the machine's layout comes from the kit's spec.
"""

from __future__ import annotations

import io
import json

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.cli.main import main
from numa_pin.entry.hook import run as hook_run
from numa_pin.ledger.store import Ledger
from numa_pin.testing import shapes
from numa_pin.testing.node import FakeNode

GIB = 1 << 30


@pytest.fixture
def node(hook_node: FakeNode) -> FakeNode:
    return hook_node


@pytest.fixture
def node_cpus() -> dict[int, frozenset[int]]:
    spec = shapes.SHAPES["intel-2s-ht"]()
    return {n: frozenset(spec.cpus_of_node(n)) for n in spec.node_ids}


def admit(node: FakeNode, name: str, pid: int, annotations: dict[str, str]) -> None:
    node.add_container(name, pid)
    assert hook_run(["--config", str(node.config), "prestart"], io.BytesIO(node.oci_state(name, pid, annotations))) == 0


def cgroup_cpus(node: FakeNode, name: str) -> frozenset[int]:
    return parse_list(node.cpuset(name)[0])


def resize(node: FakeNode, capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["resize", *args, "--config", str(node.config)])
    out, err = capsys.readouterr()
    return rc, out, err


def snapshot(node: FakeNode, *names: str) -> tuple[object, ...]:
    return (Ledger(str(node.state_dir)).read().grants,) + tuple(node.cpuset(n) for n in names)


def test_grow_then_shrink_keeps_the_admitted_cpus(node, capsys, node_cpus):
    admit(node, "x", 47000, {"numa-pin.io/cpus": "4"})
    admit(node, "s", 47001, {})  # a shared container: it follows the pool
    ledger = Ledger(str(node.state_dir))
    admitted = ledger.read().grants["x"].cpus
    (home,) = [n for n, cpus in node_cpus.items() if admitted <= cpus]

    rc, _, err = resize(node, capsys, "x", "--cpus", "8", "--json")
    assert rc == 0, err
    grown = cgroup_cpus(node, "x")
    assert len(grown) == 8 and admitted < grown and grown <= node_cpus[home]
    assert ledger.read().grants["x"].cpus == grown
    assert not cgroup_cpus(node, "s") & grown  # the shared pool gave them up

    rc, out, err = resize(node, capsys, "x", "--cpus", "4")
    assert rc == 0, err
    assert cgroup_cpus(node, "x") == admitted == ledger.read().grants["x"].cpus
    assert ledger.read().grants["x"].baseline_cpus is None
    assert grown - admitted <= cgroup_cpus(node, "s")  # back in the shared pool
    assert out.startswith("x: cpus ")


def test_a_grow_that_does_not_fit_on_its_node_is_refused_and_changes_nothing(node, capsys, node_cpus):
    admit(node, "x", 47000, {"numa-pin.io/cpus": "4"})
    admit(node, "s", 47001, {})
    before = snapshot(node, "x", "s")
    rc, _, err = resize(node, capsys, "x", "--cpus", str(len(node_cpus[0]) + 1))
    assert rc != 0 and len(err.strip().splitlines()) == 1 and "free on its NUMA node" in err, err
    assert snapshot(node, "x", "s") == before


def test_under_best_effort_a_grow_past_its_node_expands_the_affinity(node, capsys, node_cpus, tmp_path):
    """KEP-5554: under best-effort the affinity may expand, keeping every node and CPU it had."""
    node.config = node.write_config(policy="best-effort", kubelet_root=str(tmp_path / "no-kubelet"))
    admit(node, "x", 47000, {"numa-pin.io/cpus": "4"})
    ledger = Ledger(str(node.state_dir))
    admitted = ledger.read().grants["x"]
    (home,) = [n for n, cpus in node_cpus.items() if admitted.cpus <= cpus]
    count = len(node_cpus[home]) + 1  # more than its node has, the reserved CPU counted
    rc, _, err = resize(node, capsys, "x", "--cpus", str(count))
    assert rc == 0, err
    grown = ledger.read().grants["x"]
    assert cgroup_cpus(node, "x") == grown.cpus and len(grown.cpus) == count and admitted.cpus < grown.cpus
    assert grown.affinity == frozenset(node_cpus) and admitted.affinity < grown.affinity
    assert grown.mems == frozenset(node_cpus)
    rc, _, err = resize(node, capsys, "x", "--cpus", "4")
    assert rc == 0, err
    assert ledger.read().grants["x"].cpus == admitted.cpus


def test_a_shrink_below_the_admitted_cpus_is_refused(node, capsys):
    admit(node, "x", 47000, {"numa-pin.io/cpus": "4"})
    assert resize(node, capsys, "x", "--cpus", "6")[0] == 0
    before = snapshot(node, "x")
    rc, _, err = resize(node, capsys, "x", "--cpus", "3")
    assert rc == 2 and "KEP-5554" in err and len(err.strip().splitlines()) == 1, err
    assert snapshot(node, "x") == before


@pytest.mark.parametrize("args, words", [
    (("s", "--cpus", "2"), "holds no exclusive CPUs"),
    (("nobody", "--cpus", "2"), "no grant matches"),
    (("x",), "nothing to change"),
    (("x", "--cpus", "0"), "at least one CPU"),
], ids=["shared-grant", "unknown-id", "no-change-asked", "zero-cpus"])
def test_refusals_are_one_line(node, capsys, args, words):
    admit(node, "x", 47000, {"numa-pin.io/cpus": "2"})
    admit(node, "s", 47001, {})
    before = snapshot(node, "x", "s")
    rc, _, err = resize(node, capsys, *args)
    assert rc != 0 and words in err and len(err.strip().splitlines()) == 1, err
    assert snapshot(node, "x", "s") == before


def test_a_stopped_container_cannot_be_resized(node, capsys):
    admit(node, "x", 47000, {"numa-pin.io/cpus": "2"})
    node.stop_container("x", 47000)
    rc, _, err = resize(node, capsys, "x", "--cpus", "4")
    assert rc != 0 and "no running container" in err


def test_memory_grows_and_shrinks_on_the_grants_nodes(node, capsys):
    admit(node, "x", 47000, {"numa-pin.io/cpus": "2", "numa-pin.io/memory": "1Gi"})
    ledger = Ledger(str(node.state_dir))
    nodes = set(ledger.read().grants["x"].memory["memory"])
    rc, _, err = resize(node, capsys, "x", "--memory", "3Gi", "--json")
    assert rc == 0, err
    memory = ledger.read().grants["x"].memory["memory"]
    assert set(memory) == nodes and sum(memory.values()) == 3 * GIB
    assert resize(node, capsys, "x", "--memory", "512Mi")[0] == 0
    assert sum(ledger.read().grants["x"].memory["memory"].values()) == GIB // 2
    before = snapshot(node, "x")
    rc, _, err = resize(node, capsys, "x", "--memory", "100Ti")
    assert rc != 0 and "free" in err and len(err.strip().splitlines()) == 1, err
    assert snapshot(node, "x") == before


def test_a_failure_after_the_cgroup_write_rolls_it_back(node, capsys, monkeypatch):
    """The container's cpuset is written first; when a later step of the same transaction fails
    (here: resizing the shared pool), the write is undone and the ledger keeps the old grant."""
    from numa_pin.errors import EnforcementError
    from numa_pin.resources.node import cpu as cpu_node

    admit(node, "x", 47000, {"numa-pin.io/cpus": "2"})
    before = snapshot(node, "x")
    written: list[str] = []

    def failing_resize(*_args, **_kwargs):
        written.append(node.cpuset("x")[0])
        raise EnforcementError("shared pool: injected failure", path="/fake")

    monkeypatch.setattr(cpu_node, "_resize", failing_resize)
    rc, _, err = resize(node, capsys, "x", "--cpus", "4")
    assert rc != 0 and "injected failure" in err and len(err.strip().splitlines()) == 1, err
    assert written and len(parse_list(written[0])) == 4, "the container's cpuset was written before the failure"
    assert snapshot(node, "x") == before


def test_json_names_before_and_after(node, capsys):
    admit(node, "x", 47000, {"numa-pin.io/cpus": "2"})
    rc, out, err = resize(node, capsys, "x", "--cpus", "3", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert (doc["container_id"], len(parse_list(doc["before"]["cpus"])), len(parse_list(doc["after"]["cpus"]))) == (
        "x", 2, 3)


# ---- a runtime changed the cpuset (runc update --cpuset-cpus): reconcile re-asserts or adopts ----


def runtime_sets(node: FakeNode, name: str, cpus: frozenset[int]) -> None:
    """What ``runc update --cpuset-cpus`` does: write the container's cpuset.cpus."""
    from numa_pin.base.cpuset import format_list

    (node.cgroup_dir(name) / "cpuset.cpus").write_text(format_list(cpus) + "\n")


def reconcile(node: FakeNode, capsys) -> dict[str, object]:
    capsys.readouterr()
    assert main(["reconcile", "--json", "--config", str(node.config)]) == 0
    return json.loads(capsys.readouterr().out)


def _free_on(node: FakeNode, node_cpus: dict[int, frozenset[int]], home: int, n: int) -> frozenset[int]:
    grants = Ledger(str(node.state_dir)).read().grants.values()
    taken = frozenset().union(*(g.cpus for g in grants))
    return frozenset(sorted(node_cpus[home] - taken - {0})[-n:])  # CPU 0: kubelet reserves the lowest


def _home(node: FakeNode, name: str, node_cpus: dict[int, frozenset[int]]) -> int:
    held = Ledger(str(node.state_dir)).read().grants[name].cpus
    (home,) = [n for n, cpus in node_cpus.items() if held <= cpus]
    return home


def test_by_default_reconcile_writes_the_ledgers_cpus_back(node, capsys, node_cpus):
    admit(node, "x", 47000, {"numa-pin.io/cpus": "2"})
    held = Ledger(str(node.state_dir)).read().grants["x"].cpus
    runtime_sets(node, "x", held | _free_on(node, node_cpus, _home(node, "x", node_cpus), 2))
    out = reconcile(node, capsys)
    assert out["repaired"] == ["x"] and out["adopted"] == []
    assert cgroup_cpus(node, "x") == held == Ledger(str(node.state_dir)).read().grants["x"].cpus


@pytest.fixture
def adopting(node: FakeNode, tmp_path) -> FakeNode:
    node.config = node.write_config(policy="restricted", kubelet_root=str(tmp_path / "no-kubelet"),
                                    resize_follow="adopt")
    return node


def test_adopt_takes_a_valid_runtime_resize_into_the_ledger(adopting, capsys, node_cpus):
    node = adopting
    admit(node, "x", 47000, {"numa-pin.io/cpus": "2"})
    admit(node, "s", 47001, {})
    held = Ledger(str(node.state_dir)).read().grants["x"].cpus
    wider = held | _free_on(node, node_cpus, _home(node, "x", node_cpus), 2)
    runtime_sets(node, "x", wider)
    out = reconcile(node, capsys)
    assert out["adopted"] == ["x"] and out["not_adopted"] == [], out
    grant = Ledger(str(node.state_dir)).read().grants["x"]
    assert grant.cpus == wider == cgroup_cpus(node, "x") and grant.baseline_cpus == held
    assert not cgroup_cpus(node, "s") & wider  # the shared pool follows
    assert reconcile(node, capsys)["adopted"] == []  # settled: nothing more to adopt


@pytest.mark.parametrize("change, why", [
    (lambda held, free, other, home_cpus: held - {min(held)}, "admitted with"),
    (lambda held, free, other, home_cpus: held | other, "another grant"),
    (lambda held, free, other, home_cpus: held | {0}, "reserved"),
], ids=["drops-an-admitted-cpu", "takes-anothers-cpu", "takes-a-reserved-cpu"])
def test_adopt_refuses_what_a_resize_could_not_do_and_writes_back(adopting, capsys, node_cpus, change, why):
    node = adopting
    admit(node, "x", 47000, {"numa-pin.io/cpus": "2"})
    admit(node, "y", 47002, {"numa-pin.io/cpus": "2"})
    ledger = Ledger(str(node.state_dir))
    held, other = ledger.read().grants["x"].cpus, ledger.read().grants["y"].cpus
    home = _home(node, "x", node_cpus)
    runtime_sets(node, "x", change(held, _free_on(node, node_cpus, home, 2), other, node_cpus[home]))
    out = reconcile(node, capsys)
    assert out["adopted"] == [] and len(out["not_adopted"]) == 1 and why in out["not_adopted"][0], out
    assert out["repaired"] == ["x"]
    assert cgroup_cpus(node, "x") == held == ledger.read().grants["x"].cpus
