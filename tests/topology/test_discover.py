"""Discovery of NUMA nodes and CPUs from fake trees, the live machine (hwloc as the
oracle), JSON/text rendering, and the shapes of numa_pin.testing when present."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from numa_pin.cli.topology_render import render_text, to_json_dict
from numa_pin.topology.discover import discover
from numa_pin.topology.model import HugePages, Topology

# ---- machine shapes --------------------------------------------------------------------
SHAPES = [
    # nodes, cores per node, smt, distance rows (None = 10 local / 20 remote)
    (1, 2, 1, None),
    (2, 2, 2, None),
    (4, 1, 2, [[10, 12, 20, 22], [12, 10, 22, 20], [20, 22, 10, 12], [22, 20, 12, 10]]),
    (3, 3, 4, [[10, 15, 31], [16, 10, 32], [30, 33, 10]]),  # asymmetric SLIT
]


@pytest.mark.parametrize(
    "nodes,cores,smt,rows",
    SHAPES,
    ids=["1node-nosmt", "2node-smt2", "4node-slit", "3node-smt4-asym"],
)
def test_simple_shapes(fake, build_simple, nodes: int, cores: int, smt: int, rows) -> None:
    layout = build_simple(fake, nodes=nodes, cores_per_node=cores, smt=smt, distances=rows)
    topo = discover(fake.root)
    expected_rows = rows or [[10 if a == b else 20 for b in range(nodes)] for a in range(nodes)]

    assert topo.node_ids == tuple(range(nodes))
    assert len(topo.cpus) == nodes * cores * smt
    for n in range(nodes):
        node = topo.nodes[n]
        assert sorted(node.cpus) == layout[n]
        assert (node.memory_total_kb, node.memory_free_kb) == (1000 * (n + 1), 100 * (n + 1))
        assert node.hugepages == (HugePages(2048, 8 * (n + 1), 4), HugePages(1048576, n, 0))
        for m in range(nodes):
            assert topo.distance(n, m) == expected_rows[n][m]
        for cpu_id in layout[n]:
            cpu = topo.cpus[cpu_id]
            assert (cpu.numa, cpu.socket, cpu.l3, cpu.die) == (n, n, n, 0)
            assert len(cpu.siblings) == smt and cpu_id in cpu.siblings
            assert all(topo.cpus[s].core_key == cpu.core_key for s in cpu.siblings)
    assert topo.sockets() == frozenset(range(nodes))
    assert topo.source == str(fake.root)


def test_cpuless_and_memory_only_nodes(fake) -> None:
    # node 0: CPUs 0-1; node 1: memory only; node 3 (sparse id): CPUs 2-3, no memory
    rows = {0: [10, 20, 30], 1: [20, 10, 30], 3: [30, 30, 10]}
    fake.node(0, [0, 1], rows[0], 4096, 1024)
    fake.node(1, [], rows[1], 8192, 8000)
    fake.node(3, [2, 3], rows[3], 0, 0)
    for c in range(4):
        fake.cpu(c, socket=c // 2, core=c % 2, l3=c // 2)
    fake.online(range(4), [0, 1, 3])
    topo = discover(fake.root)

    assert topo.node_ids == (0, 1, 3)
    assert topo.nodes[1].cpus == frozenset()
    assert topo.nodes[1].memory_total_kb == 8192
    assert topo.nodes[3].memory_total_kb == 0 and topo.nodes[3].cpus == {2, 3}
    assert topo.distance(3, 1) == 30 and topo.distance(0, 3) == 30
    assert {c: topo.cpus[c].numa for c in range(4)} == {0: 0, 1: 0, 2: 3, 3: 3}
    assert "memory-only" in render_text(topo)


@pytest.mark.parametrize(
    "proc_meminfo,expected",
    [
        ("MemTotal:  2048 kB\nMemFree:  1000 kB\nHugePages_Total:  0\n", (2048, 1000)),
        (None, (0, 0)),
    ],
    ids=["with-proc-meminfo", "without-proc-root"],
)
def test_non_numa_kernel_fallback(tmp_path: Path, make_fake, proc_meminfo, expected) -> None:
    fake = make_fake(tmp_path / "sys")
    for c in range(3):
        fake.cpu(c, core=c)
    fake.online(range(3))  # no devices/system/node at all
    fake.write("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "6")
    fake.write("kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "5")
    proc_root = None
    if proc_meminfo is not None:
        proc_root = tmp_path / "proc"
        proc_root.mkdir()
        (proc_root / "meminfo").write_text(proc_meminfo)
    topo = discover(fake.root, proc_root)

    assert topo.node_ids == (0,)
    node = topo.nodes[0]
    assert node.cpus == {0, 1, 2}
    assert node.distances == (10,)
    assert (node.memory_total_kb, node.memory_free_kb) == expected
    assert node.hugepages == (HugePages(2048, 6, 5),)
    assert all(c.numa == 0 for c in topo.cpus.values())


def test_node_online_missing_lists_node_dirs(two_node) -> None:
    two_node.remove(f"{two_node.NODE}/online")
    two_node.write(f"{two_node.NODE}/has_cpu", "0-1")
    (two_node.p(f"{two_node.NODE}/power")).mkdir()
    topo = discover(two_node.root)
    assert topo.node_ids == (0, 1)


def test_offline_cpus_are_left_out(two_node) -> None:
    # cpu/online still lists 5 but its own online file says 0; 7 is not listed at all
    two_node.online([0, 1, 2, 3, 4, 5, 6])
    two_node.write(f"{two_node.CPU}/cpu5/online", "0")
    two_node.write(f"{two_node.CPU}/cpu4/online", "1")
    topo = discover(two_node.root)
    assert topo.cpu_ids == {0, 1, 2, 3, 4, 6}
    assert topo.nodes[0].cpus == {0, 1, 4} and topo.nodes[1].cpus == {2, 3, 6}
    assert topo.cpus[1].siblings == {1}  # sibling 5 is offline
    assert topo.cpus[0].siblings == {0, 4}


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"die": None}, {"die": 0}),
        ({"die": -1, "socket": -1}, {"die": 0, "socket": 0}),
        ({"die": 2, "socket": 1}, {"die": 2, "socket": 1}),
        ({"cluster": 65535}, {"cluster": None}),
        ({"cluster": -1}, {"cluster": None}),
        ({"cluster": 3}, {"cluster": 3}),
        ({}, {"cluster": None, "l3": 0}),
        ({"l3": 7}, {"l3": 7}),
        ({"l3": None, "l3_shared": [1, 0]}, {"l3": 0}),
        ({"l3": None}, {"l3": None}),
    ],
    ids=[
        "die-missing",
        "negative-ids",
        "die-and-socket",
        "cluster-unknown-x86",
        "cluster-unknown-arm",
        "cluster-id",
        "no-cluster-file",
        "l3-id",
        "l3-id-missing-lowest-shared",
        "no-l3",
    ],
)
def test_cpu_topology_fields(fake, kwargs: dict, expected: dict) -> None:
    fake.cpu(1, core=0, siblings=[1], **kwargs)
    fake.node(0, [1], [10])
    fake.online([1], [0])
    cpu = discover(fake.root).cpus[1]
    for field, value in expected.items():
        assert getattr(cpu, field) == value, field


def test_cpu_found_through_node_link(two_node) -> None:
    two_node.write(f"{two_node.NODE}/node1/cpulist", "2-3,6")  # 7 missing from every cpulist
    two_node.link(f"{two_node.CPU}/cpu7/node1", f"{two_node.NODE}/node1")
    topo = discover(two_node.root)
    assert topo.cpus[7].numa == 1


def test_pci_can_be_skipped(two_node) -> None:
    two_node.pci("0000:01:00.0", numa_node=1)
    assert len(discover(two_node.root).pci_devices) == 1
    assert discover(two_node.root, pci=False).pci_devices == ()


# ---- rendering -------------------------------------------------------------------------
def _machine_with_devices(fake) -> Topology:
    fake.simple()
    fake.pci(
        "0000:3b:00.0",
        pci_class="0x030200",
        vendor="0x10de",
        device="0x20b0",
        numa_node=0,
        driver="nvidia",
        iommu_group=12,
    )
    pf = fake.pci(
        "0000:5e:00.0",
        numa_node=1,
        driver="ice",
        netdevs=["ens1f0"],
        sriov_totalvfs=8,
        sriov_numvfs=1,
        iommu_group=30,
    )
    vf = fake.pci("0000:5e:01.0", numa_node=1, driver="iavf", pci_class="0x020000")
    fake.sriov(pf, {0: vf})
    return discover(fake.root)


def test_json_types(fake) -> None:
    data = json.loads(json.dumps(to_json_dict(_machine_with_devices(fake))))

    assert set(data) == {"numa_nodes", "cpus", "pci_devices"}
    node1 = data["numa_nodes"]["1"]
    assert node1["cpus"] == [2, 3, 6, 7]
    assert node1["distances"] == {"0": 20, "1": 10}
    assert node1["hugepages"] == {
        "2048": {"total": 16, "free": 4},
        "1048576": {"total": 1, "free": 0},
    }
    assert type(node1["memory_total_kb"]) is int and type(node1["memory_free_kb"]) is int
    cpu4 = data["cpus"]["4"]
    assert cpu4 == {
        "socket": 0,
        "die": 0,
        "core": 0,
        "cluster": None,
        "numa": 0,
        "l3": 0,
        "siblings": [0, 4],
    }
    assert list(data["cpus"]) == [str(i) for i in range(8)]
    gpu, pf, vf = data["pci_devices"]
    assert gpu["vendor"] == "0x10de" and gpu["device"] == "0x20b0" and gpu["class"] == "0x030200"
    assert (gpu["kind"], gpu["numa_node"], gpu["iommu_group"], gpu["driver"]) == (
        "gpu",
        0,
        12,
        "nvidia",
    )
    assert gpu["gpu_uuid"] is None and gpu["physfn"] is None
    assert (
        pf["vfs"] == ["0000:5e:01.0"] and pf["netdevs"] == ["ens1f0"] and pf["sriov_totalvfs"] == 8
    )
    assert vf["physfn"] == "0000:5e:00.0" and vf["numa_node"] == 1 and vf["iommu_group"] is None
    # every non-key number is a JSON number, never a string
    for dev in data["pci_devices"]:
        for key in ("numa_node", "iommu_group", "sriov_totalvfs", "sriov_numvfs", "gpu_minor"):
            assert dev[key] is None or type(dev[key]) is int, key
        assert all(type(c) is int for c in dev["local_cpus"])


def test_json_keys_follow_numeric_order(fake) -> None:
    rows = [[10 if a == b else 20 for b in range(12)] for a in range(12)]
    for n in range(12):
        fake.cpu(n, socket=n, core=0, l3=n)
        fake.node(n, [n], rows[n])
    fake.online(range(12), range(12))
    data = to_json_dict(discover(fake.root))
    assert list(data["numa_nodes"]) == [str(n) for n in range(12)]
    assert list(data["numa_nodes"]["3"]["distances"]) == [str(n) for n in range(12)]


def test_render_text(fake) -> None:
    text = render_text(_machine_with_devices(fake))
    node0 = text.split("NUMA node 0")[1].split("NUMA node 1")[0]
    node1 = text.split("NUMA node 1")[1].split("NUMA distances")[0]
    assert "socket 0 core 0: 0,4" in node0 and "socket 0 core 1: 1,5" in node0
    assert "socket 1 core 0: 2,6" in node1
    assert "memory: 1000 kB" in node0 and "100 kB" in node0
    assert "2048 kB: 8 total, 4 free" in node0
    assert "0000:3b:00.0" in node0 and "0000:3b:00.0" not in node1
    assert (
        "0000:5e:00.0" in node1
        and "sriov 1/8 VFs" in node1
        and "1 SR-IOV virtual function" in node1
    )
    table = text.split("NUMA distances:\n")[1].splitlines()
    assert table[0].split() == ["node", "0", "1"]
    assert table[1].split() == ["0", "10", "20"] and table[2].split() == ["1", "20", "10"]


# ---- the live machine, hwloc as the oracle ---------------------------------------------
def _hwloc_bitmap(text: str) -> frozenset[int]:
    """hwloc's ``0xffffffff,0x00000003`` bitmap format (independent of numa_pin.base.cpuset)."""
    words = [w[2:] if w.startswith("0x") else w for w in text.split(",")]
    value = int("".join(w.rjust(8, "0") for w in words), 16)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


LSTOPO = shutil.which("lstopo-no-graphics") or shutil.which("lstopo")


def _lstopo_xml() -> ET.Element:
    assert LSTOPO is not None
    out = subprocess.run(
        [LSTOPO, "--of", "xml", "--whole-io", "--whole-system", "-"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return ET.fromstring(out)


def _objects(root: ET.Element, kind: str) -> list[ET.Element]:
    return [o for o in root.iter("object") if o.get("type") == kind]


@pytest.mark.lstopo
@pytest.mark.skipif(not os.path.isdir("/sys/devices/system/cpu"), reason="no live sysfs")
@pytest.mark.skipif(LSTOPO is None, reason="hwloc (lstopo) is not installed")
def test_live_machine_agrees_with_lstopo() -> None:
    xml = _lstopo_xml()
    topo = discover("/sys", "/proc")

    hw_nodes = {int(o.get("os_index")): o for o in _objects(xml, "NUMANode")}
    assert set(topo.nodes) == set(hw_nodes)
    for n, obj in hw_nodes.items():
        assert topo.nodes[n].cpus == _hwloc_bitmap(obj.get("cpuset")), f"PUs of node {n}"
        assert topo.nodes[n].memory_total_kb * 1024 == int(obj.get("local_memory")), (
            f"memory of node {n}"
        )
        for page in obj.findall("page_type"):
            size_kb = int(page.get("size")) // 1024
            hp = topo.nodes[n].hugepages_of(size_kb)
            if hp is not None:
                assert hp.total == int(page.get("count")), f"{size_kb} kB pages of node {n}"
    assert topo.cpu_ids == {int(o.get("os_index")) for o in _objects(xml, "PU")}
    assert topo.sockets() == {int(o.get("os_index")) for o in _objects(xml, "Package")}
    hw_cores = {
        frozenset(int(pu.get("os_index")) for pu in _objects(core, "PU"))
        for core in _objects(xml, "Core")
    }
    assert {c.siblings for c in topo.cpus.values()} == hw_cores

    # PCI: same functions, same ids, and the same node where hwloc pins one
    parent_of = {
        child: parent for parent in xml.iter("object") for child in parent.findall("object")
    }
    hw_pci = {o.get("pci_busid"): o for o in xml.iter("object") if o.get("pci_busid")}
    assert {d.address for d in topo.pci_devices} == set(hw_pci)
    for dev in topo.pci_devices:
        obj = hw_pci[dev.address]
        cls4, ids = obj.get("pci_type").split()[:2]
        assert int(dev.pci_class, 16) >> 8 == int(cls4, 16), dev.address
        assert ids == f"[{dev.vendor[2:]}:{dev.device[2:]}]", dev.address
        anc = obj
        while anc.get("nodeset") is None and anc in parent_of:
            anc = parent_of[anc]
        hw_nodeset = _hwloc_bitmap(anc.get("nodeset"))
        if len(hw_nodeset) == 1:
            assert dev.numa_node == next(iter(hw_nodeset)), dev.address


# ---- shapes of the shared machine kit --------------------------------------------------
from numa_pin.testing import machine as kit_machine  # noqa: E402 (the kit is part of the package)
from numa_pin.testing import shapes as kit_shapes  # noqa: E402


@pytest.mark.parametrize("name", kit_shapes.shape_names())
def test_testing_kit_shapes(tmp_path: Path, name: str) -> None:
    spec = kit_shapes.shape(name)
    built = kit_machine.build(spec, tmp_path / name)
    topo = discover(built.sysfs_root, built.proc_root)

    assert len(topo.cpus) == len(spec.online_cpus) and topo.cpu_ids == spec.online_cpus
    if spec.quirks.node_cpulists_overlap and spec.quirks.flat_node_distance:  # one node, as hwloc
        assert {n: node.cpus for n, node in topo.nodes.items()} == {spec.node_ids[0]: spec.online_cpus}
    else:
        assert topo.node_ids == tuple(spec.node_ids)
        for n in spec.node_ids:
            assert topo.nodes[n].cpus == spec.cpus_of_node(n), f"node {n}"
    # the kit's own expectation, written independently of discovery, must match exactly
    expected = kit_machine.expected_topology(spec, str(built.sysfs_root))
    assert dict(topo.nodes) == dict(expected.nodes)
    assert dict(topo.cpus) == dict(expected.cpus)
    assert topo.pci_devices == expected.pci_devices
    json.dumps(to_json_dict(topo))
    render_text(topo)
