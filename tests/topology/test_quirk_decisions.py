"""Each quirk shape (issues 12 and 23), read by real discovery from its tree, decides correctly.

The expected placement is worked out by brute force from the *spec* (never from discovery):
under ``single-numa-node`` a container goes to the lowest-numbered node that alone holds both
its free CPUs and its memory, and its CPUs are whole physical cores of that node as the spec
lays them out. No such node: the container is rejected.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.admission.decide import NodeSettings, decide
from numa_pin.ledger.model import LedgerState
from numa_pin.requests.request import request_from_oci
from numa_pin.testing.machine import MachineSpec, build_once
from numa_pin.testing.shapes import QUIRK_SHAPES, shape
from numa_pin.topology.discover import discover

GIB = 1 << 30
RESERVED = frozenset({0})

#: (shape, exclusive CPUs, memory GiB); chosen so that the answer is not simply node 0
CASES = [
    ("arm-nul-bytes", 8, 1),  # node 0 has 7 free CPUs (CPU 0 reserved): node 1
    ("x86-nul-node-lists", 16, 1),  # node 0 has 15: node 1
    ("meminfo-total-only", 12, 1),  # node 0 has 11: node 1
    ("no-node-distance", 8, 1),  # node 0 has 7: node 1
    ("sparse-node-ids", 8, 1),  # node 0 has 7: node 2 (ids 0, 2, 5)
    ("memoryless-node", 4, 1),  # node 0
    ("memoryless-node", 8, 1),  # node 0 has 7, node 1 no memory, node 2 no CPUs: reject
    ("power-no-package-id", 4, 1),  # one whole SMT4 core of node 0
    ("power-no-package-id", 16, 1),  # node 0 has 15: all four cores of node 1
    ("pci-numa-node-unknown", 8, 1),  # node 0 has 7: node 1
    ("offline-smt", 8, 1),  # node 0 has 7 online free CPUs: node 1
    ("hybrid-pe", 6, 1),  # one node: 3 whole cores of 2 threads, or E cores
    ("two-die-snc", 8, 1),  # node 0 has 7: node 1, the other die of socket 0
    ("has-cpu-empty", 12, 1),  # node 0 has 11: node 1
    ("cache-map-only", 16, 1),  # node 0 has 15: node 1
    ("l3-map-zero", 16, 1),  # node 0 has 15: node 1 (L3 unknown)
    ("zero-node-distance", 8, 1),  # node 0 has 7: node 1
    ("siblings-only-topology", 8, 1),  # node 0 has 7: the four whole cores of node 1
    ("siblings-only-topology", 2, 1),  # one whole core of node 0, not CPU 0's sibling
    ("hugepages-no-free", 16, 1),  # node 0 has 15: node 1
    ("node-cpulists-overlap", 4, 1),  # node 0 by its links: CPUs 0-7,16-23 only
    ("node-cpulists-overlap", 16, 1),  # node 0 has 15: node 1's linked CPUs
    ("opteron-6276", 2, 1),  # one whole compute unit of node 0 (core_id names no core)
    ("opteron-6276", 6, 1),  # three whole compute units of node 0, not CPU 0's sibling
    ("opteron-6276", 8, 1),  # node 0 has 7: node 1
    ("harpertown-flat-numa", 4, 1),  # one node holds all 8 CPUs: node 0, not 8 one-CPU nodes
    ("harpertown-flat-numa", 7, 1),  # every CPU but the reserved one
    ("harpertown-flat-numa", 8, 1),  # CPU 0 is reserved: reject
    ("power7-lpar", 4, 1),  # one whole SMT4 core (a package of its own) of node 0
    ("power7-lpar", 16, 1),  # node 0 has 15: node 1's four cores
]


def _whole_cores(spec: MachineSpec) -> dict[int, frozenset[int]]:
    """CPU -> the online CPUs of its physical core, from the spec's layout."""
    layout = [c for c in spec.cpu_layout() if c.online]
    cores: dict[int, set[int]] = {}
    for c in layout:
        cores.setdefault(c.core_index, set()).add(c.id)
    return {c.id: frozenset(cores[c.core_index]) for c in layout}


def _cpus_of(spec: MachineSpec, node: int) -> frozenset[int]:
    """A node's CPUs as hwloc reads them: with overlapping cpulists and an all-10 SLIT, the
    first node holds every CPU and the others are gone."""
    if spec.quirks.node_cpulists_overlap and spec.quirks.flat_node_distance:
        return spec.online_cpus if node == spec.node_ids[0] else frozenset()
    return spec.cpus_of_node(node)


def _expected_node(spec: MachineSpec, cpus: int, memory_kb: int) -> int | None:
    for node in spec.node_ids:  # ascending: the narrowest-hint tie goes to the lowest node
        free = _cpus_of(spec, node) - RESERVED
        if len(free) >= cpus and spec.node_memory_kb(node) >= memory_kb:
            return node
    return None


def test_every_quirk_shape_has_a_decision_case() -> None:
    assert {name for name, _, _ in CASES} == set(QUIRK_SHAPES)


@pytest.mark.parametrize("name,cpus,memory_gib", CASES, ids=[f"{n}-{c}cpus" for n, c, _ in CASES])
def test_single_numa_node_places_on_the_right_node(
    tmp_path_factory: pytest.TempPathFactory, name: str, cpus: int, memory_gib: int
) -> None:
    spec = shape(name)
    built = build_once(spec, tmp_path_factory.getbasetemp() / "machines")
    topology = discover(built.sysfs_root, built.proc_root)
    request = request_from_oci(
        "c", {"numa-pin.io/cpus": str(cpus), "numa-pin.io/memory": f"{memory_gib}Gi"}
    )
    settings = NodeSettings(policy="single-numa-node", reserved_cpus=RESERVED)
    decision = decide(topology, LedgerState(), request, settings)

    node = _expected_node(spec, cpus, memory_gib * GIB // 1024)
    if node is None:
        assert not decision.admit, decision
        return
    assert decision.admit, decision.reason
    assert decision.mems == frozenset({node})
    assert len(decision.cpus) == cpus
    assert decision.cpus <= _cpus_of(spec, node) - RESERVED
    cores = _whole_cores(spec)
    # kubelet takes whole cores when it can. Not on a hybrid part: its CPUsPerCore() is
    # NumCPUs / NumCores in integers (24 / 16 = 1 on hybrid-pe), so one CPU already counts as
    # a "core" and P-core siblings may be split; only the node and the count are kubelet's.
    if cpus % spec.threads_per_core == 0 and not spec.e_cores_per_node:
        assert all(cores[c] <= decision.cpus for c in decision.cpus), sorted(decision.cpus)


def test_relative_roots_decide_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = shape("sparse-node-ids")
    build_once(spec, tmp_path)
    (root,) = [p for p in tmp_path.iterdir() if p.name.startswith("sparse-node-ids")]
    monkeypatch.chdir(tmp_path)
    relative = discover(Path(root.name) / "sys", Path(root.name) / "proc")
    absolute = discover(root / "sys", root / "proc")
    assert dict(relative.nodes) == dict(absolute.nodes)
    assert dict(relative.cpus) == dict(absolute.cpus)
    assert relative.pci_devices == absolute.pci_devices
