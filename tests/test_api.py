"""The documented library API (docs/api.md): plain data in, plain data out."""

import pytest

import numa_pin.api as api
from numa_pin.api import CpuInfo, CpuTopology, DeviceInfo, TopologyHint, cpu_hints, device_hints, merge_hints, take_cpus


def test_exported_names_exist():
    for name in api.__all__:
        assert hasattr(api, name), name


def test_topology_hint_reads_back_plain_data():
    assert TopologyHint([1, 0], True).affinity == frozenset({0, 1})
    assert TopologyHint(None, False).affinity is None
    assert TopologyHint([], False).affinity == frozenset()
    assert TopologyHint((0,), True) == TopologyHint([0], True)


@pytest.mark.parametrize(
    "policy, expect, admit",
    [
        ("single-numa-node", TopologyHint([0], True), True),
        ("restricted", TopologyHint([0], True), True),
        ("best-effort", TopologyHint([0], True), True),
        ("none", TopologyHint(None, False), True),
    ],
    ids=["single-numa-node", "restricted", "best-effort", "none"],
)
def test_readme_merge_example(policy, expect, admit):
    got = merge_hints(
        policy,
        [{"cpu": [TopologyHint([0], True), TopologyHint([0, 1], False)]}, {"nvidia.com/gpu": None}, None],
        numa_nodes=[0, 1],
        distances={0: [10, 21], 1: [21, 10]},
        prefer_closest=False,
    )
    assert got == (expect, admit)


def test_readme_cpu_and_device_examples():
    topo = CpuTopology.from_cpus([CpuInfo(cpu=c, socket=c // 4, numa=c // 4, core=c) for c in range(8)])
    assert take_cpus(topo, available=range(8), count=2) == frozenset({0, 1})
    hints = cpu_hints(topo, available=range(8), request=2)
    assert hints[:2] == [TopologyHint([0], True), TopologyHint([1], True)]
    assert hints[2] == TopologyHint([0, 1], False)
    devs = device_hints([DeviceInfo("gpu0", [0]), DeviceInfo("gpu1", [1])], numa_nodes=[0, 1],
                        available={"gpu0", "gpu1"}, request=1)
    assert devs == [TopologyHint([0], True), TopologyHint([1], True), TopologyHint([0, 1], False)]
    with pytest.raises(api.AllocationError, match="requested=3, available=2"):
        take_cpus(topo, available=[0, 1], count=3)
