"""Resource names and kubelet's default machine state (cpu-memory-device.md §7)."""

from __future__ import annotations

import pytest
from memkit import GiB, MiB, assign, machine

from numa_pin.errors import ConfigError, LedgerError, RequestError
from numa_pin.providers.memory import pod_memory_request
from numa_pin.topology.memory import (
    MemoryTable,
    build_memory_state,
    check_request,
    hugepage_size_kb,
    hugepages_resource,
)


@pytest.mark.parametrize(
    ("size_kb", "name"),
    [(2048, "hugepages-2Mi"), (1048576, "hugepages-1Gi"), (64, "hugepages-64Ki"),
     (32768, "hugepages-32Mi"), (524288, "hugepages-512Mi"), (16 * 1048576, "hugepages-16Gi")],
    ids=["2Mi", "1Gi", "64Ki-arm64", "32Mi-arm64", "512Mi-arm64", "16Gi-power"],
)
def test_hugepage_names_round_trip(size_kb: int, name: str) -> None:
    assert hugepages_resource(size_kb) == name
    assert hugepage_size_kb(name) == size_kb


@pytest.mark.parametrize(
    "name",
    ["hugepages-2048Ki", "hugepages-1024Mi", "hugepages-2M", "hugepages-", "hugepages-0Mi", "hugepages-2mi",
     "cpu", "memory2", "nvidia.com/gpu"],
    ids=["non-canonical-Ki", "non-canonical-Mi", "decimal-suffix", "no-size", "zero", "lower-case",
         "cpu", "memory-typo", "device"],
)
def test_bad_resource_names_are_refused(name: str) -> None:
    with pytest.raises(RequestError):
        check_request({name: 1})


@pytest.mark.parametrize("amount", [-1, 1.5, "1Gi", True], ids=["negative", "float", "string", "bool"])
def test_bad_amounts_are_refused(amount: object) -> None:
    with pytest.raises(RequestError, match="memory"):
        check_request({"memory": amount})


def test_default_tables_follow_discovery() -> None:
    topo = machine([8, 4], hugepages={2048: (512, 0), 1048576: (2, 1)})
    state = build_memory_state(topo, {0: {"memory": 1 * GiB, "hugepages-1Gi": 1 * GiB}})
    # node 0: hugepages 512 x 2Mi = 1Gi, 2 x 1Gi = 2Gi; memory 8Gi - 1Gi reserved - 3Gi hugepages
    assert state.table(0, "hugepages-2Mi") == MemoryTable(1 * GiB, 0, 1 * GiB, 1 * GiB, 0)
    assert state.table(0, "hugepages-1Gi") == MemoryTable(2 * GiB, 1 * GiB, 1 * GiB, 1 * GiB, 0)
    assert state.table(0, "memory") == MemoryTable(8 * GiB, 1 * GiB, 4 * GiB, 4 * GiB, 0)
    # node 1 has no 2Mi pages but still gets a (zero) table; memory 4Gi - 1Gi hugepages
    assert state.table(1, "hugepages-2Mi") == MemoryTable(0, 0, 0, 0, 0)
    assert state.table(1, "memory") == MemoryTable(4 * GiB, 0, 3 * GiB, 3 * GiB, 0)
    assert state.resources() == {"memory", "hugepages-2Mi", "hugepages-1Gi"}
    assert all(state.nodes[n].cells == {n} and state.nodes[n].assignments == 0 for n in (0, 1))


def test_assignments_fill_reserved_cells_and_counts() -> None:
    topo = machine([4, 4, 4], hugepages={1048576: (2, 2, 2)})
    state = build_memory_state(
        topo,
        assignments=[
            assign("a", [0, 1], memory={0: 2 * GiB, 1: 512 * MiB}, hugepages_1Gi={0: 1 * GiB, 1: 0}),
            assign("b", [2], memory={2: 1 * GiB}),
        ],
    )
    assert state.table(0, "memory") == MemoryTable(4 * GiB, 0, 2 * GiB, 0, 2 * GiB)
    assert state.table(1, "memory").free == 2 * GiB - 512 * MiB
    assert state.table(0, "hugepages-1Gi").free == 1 * GiB
    # kubelet counts one assignment per resource per node of the group
    assert [state.nodes[n].assignments for n in (0, 1, 2)] == [2, 2, 1]
    assert state.nodes[0].cells == state.nodes[1].cells == {0, 1}
    assert state.nodes[2].cells == {2}
    assert state.groups() == {frozenset({0, 1})}


def test_a_fully_reused_resource_still_counts_as_an_assignment() -> None:
    state = build_memory_state(machine([4, 4]), assignments=[assign("app", [0, 1], memory={})])
    assert [state.nodes[n].assignments for n in (0, 1)] == [1, 1]
    assert state.nodes[0].cells == {0, 1}
    assert state.free(0, "memory") == 4 * GiB


def test_overcommitted_node_has_no_free_memory() -> None:
    state = build_memory_state(machine([2]), {0: {"memory": 1 * GiB}}, [assign("a", [0], memory={0: 2 * GiB})])
    assert state.table(0, "memory") == MemoryTable(2 * GiB, 1 * GiB, 1 * GiB, 0, 2 * GiB)


@pytest.mark.parametrize(
    ("reserved", "match"),
    [({5: {"memory": 1}}, "no NUMA node"),
     ({0: {"hugepages-2Mi": 1}}, "no 'hugepages-2Mi'"),
     ({0: {"memory": 5 * GiB}}, "exceed"),
     ({0: {"memory": 3 * GiB + 512 * MiB}}, "hugepages"),
     ({0: {"hugepages-1Gi": 2 * GiB}}, "exceed"),
     ({0: {"memory": -1}}, "non-negative")],
    ids=["unknown-node", "unknown-size", "more-than-node", "eats-hugepages", "more-than-pages", "negative"],
)
def test_bad_reserved_memory_is_a_config_error(reserved: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_memory_state(machine([4], hugepages={1048576: (1,)}), reserved)


@pytest.mark.parametrize(
    ("entry", "match"),
    [(assign("c1", [0], memory={1: 1}), "outside its group"),
     (assign("c1", [7], memory={7: 1}), "not a set of this machine"),
     (assign("c1", [], memory={}), "not a set of this machine"),
     (assign("c1", [0], hugepages_1Gi={0: GiB}), "no hugepages-1Gi"),
     (assign("c1", [0], memory={0: -5}), "bad amount")],
    ids=["bytes-outside-group", "unknown-node", "empty-group", "unknown-resource", "negative"],
)
def test_inconsistent_assignments_are_ledger_errors(entry: tuple, match: str) -> None:
    with pytest.raises(LedgerError, match="c1"):
        build_memory_state(machine([4, 4]), assignments=[entry])
    with pytest.raises(LedgerError, match=match):
        build_memory_state(machine([4, 4]), assignments=[entry])


@pytest.mark.parametrize(
    ("init", "apps", "expected"),
    [([({"memory": 3 * GiB}, False)], [{"memory": 1 * GiB}, {"memory": 1 * GiB}], {"memory": 3 * GiB}),
     ([({"memory": 1 * GiB}, False)], [{"memory": 2 * GiB}, {"memory": 1 * GiB}], {"memory": 3 * GiB}),
     ([({"memory": 1 * GiB}, True), ({"memory": 3 * GiB}, False)], [{"memory": 1 * GiB}],
      {"memory": 4 * GiB}),
     ([({"memory": 1 * GiB}, True)], [{"memory": 1 * GiB}], {"memory": 2 * GiB}),
     ([({"hugepages-2Mi": 8 * MiB}, False)], [{"memory": 1 * GiB}], {"memory": 1 * GiB})],
    ids=["init-peak-wins", "app-sum-wins", "sidecar-under-regular-init", "sidecar-adds-to-apps",
         "init-only-resource-dropped"],
)
def test_pod_level_request(init: list, apps: list, expected: dict) -> None:
    assert pod_memory_request(init, apps) == expected
