"""Kernel quirks seen on real machines (issue 12), one small tree each.

Each case starts from the 2-node SMT2 tree of ``conftest.two_node`` (node 0 = CPUs 0,1,4,5 on
socket 0, node 1 = CPUs 2,3,6,7 on socket 1, distance 20), changes what the quirk changes and
checks discovery against the values written here. The whole-machine versions of these quirks
are kit shapes checked against hwloc in ``tests/testing/test_lstopo_oracle.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numa_pin.cli import main as cli
from numa_pin.errors import SysfsError, TopologyError
from numa_pin.topology.cache import cached_discover
from numa_pin.topology.discover import discover
from numa_pin.topology.model import Topology

NODE = "devices/system/node"
CPU = "devices/system/cpu"
NODE0 = frozenset({0, 1, 4, 5})
NODE1 = frozenset({2, 3, 6, 7})


def _append_nul(root: Path, under: str, names: tuple[str, ...] = ()) -> int:
    """Append a NUL byte to every regular file below ``under`` (or only to ``names``)."""
    count = 0
    for path in (root / under).rglob("*"):
        if path.is_symlink() or not path.is_file() or (names and path.name not in names):
            continue
        if path.parent != root / under and names:
            continue
        path.write_bytes(path.read_bytes() + b"\0")
        count += 1
    return count


def _same_machine(a: Topology, b: Topology) -> None:
    assert dict(a.nodes) == dict(b.nodes)
    assert dict(a.cpus) == dict(b.cpus)
    assert a.pci_devices == b.pci_devices


# ---- NUL bytes after the newline --------------------------------------------------------
def test_nul_after_newline_on_every_system_file(two_node) -> None:
    clean = discover(two_node.root)
    assert _append_nul(two_node.root, "devices/system") > 50
    assert two_node.p(f"{NODE}/online").read_bytes() == b"0-1\n\0"
    _same_machine(discover(two_node.root), clean)


def test_nul_after_newline_on_the_node_lists(two_node) -> None:
    clean = discover(two_node.root)
    for name in ("online", "possible", "has_cpu", "has_normal_memory"):
        two_node.write(f"{NODE}/{name}", b"0-1\n\0")
    _same_machine(discover(two_node.root), clean)


def test_nul_after_newline_on_pci_files(two_node) -> None:
    rel = two_node.pci("0000:5e:00.0", numa_node=1, local_cpulist=[2, 3, 6, 7], driver="ice")
    clean = discover(two_node.root)
    for name in ("numa_node", "local_cpulist", "vendor", "device", "class"):
        path = two_node.p(f"{rel}/{name}")
        path.write_bytes(path.read_bytes() + b"\0")
    _same_machine(discover(two_node.root), clean)
    assert discover(two_node.root).device("0000:5e:00.0").numa_node == 1


# ---- optional files missing -------------------------------------------------------------
def test_node_meminfo_with_only_memtotal(two_node) -> None:
    two_node.write(f"{NODE}/node1/meminfo", "Node 1 MemTotal:       2000 kB")
    topo = discover(two_node.root)
    assert (topo.nodes[1].memory_total_kb, topo.nodes[1].memory_free_kb) == (2000, None)
    assert (topo.nodes[0].memory_total_kb, topo.nodes[0].memory_free_kb) == (1000, 100)
    assert json.loads(json.dumps(_json(topo)))["numa_nodes"]["1"]["memory_free_kb"] is None
    assert "unknown free" in _text(topo)


def test_node_meminfo_without_memtotal_names_the_file_in_one_line(two_node) -> None:
    two_node.write(f"{NODE}/node1/meminfo", "Node 1 MemFree:        200 kB")
    with pytest.raises(SysfsError) as err:
        discover(two_node.root)
    assert err.value.path == str(two_node.p(f"{NODE}/node1/meminfo"))
    assert "MemTotal" in err.value.reason and "\n" not in str(err.value)


def test_no_distance_file_means_the_kernels_default(two_node) -> None:
    two_node.write(f"{NODE}/node0/distance", "10 21")
    two_node.remove(f"{NODE}/node1/distance")
    topo = discover(two_node.root)
    assert topo.nodes[0].distances == (10, 21)  # what the file says wins
    assert topo.nodes[1].distances == (20, 10)  # no file: 10 local, 20 remote


# ---- nodes ----------------------------------------------------------------------------------
def test_has_cpu_empty_although_nodes_have_cpus(two_node) -> None:
    clean = discover(two_node.root)
    two_node.write(f"{NODE}/has_cpu", "")
    two_node.write(f"{NODE}/has_memory", "")
    _same_machine(discover(two_node.root), clean)
    assert discover(two_node.root).nodes[1].cpus == NODE1


def test_sparse_cpuless_and_memoryless_nodes(fake) -> None:
    # node 0: CPUs 0-1 and memory; node 2: CPUs 2-3, no memory; node 5: memory, no CPUs
    for cpu, node in ((0, 0), (1, 0), (2, 2), (3, 2)):
        fake.cpu(cpu, socket=0, core=cpu, l3=0, node=node)
    fake.node(0, [0, 1], [10, 12, 17], 4096, 1024)
    fake.node(2, [2, 3], [12, 10, 17], 0, 0)
    fake.node(5, [], [17, 17, 10], 8192, 8000)
    fake.online(range(4), [0, 2, 5])
    topo = discover(fake.root)
    assert topo.node_ids == (0, 2, 5)
    assert {n: topo.nodes[n].cpus for n in topo.node_ids} == {
        0: {0, 1},
        2: {2, 3},
        5: frozenset(),
    }
    assert [topo.nodes[n].memory_total_kb for n in topo.node_ids] == [4096, 0, 8192]
    assert topo.distance(2, 5) == 17 and topo.distance(0, 2) == 12
    assert {c.numa for c in topo.cpus.values()} == {0, 2}


# ---- CPUs ----------------------------------------------------------------------------------
def test_package_id_minus_one_everywhere(two_node) -> None:
    for cpu in range(8):
        topo = f"{CPU}/cpu{cpu}/topology"
        two_node.write(f"{topo}/physical_package_id", "-1")
        two_node.write(f"{topo}/core_id", "0" if cpu in (0, 4, 2, 6) else "1")
        package = "0-1,4-5" if cpu in NODE0 else "2-3,6-7"
        two_node.write(f"{topo}/package_cpus_list", package)
    topo = discover(two_node.root)
    assert {c.id: c.socket for c in topo.cpus.values()} == {
        c: 0 if c in NODE0 else 1 for c in range(8)
    }
    cores = {c.core_key for c in topo.cpus.values()}
    assert len(cores) == 4, "(package, die, core) tells the 4 physical cores apart"


def test_package_id_minus_one_and_no_package_list_is_one_socket(two_node) -> None:
    for cpu in range(8):
        two_node.write(f"{CPU}/cpu{cpu}/topology/physical_package_id", "-1")
    topo = discover(two_node.root)
    assert topo.sockets() == {0}


def test_offline_cpus_are_dropped_and_siblings_shrink(two_node) -> None:
    two_node.write(f"{CPU}/online", "0-3,5-7")
    two_node.write(f"{CPU}/cpu4/online", "0")
    two_node.write(f"{CPU}/cpu6/online", "0")
    topo = discover(two_node.root)
    assert topo.cpu_ids == {0, 1, 2, 3, 5, 7}
    assert topo.nodes[0].cpus == {0, 1, 5} and topo.nodes[1].cpus == {2, 3, 7}
    assert topo.cpus[0].siblings == {0} and topo.cpus[1].siblings == {1, 5}


def test_die_and_cluster_ids(two_node) -> None:
    two_node.write(f"{CPU}/cpu1/topology/die_id", "1")
    two_node.write(f"{CPU}/cpu5/topology/die_id", "1")
    for cpu, cluster in ((0, 7), (4, 7), (1, 65535), (5, 65535)):
        two_node.write(f"{CPU}/cpu{cpu}/topology/cluster_id", str(cluster))
    topo = discover(two_node.root)
    assert (topo.cpus[1].die, topo.cpus[0].die) == (1, 0)
    assert (topo.cpus[0].cluster, topo.cpus[1].cluster, topo.cpus[2].cluster) == (7, None, None)


# ---- issue 23: optional facts missing or meaningless degrade ----------------------------------
def _cache_map_only(fake, maps: dict[int, str]) -> None:
    """Every CPU's L3 as older x86/ia64 kernels print it: a map, no list, no id."""
    for cpu, mask in maps.items():
        index = f"{CPU}/cpu{cpu}/cache/index3"
        fake.remove(f"{index}/id")
        fake.remove(f"{index}/shared_cpu_list")
        fake.write(f"{index}/shared_cpu_map", mask)


@pytest.mark.parametrize(
    "node0_map,node1_map,expected",
    [
        ("33", "cc", {0: 0, 1: 0, 4: 0, 5: 0, 2: 2, 3: 2, 6: 2, 7: 2}),  # lowest CPU of the map
        ("00", "00", dict.fromkeys(range(8))),  # all-zero L3 map: unknown
        ("00000000,00000033", "cc", {0: 0, 1: 0, 4: 0, 5: 0, 2: 2, 3: 2, 6: 2, 7: 2}),
    ],
    ids=["map-without-list", "all-zero-map", "two-word-map"],
)
def test_l3_from_the_map_when_there_is_no_list(two_node, node0_map, node1_map, expected) -> None:
    _cache_map_only(two_node, {c: node0_map if c in NODE0 else node1_map for c in range(8)})
    topo = discover(two_node.root)
    assert {c: topo.cpus[c].l3 for c in range(8)} == expected
    assert topo.nodes[1].cpus == NODE1


@pytest.mark.parametrize("row", ["0 0", "0", "0 0 0"], ids=["zeros", "one-zero", "long-zeros"])
def test_zero_distance_row_is_a_missing_slit(two_node, row: str) -> None:
    two_node.write(f"{NODE}/node0/distance", row)
    two_node.write(f"{NODE}/node1/distance", row)
    topo = discover(two_node.root)
    assert (topo.nodes[0].distances, topo.nodes[1].distances) == ((10, 20), (20, 10))


def test_zero_distance_row_with_a_real_distance_is_still_garbage(two_node) -> None:
    two_node.write(f"{NODE}/node1/distance", "0 10")
    with pytest.raises(SysfsError) as err:
        discover(two_node.root)
    assert err.value.path == str(two_node.p(f"{NODE}/node1/distance"))


@pytest.mark.parametrize("list_too", [True, False], ids=["mask-and-list", "mask-only"])
def test_topology_with_only_thread_siblings(two_node, list_too: bool) -> None:
    for cpu in range(8):
        topo = f"{CPU}/cpu{cpu}/topology"
        siblings = sorted({cpu, cpu ^ 4})
        for name in ("physical_package_id", "die_id", "core_id", "thread_siblings_list"):
            two_node.remove(f"{topo}/{name}")
        two_node.write(f"{topo}/thread_siblings", f"{sum(1 << s for s in siblings):02x}")
        if list_too:
            two_node.write(f"{topo}/thread_siblings_list", ",".join(map(str, siblings)))
    topo = discover(two_node.root)
    assert topo.sockets() == {0}, "no package id: one package"
    assert {c.id: c.core for c in topo.cpus.values()} == {c: c & 3 for c in range(8)}
    assert {c.id: c.siblings for c in topo.cpus.values()} == {c: {c, c ^ 4} for c in range(8)}
    assert {c.die for c in topo.cpus.values()} == {0}
    assert {c.numa for c in topo.cpus.values() if c.id in NODE1} == {1}


def test_no_package_id_and_repeating_core_ids_keep_the_cores_apart(two_node) -> None:
    # core ids restart at 0 on each socket (cpu0 and cpu2 both say core 0); without package
    # ids nor package lists the sockets cannot be told apart, so the siblings name the cores
    for cpu in range(8):
        two_node.remove(f"{CPU}/cpu{cpu}/topology/physical_package_id")
    topo = discover(two_node.root)
    assert topo.sockets() == {0}
    assert len({c.core_key for c in topo.cpus.values()}) == 4
    assert {c.id: c.core for c in topo.cpus.values()} == {c: c & 3 for c in range(8)}


def test_hugepages_without_free_hugepages_are_unknown(two_node) -> None:
    two_node.remove(f"{NODE}/node1/hugepages/hugepages-2048kB/free_hugepages")
    topo = discover(two_node.root)
    pool = topo.nodes[1].hugepages_of(2048)
    assert pool is not None and (pool.total, pool.free) == (16, None)
    assert topo.nodes[0].hugepages_of(2048).free == 4
    assert json.loads(json.dumps(_json(topo)))["numa_nodes"]["1"]["hugepages"]["2048"]["free"] is None
    assert "2048 kB: 16 total, unknown free" in _text(topo)


def _link_cpus(fake, nodes: dict[int, frozenset[int]]) -> None:
    for node, cpus in nodes.items():
        for cpu in cpus:
            fake.link(f"{CPU}/cpu{cpu}/node{node}", f"{NODE}/node{node}")


def test_overlapping_node_cpulists_follow_the_cpu_links(two_node) -> None:
    _link_cpus(two_node, {0: NODE0, 1: NODE1})
    two_node.write(f"{NODE}/node0/cpulist", "0-7")
    two_node.write(f"{NODE}/node1/cpulist", "0-7")
    topo = discover(two_node.root)
    assert (topo.nodes[0].cpus, topo.nodes[1].cpus) == (NODE0, NODE1)
    assert {c.id: c.numa for c in topo.cpus.values()} == {c: 0 if c in NODE0 else 1 for c in range(8)}


@pytest.mark.parametrize(
    "links",
    [{}, {0: NODE0 | {2}, 1: NODE1}],
    ids=["no-links", "two-links"],
)
def test_overlapping_node_cpulists_the_links_do_not_settle(two_node, links) -> None:
    _link_cpus(two_node, links)
    two_node.write(f"{NODE}/node0/cpulist", "0-2,4-5")  # CPU 2 listed by both nodes
    with pytest.raises(TopologyError) as err:
        discover(two_node.root)
    text = str(err.value)
    assert str(two_node.p(f"{NODE}/node0/cpulist")) in text
    assert str(two_node.p(f"{NODE}/node1/cpulist")) in text
    assert "CPU 2" in text and "\n" not in text


# ---- relative roots ---------------------------------------------------------------------
def test_relative_sysfs_root(two_node, monkeypatch: pytest.MonkeyPatch) -> None:
    two_node.pci("0000:5e:00.0", numa_node=1, driver="ice", iommu_group=3, netdevs=("ens1",))
    clean = discover(two_node.root)
    monkeypatch.chdir(two_node.root.parent)
    _same_machine(discover(two_node.root.name), clean)
    _same_machine(discover(Path(".") / two_node.root.name), clean)


def test_relative_roots_in_the_cli(two_node, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(two_node.root.parent)
    assert cli.main(["topology", "--sysfs-root", two_node.root.name, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["numa_nodes"]["1"]["cpus"] == sorted(NODE1)


def test_relative_roots_through_the_cache(two_node, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(two_node.root.parent)
    first = cached_discover(two_node.root.name, None, str(tmp_path / "cache"))
    again = cached_discover(two_node.root.name, None, str(tmp_path / "cache"))
    _same_machine(first, discover(two_node.root))
    _same_machine(again, first)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # same relative name, another directory: not the same tree
    with pytest.raises(SysfsError):
        cached_discover(two_node.root.name, None, str(tmp_path / "cache"))


def _json(topo: Topology) -> dict:
    from numa_pin.cli.topology_render import to_json_dict

    return to_json_dict(topo)


def _text(topo: Topology) -> str:
    from numa_pin.cli.topology_render import render_text

    return render_text(topo)
