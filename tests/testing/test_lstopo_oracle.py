"""hwloc's lstopo as an independent oracle for the machine kit and for discovery.

Each shape is written with :func:`numa_pin.testing.machine.build` and read back by
``lstopo-no-graphics --input <root> --whole-io --of xml -`` (hwloc's Linux backend reading
``<root>/sys`` and ``<root>/proc``). What hwloc reports must match the spec: NUMA nodes,
PUs per node, packages, cores, L3 caches, memory, hugepages, the SLIT and every PCI function
with its bridge, netdevs and locality. Then numa-pin's own discovery of the same tree must
match hwloc's view.

Only hwloc's rules are modelled here, never the kit's code: a CPU-less node sits with its
HMAT initiators, else with the node(s) nearest by SLIT (no locality when every other node is
equally near); a PCI tree sits where the ``local_cpus`` of the function on the root bus points.

The quirk shapes (``QUIRK_SHAPES``, issue 12) run through every test. Where hwloc reads a quirk
differently from the kernel's meaning, the test says so:

* no ``nodeN/distance`` file: hwloc reports no distance matrix at all, while the kernel (and
  numa-pin) use 10 local / 20 remote, the kernel's default without a SLIT;
* ``physical_package_id`` -1: hwloc still makes one Package per ``package_cpus`` group but
  gives it no os_index; numa-pin numbers them 0, 1, ... by lowest CPU;
* a CPU-less node equally near every other node: hwloc gives it an empty cpuset
  (``fixup_cpuless_node_locality_from_distances`` refuses to choose); numa-pin never gives a
  CPU-less node a locality anyway.

Issue 23's shapes, where hwloc 2.9 and numa-pin differ on purpose:

* an all-zero level-3 ``shared_cpu_map``: hwloc takes an empty cache mask for the core's own
  (one L3 per core); numa-pin calls the L3 unknown (None), as it cannot know which CPUs share it;
* ``nodeN/distance`` rows of zeros: hwloc keeps the zero matrix; numa-pin uses the kernel's
  no-SLIT default, 10 local / 20 remote;
* a ``topology/`` with only the thread siblings: hwloc makes no Package (only the nodes'
  Groups and the cores); numa-pin one package, socket 0;
* node cpulists that overlap: hwloc keeps the first node with every CPU in its cpumap and drops
  the others (and the distance matrix); numa-pin gives each CPU to its ``cpuN/nodeM`` link,
  unless the SLIT is all 10s too (issue 37: hwloc's buggy-NUMA Xeon 5400): then it reads the
  machine as hwloc does, one node;
* a package mask of one core with ``physical_package_id`` -1 and the chips named only by the
  device tree's ``ibm,chip-id`` (a POWER7 LPAR, issue 37): hwloc 2.9 reads no device tree (its
  Linux backend has had no device-tree code since 2.3, and ``HWLOC_USE_DT`` is gone), so its
  packages are the cores, without an os_index; numa-pin reads the same packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from numa_pin.base.record import replace
from numa_pin.testing.machine import GIB_KB, CpulessNodeSpec, MachineSpec, PciSpec, build_once
from numa_pin.testing.shapes import QUIRK_SHAPES, SHAPES, shape
from numa_pin.testing.spec_parts import KernelQuirks
from numa_pin.topology.model import Topology

pytestmark = pytest.mark.lstopo

_LSTOPO_NAMES = ("lstopo-no-graphics", "lstopo")
NO_QUIRKS = KernelQuirks()


def _variants() -> dict[str, MachineSpec]:
    """Builder options the named shapes do not use, checked the same way."""
    return {
        "offline-cpus": replace(
            shape("intel-2s-ht"), name="offline-cpus", offline_cpus=frozenset({3, 19, 9})
        ),
        "two-dies": replace(shape("amd-nps4-8node"), name="two-dies", dies_per_socket=2),
        "adjacent-siblings": replace(
            shape("intel-2s-snc2"), name="adjacent-siblings", sibling_layout="adjacent"
        ),
        "cxl-initiators": replace(
            shape("cpuless-memory-node"),
            name="cxl-initiators",
            cpuless_nodes=(CpulessNodeSpec(memory_kb=128 * GIB_KB, socket=0, initiators=True),),
        ),
        "l3-per-node": replace(shape("intel-2s-snc2"), name="l3-per-node", l3_scope="node"),
        "infiniband": _with_ib_hcas(shape("gpu8-sriov")),
    }


#: ``infiniband``: a dual-port ConnectX HCA in InfiniBand mode (class 0x0207) below a root port of
#: node 2, its ports' IPoIB interfaces ib0 and ib1
IB_PORTS = ("0000:a1:00.0", "0000:a1:00.1")


def _with_ib_hcas(base: MachineSpec) -> MachineSpec:
    from numa_pin.testing.pci_spec import CLASS_INFINIBAND, CLASS_PCI_BRIDGE

    root_port = PciSpec("0000:a0:01.0", "0x8086", "0x347a", CLASS_PCI_BRIDGE, 2, driver="pcieport")
    ports = tuple(PciSpec(a, "0x15b3", "0x101b", CLASS_INFINIBAND, 2, driver="mlx5_core", parent=root_port.address,
                          netdevs=(f"ib{i}",)) for i, a in enumerate(IB_PORTS))
    return replace(base, name="infiniband", pci=(*base.pci, root_port, *ports))


ALL_SPECS: dict[str, MachineSpec] = {name: shape(name) for name in SHAPES} | _variants()
PCI_SPECS = {name: spec for name, spec in ALL_SPECS.items() if spec.pci}


# ---- running and parsing lstopo -------------------------------------------------------
@pytest.fixture(scope="module")
def lstopo() -> str:
    for name in _LSTOPO_NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("hwloc's lstopo is not installed (Debian/Ubuntu: apt-get install hwloc)")


def _parse_bitmap(text: str) -> frozenset[int]:
    """hwloc bitmap text (``0x000000ff,0x0000ff00``: 32-bit words, most significant first)."""
    text = text.strip()
    if "f...f" in text:
        raise AssertionError(f"unexpected infinite hwloc bitmap {text!r}")
    value = 0
    for word in text.split(","):
        word = word.strip().removeprefix("0x")
        value = (value << 32) | int(word or "0", 16)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


@dataclass
class PciSeen:
    busid: str
    class_id: str  # "0302"
    vendor: str  # "10de"
    device: str
    parent_busid: str | None  # upstream bridge function, None under a host bridge
    cpu_nodes: frozenset[int]  # NUMA nodes (with CPUs) of the object the tree hangs from
    netdevs: frozenset[str]


@dataclass
class LstopoView:
    node_cpus: dict[int, frozenset[int]] = field(default_factory=dict)
    node_memory: dict[int, int] = field(default_factory=dict)  # bytes
    node_pages: dict[int, dict[int, int]] = field(default_factory=dict)  # bytes -> count
    packages: dict[int, frozenset[int]] = field(default_factory=dict)  # known os_index only
    package_sets: set[frozenset[int]] = field(default_factory=set)  # every Package's cpuset
    dies: set[tuple[int, frozenset[int]]] = field(default_factory=set)
    cores: set[frozenset[int]] = field(default_factory=set)
    l3: set[frozenset[int]] = field(default_factory=set)
    pus: frozenset[int] = frozenset()
    distances: dict[tuple[int, int], int] = field(default_factory=dict)
    pci: dict[str, PciSeen] = field(default_factory=dict)


def _run_lstopo(lstopo: str, root: Path) -> ET.Element:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLOC_")}
    proc = subprocess.run(
        [lstopo, "--input", str(root), "--whole-io", "--of", "xml", "-"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, f"lstopo failed on {root}: {proc.stderr}"
    return ET.fromstring(proc.stdout)


def _read_view(top: ET.Element) -> LstopoView:
    view = LstopoView()
    pus: set[int] = set()

    def walk(obj: ET.Element, ancestors: list[ET.Element]) -> None:
        kind = obj.get("type")
        if kind == "NUMANode":
            os_index = int(obj.get("os_index", "-1"))
            view.node_cpus[os_index] = _parse_bitmap(obj.get("cpuset", "0x0"))
            view.node_memory[os_index] = int(obj.get("local_memory", "0"))
            view.node_pages[os_index] = {
                int(p.get("size", "0")): int(p.get("count", "0")) for p in obj.findall("page_type")
            }
        elif kind == "Package":
            cpus = _parse_bitmap(obj.get("cpuset", ""))
            view.package_sets.add(cpus)
            os_index = int(obj.get("os_index", "-1"))
            if 0 <= os_index < 0xFFFFFFFF:  # hwloc's HWLOC_UNKNOWN_INDEX, or no attribute
                view.packages[os_index] = cpus
        elif kind == "Die":
            pkg = next(a for a in reversed(ancestors) if a.get("type") == "Package")
            view.dies.add((int(pkg.get("os_index", "-1")), _parse_bitmap(obj.get("cpuset", ""))))
        elif kind == "Core":
            view.cores.add(_parse_bitmap(obj.get("cpuset", "")))
        elif kind == "L3Cache":
            view.l3.add(_parse_bitmap(obj.get("cpuset", "")))
        elif kind == "PU":
            pus.add(int(obj.get("os_index", "-1")))
        elif kind == "PCIDev" or (kind == "Bridge" and obj.get("pci_busid")):
            busid = obj.get("pci_busid", "")
            class_id, ids = obj.get("pci_type", "").split(" ")[:2]
            vendor, device = ids.strip("[]").split(":")
            parent = ancestors[-1]
            anchor = next(
                a for a in reversed(ancestors) if a.get("type") not in ("Bridge", "PCIDev")
            )
            view.pci[busid] = PciSeen(
                busid=busid,
                class_id=class_id,
                vendor=vendor,
                device=device,
                parent_busid=parent.get("pci_busid") if parent.get("type") == "Bridge" else None,
                cpu_nodes=_parse_bitmap(anchor.get("nodeset", "0x0")),
                netdevs=frozenset(
                    o.get("name", "")
                    for o in obj.findall("object")
                    if o.get("type") == "OSDev" and o.get("osdev_type") == "2"
                ),
            )
        for child in obj.findall("object"):
            walk(child, [*ancestors, obj])

    machine = top.find("object")
    assert machine is not None and machine.get("type") == "Machine"
    walk(machine, [])
    view.pus = frozenset(pus)
    # restrict PCI localities to nodes that own CPUs (CPU-less nodes ride along in nodesets)
    with_cpus = {n for n, cpus in view.node_cpus.items() if cpus and not _is_shared(view, n)}
    for seen in view.pci.values():
        seen.cpu_nodes = seen.cpu_nodes & frozenset(with_cpus)
    for dist in top.findall("distances2"):
        if dist.get("type") != "NUMANode":
            continue
        indexes = [int(x) for i in dist.findall("indexes") for x in (i.text or "").split()]
        values = [int(x) for v in dist.findall("u64values") for x in (v.text or "").split()]
        n = len(indexes)
        assert len(values) == n * n, "truncated hwloc distance matrix"
        for i, a in enumerate(indexes):
            for j, b in enumerate(indexes):
                view.distances[(a, b)] = values[i * n + j]
    return view


def _is_shared(view: LstopoView, node: int) -> bool:
    """True when another node's cpuset lies inside this one's (strictly, or equal with a
    lower id): this node then only inherits the locality hwloc attached it at, i.e. it is
    CPU-less. Linux numbers CPU-less nodes after the CPU nodes, hence the tie-break."""
    mine = view.node_cpus[node]
    for other, cpus in view.node_cpus.items():
        if other != node and cpus and cpus <= mine and (cpus < mine or other < node):
            return True
    return False


@pytest.fixture(scope="module")
def views(
    lstopo: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[MachineSpec, Path, LstopoView]]:
    cache = tmp_path_factory.getbasetemp() / "machines"
    out = {}
    for name, spec in ALL_SPECS.items():
        root = build_once(spec, cache).root
        out[name] = (spec, root, _read_view(_run_lstopo(lstopo, root)))
    return out


# ---- what hwloc should conclude from a spec (hwloc's rules, not the kit's) ---------------
def _spec_cores(spec: MachineSpec) -> set[frozenset[int]]:
    layout = [c for c in spec.cpu_layout() if c.online]
    return {frozenset(c.id for c in layout if c.core_index == k) for k in {c.core_index for c in layout}}


def _hwloc_node_locality(spec: MachineSpec, node: int) -> frozenset[int]:
    cpuless = spec.cpuless_spec(node)
    if cpuless is None:
        return spec.cpus_of_node(node)
    if cpuless.initiators:
        near = [m for m in spec.cpu_node_ids if spec.socket_of_node(m) == cpuless.socket]
    else:  # hwloc's fixup_cpuless_node_locality_from_distances: nearest of *all* other nodes
        others = [m for m in spec.node_ids if m != node]
        best = min(spec.distance(node, m) for m in others)
        near = [m for m in others if spec.distance(node, m) == best]
        if best <= spec.distance(node, node) or len(near) == len(others):
            return frozenset()  # equally near everything: hwloc gives it no locality
    return frozenset().union(*(spec.cpus_of_node(m) for m in near))


def _root_function(spec: MachineSpec, address: str) -> PciSpec:
    by_addr = spec.pci_by_address()
    vf_owner = {vf.address: pf for pf in spec.pci for vf in pf.vfs}
    dev = by_addr.get(address) or vf_owner[address]
    while dev.parent is not None:
        dev = by_addr[dev.parent]
    return dev


def _hwloc_pci_nodes(spec: MachineSpec, address: str) -> frozenset[int]:
    """CPU nodes of the object hwloc hangs the function's PCI tree from."""
    local = spec.pci_local_cpus(_root_function(spec, address))
    if spec.quirks.node_cpulists_overlap:  # hwloc kept one node, holding every CPU
        return frozenset({spec.node_ids[0]}) if local else frozenset()
    return frozenset(n for n in spec.cpu_node_ids if spec.cpus_of_node(n) & local)


def _spec_functions(spec: MachineSpec) -> dict[str, tuple[PciSpec, str | None, tuple[str, ...]]]:
    """address -> (spec of the PF or function, parent address, netdevs)."""
    out: dict[str, tuple[PciSpec, str | None, tuple[str, ...]]] = {}
    for dev in spec.pci:
        out[dev.address] = (dev, dev.parent, dev.netdevs)
        for vf in dev.vfs:
            out[vf.address] = (dev, dev.parent, (vf.netdev,) if vf.netdev else ())
    return out


# ---- lstopo versus the spec --------------------------------------------------------------
@pytest.mark.parametrize("name", list(ALL_SPECS), ids=list(ALL_SPECS))
def test_numa_nodes_and_their_pus(views, name: str) -> None:
    spec, _, view = views[name]
    assert view.pus == spec.online_cpus
    if spec.quirks.node_cpulists_overlap:  # hwloc: the first node, with every listed CPU
        assert view.node_cpus == {spec.node_ids[0]: spec.online_cpus}
        return
    assert sorted(view.node_cpus) == list(spec.node_ids)
    for node in spec.node_ids:
        assert view.node_cpus[node] == _hwloc_node_locality(spec, node), f"node {node}"
    assert view.pus == spec.online_cpus


@pytest.mark.parametrize("name", list(ALL_SPECS), ids=list(ALL_SPECS))
def test_packages_dies_cores_and_l3(views, name: str) -> None:
    spec, _, view = views[name]
    sockets = {s: spec.cpus_of_socket(s) for s in range(spec.sockets)}
    if spec.quirks.package_mask_per_core:  # hwloc's packages are the kernel's masks: the cores
        sockets = {s: cpus for s, cpus in enumerate(sorted(_spec_cores(spec), key=min))}
    if spec.quirks.topology_siblings_only:  # no package files at all: hwloc makes no Package
        assert (view.package_sets, view.packages) == (set(), {})
    else:
        assert view.package_sets == set(sockets.values())
    if spec.quirks.topology_siblings_only:
        pass
    elif spec.quirks.package_id_unknown or spec.quirks.package_mask_per_core:  # no os_index
        assert view.packages == {}
    else:
        assert view.packages == sockets
    layout = [c for c in spec.cpu_layout() if c.online]
    cores = _spec_cores(spec)
    assert view.cores == cores
    l3 = {frozenset(c.id for c in layout if c.l3 == k) for k in {c.l3 for c in layout}}
    # an all-zero L3 map: hwloc gives each core its own L3 (its rule for an empty cache mask)
    assert view.l3 == (cores if spec.quirks.l3_map_zero else l3)
    if spec.dies_per_socket > 1:
        dies = {
            (c.socket, frozenset(o.id for o in layout if (o.socket, o.die) == (c.socket, c.die)))
            for c in layout
        }
        assert view.dies == dies
    else:
        assert view.dies == set()


@pytest.mark.parametrize("name", list(ALL_SPECS), ids=list(ALL_SPECS))
def test_memory_and_hugepages(views, name: str) -> None:
    spec, _, view = views[name]
    nodes = spec.node_ids[:1] if spec.quirks.node_cpulists_overlap else spec.node_ids
    assert sorted(view.node_memory) == list(nodes)
    for node in nodes:
        assert view.node_memory[node] == spec.node_memory_kb(node) * 1024, f"node {node}"
        declared = spec.node_hugepages(node)
        for size_kb in (2048, 1048576):
            assert view.node_pages[node].get(size_kb * 1024, 0) == declared.get(size_kb, (0, 0))[0]


@pytest.mark.parametrize("name", list(ALL_SPECS), ids=list(ALL_SPECS))
def test_distance_matrix(views, name: str) -> None:
    spec, _, view = views[name]
    if spec.node_count == 1:
        assert view.distances in ({}, {(0, 0): 10})
        return
    if spec.quirks.no_node_distance or spec.quirks.node_cpulists_overlap:
        assert view.distances == {}  # no files (the kernel means 10/20), or a node dropped
        return
    if spec.quirks.zero_node_distance:  # hwloc keeps the zeros (the kernel means 10/20)
        assert view.distances == {(a, b): 0 for a in spec.node_ids for b in spec.node_ids}
        return
    expected = {(a, b): spec.distance(a, b) for a in spec.node_ids for b in spec.node_ids}
    assert view.distances == expected


def test_every_quirk_shape_is_checked_against_lstopo() -> None:
    assert set(QUIRK_SHAPES) <= set(ALL_SPECS)


def test_asymmetric_slit_survives(views) -> None:
    _, _, view = views["amd-nps4-8node"]
    assert (view.distances[(6, 7)], view.distances[(7, 6)]) == (11, 13)


@pytest.mark.parametrize("name", list(PCI_SPECS), ids=list(PCI_SPECS))
def test_pci_functions_bridges_and_netdevs(views, name: str) -> None:
    spec, _, view = views[name]
    functions = _spec_functions(spec)
    assert set(view.pci) == set(functions)
    for address, (dev, parent, netdevs) in functions.items():
        seen = view.pci[address]
        is_vf = address != dev.address
        device = (dev.vf_device or dev.device) if is_vf else dev.device
        assert (seen.class_id, seen.vendor, seen.device) == (
            dev.pci_class[2:6],
            dev.vendor[2:],
            device[2:],
        ), address
        assert seen.parent_busid == parent, address
        assert seen.netdevs == frozenset(netdevs), address


@pytest.mark.parametrize("name", list(PCI_SPECS), ids=list(PCI_SPECS))
def test_pci_locality(views, name: str) -> None:
    spec, _, view = views[name]
    for address in _spec_functions(spec):
        assert view.pci[address].cpu_nodes == _hwloc_pci_nodes(spec, address), address


def test_gpu8_every_gpu_and_nic_is_on_one_node(views) -> None:
    """The shape's promise, read through hwloc: 2 GPUs per node, NICs on nodes 0/3/2."""
    _, _, view = views["gpu8-sriov"]
    gpus = sorted(
        (next(iter(s.cpu_nodes)), a)
        for a, s in view.pci.items()
        if s.class_id == "0302" and len(s.cpu_nodes) == 1
    )
    assert [n for n, _ in gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert view.pci["0000:32:00.0"].cpu_nodes == {0}
    assert view.pci["0000:c9:00.0"].cpu_nodes == {3}
    assert view.pci["0000:5d:00.0"].cpu_nodes == {1}  # numa_node -1, local_cpulist node 1
    assert view.pci["0000:9c:00.0"].cpu_nodes == {2}  # numa_node -1, root port on node 2


# ---- numa-pin's discovery versus lstopo --------------------------------------------------
@pytest.mark.parametrize("name", list(ALL_SPECS), ids=list(ALL_SPECS))
def test_discovery_agrees_with_lstopo(views, name: str) -> None:
    from numa_pin.topology.discover import discover  # lazy: another area's module

    spec, root, view = views[name]
    _assert_discovery_matches(discover(root / "sys", root / "proc"), view, spec.quirks)


def _assert_discovery_matches(
    topo: Topology, view: LstopoView, quirks: KernelQuirks = NO_QUIRKS
) -> None:
    if quirks.node_cpulists_overlap and quirks.flat_node_distance:  # nothing tells nodes apart
        assert {n: node.cpus for n, node in topo.nodes.items()} == view.node_cpus  # hwloc's one node
    elif quirks.node_cpulists_overlap:  # hwloc kept the first node, holding every CPU
        first = topo.node_ids[0]
        assert view.node_cpus == {first: topo.cpu_ids}
        assert all(topo.nodes[n].cpus for n in topo.node_ids), "every node keeps its own CPUs"
        assert topo.nodes[first].memory_total_kb * 1024 == view.node_memory[first]
        topo = replace(topo, nodes={first: replace(topo.nodes[first], cpus=topo.cpu_ids)})
    assert topo.node_ids == tuple(sorted(view.node_cpus))
    for node in topo.node_ids:
        own = topo.nodes[node].cpus
        if own:
            assert own == view.node_cpus[node], f"node {node}"
        else:  # CPU-less: hwloc attaches it to a CPU node's locality, never gives it PUs
            # (or, equally near every node, no locality at all: an empty cpuset)
            assert _is_shared(view, node) or not view.node_cpus[node], f"node {node} has PUs"
        assert topo.nodes[node].memory_total_kb * 1024 == view.node_memory[node]
        totals = {hp.size_kb * 1024: hp.total for hp in topo.nodes[node].hugepages}
        for size, count in view.node_pages[node].items():
            if size in totals:
                assert totals[size] == count, f"node {node} {size}"
    assert topo.cpu_ids == view.pus
    sockets = {
        s: frozenset(c.id for c in topo.cpus.values() if c.socket == s) for s in topo.sockets()
    }
    if quirks.topology_siblings_only:  # hwloc: no Package; numa-pin: one, socket 0
        assert (sockets, view.package_sets) == ({0: topo.cpu_ids}, set())
    else:
        assert set(sockets.values()) == view.package_sets
    if quirks.topology_siblings_only:
        pass
    elif view.packages:  # hwloc knows the package ids: they must be the same
        assert sockets == view.packages
    else:  # ids unknown to hwloc (-1): numa-pin numbers packages by lowest CPU
        lowest = [min(sockets[s]) for s in sorted(sockets)]
        assert lowest == sorted(lowest)
    assert {c.siblings for c in topo.cpus.values()} == view.cores
    l3 = {frozenset(o.id for o in topo.cpus.values() if o.l3 == c.l3) for c in topo.cpus.values()}
    if quirks.l3_map_zero:  # numa-pin: unknown; hwloc: one per core
        assert {c.l3 for c in topo.cpus.values()} == {None}
        assert view.l3 == view.cores
    else:
        assert l3 == view.l3
    if len(topo.node_ids) > 1:
        got = {(a, b): topo.distance(a, b) for a in topo.node_ids for b in topo.node_ids}
        if quirks.zero_node_distance:  # hwloc keeps the zeros, numa-pin the no-SLIT default
            assert set(view.distances.values()) == {0}
            assert got == {(a, b): 10 if a == b else 20 for a, b in got}
        elif view.distances:
            assert got == view.distances
        else:  # no distance files: hwloc has no matrix, numa-pin the kernel's no-SLIT one
            assert got == {(a, b): 10 if a == b else 20 for a, b in got}


@pytest.mark.parametrize("name", list(PCI_SPECS), ids=list(PCI_SPECS))
def test_discovery_pci_agrees_with_lstopo(views, name: str) -> None:
    from numa_pin.topology.discover import discover  # lazy: another area's module

    spec, root, view = views[name]
    _assert_discovery_pci_matches(discover(root / "sys", root / "proc"), view, spec.quirks)


def _assert_discovery_pci_matches(
    topo: Topology, view: LstopoView, quirks: KernelQuirks = NO_QUIRKS
) -> None:
    assert {d.address for d in topo.pci_devices} == set(view.pci)
    pinned = 0
    for seen in view.pci.values():
        dev = topo.device(seen.busid)
        assert dev is not None
        assert (dev.vendor, dev.device) == ("0x" + seen.vendor, "0x" + seen.device)
        assert dev.parent == seen.parent_busid
        assert set(dev.netdevs) == seen.netdevs
        if quirks.node_cpulists_overlap:  # hwloc has one node left: its pin says nothing
            continue
        if len(seen.cpu_nodes) == 1:  # hwloc pins the function's tree to one node
            assert dev.numa_node == next(iter(seen.cpu_nodes)), seen.busid
            pinned += 1
    assert pinned > 0 or quirks.node_cpulists_overlap


# ---- real machines: sysfs snapshots (tests/testing/snapshots/capture.py) ------------------
SNAPSHOTS_DIR = Path(__file__).parent / "snapshots"
SNAPSHOTS = sorted(p.name for p in SNAPSHOTS_DIR.iterdir() if (p / "sys").is_dir())


@pytest.mark.parametrize("name", SNAPSHOTS, ids=SNAPSHOTS)
def test_discovery_agrees_with_lstopo_on_a_real_snapshot(
    lstopo: str, tmp_path: Path, name: str
) -> None:
    from numa_pin.topology.discover import discover  # lazy: another area's module

    root = tmp_path / name
    shutil.copytree(SNAPSHOTS_DIR / name, root, symlinks=True)
    (root / "proc").mkdir()  # what lstopo needs to take the directory as a filesystem root
    view = _read_view(_run_lstopo(lstopo, root))
    topo = discover(SNAPSHOTS_DIR / name / "sys")
    _assert_discovery_matches(topo, view)
    _assert_discovery_pci_matches(topo, view)


def test_infiniband_hcas_are_shown_as_nics_are(views, capsys) -> None:
    """Every network function hwloc sees (class 0x0200 Ethernet or 0x0207 InfiniBand; VFs aside)
    is a NIC of ``topology --pcie`` with the node hwloc hangs it from, and a line of
    ``topology``: the HCAs as ``rdma``, as the RDMA devices operators pair with GPUs."""
    from numa_pin.cli.main import main  # lazy: another area's module

    spec, root, view = views["infiniband"]
    vfs = {vf.address for dev in spec.pci for vf in dev.vfs}
    network = {a: s for a, s in view.pci.items() if s.class_id in ("0200", "0207") and a not in vfs}
    assert {a for a, s in network.items() if s.class_id == "0207"} == set(IB_PORTS)
    where = ["--sysfs-root", str(root / "sys"), "--proc-root", str(root / "proc")]
    assert main(["topology", "--pcie", *where]) == 0
    out = capsys.readouterr().out.splitlines()
    nics = {line.split()[1]: line.split(":", 1)[0] for line in out if line.startswith("NIC") and ": 0000:" in line}
    assert set(nics) == set(network)
    numa = {line.split()[0]: line.split()[-1] for line in out if line.startswith("NIC") and ": " not in line}
    for address, seen in network.items():
        assert {int(numa[nics[address]])} == seen.cpu_nodes, address
    rows = {line.split()[0]: line.split()[1:] for line in out[1:] if line.startswith("NIC") and ": " not in line}
    names = out[0].split()[:-1]
    ib = [nics[a] for a in IB_PORTS]
    assert rows[ib[0]][names.index(ib[1])] == "PIX"  # the two ports of one card
    assert main(["topology", *where]) == 0
    text = capsys.readouterr().out.splitlines()
    for address, seen in network.items():
        line = next(line for line in text if line.strip().startswith(address))
        assert line.split()[1] == ("rdma" if seen.class_id == "0207" else "nic"), line


def test_infiniband_hcas_count_in_nrt_as_nics_do(views) -> None:
    """A device resource selecting RDMA devices by vendor (the ConnectX PF of node 3 and the HCA's
    two ports) counts each in the NodeResourceTopology zone of the node hwloc hangs it from."""
    from numa_pin.admission.decide import NodeSettings  # lazy: another area's modules
    from numa_pin.cluster.nrt import build_nrt
    from numa_pin.devices.inventory import DeviceResource, inventory
    from numa_pin.devices.selector import Selector
    from numa_pin.ledger.model import LedgerState
    from numa_pin.topology.discover import discover

    spec, root, view = views["infiniband"]
    topo = discover(root / "sys", root / "proc")
    rdma = DeviceResource("example.com/rdma", (Selector(vendors=("0x15b3",), is_vf=False),))
    settings = NodeSettings(device_resources=(rdma,))
    obj = build_nrt(topo, settings, LedgerState(), inventory(topo, (rdma,)), "n1")
    counted = {z["name"]: next((int(r["capacity"]) for r in z["resources"] if r["name"] == rdma.name), 0)
               for z in obj["zones"]}
    mellanox = [a for a, s in view.pci.items() if s.vendor == "15b3" and s.class_id in ("0200", "0207")
                and a not in {vf.address for dev in spec.pci for vf in dev.vfs}]
    want: dict[str, int] = {}
    for address in mellanox:
        (node,) = view.pci[address].cpu_nodes
        want[f"node-{node}"] = want.get(f"node-{node}", 0) + 1
    assert {z: n for z, n in counted.items() if n} == want == {"node-2": 2, "node-3": 1}



def test_hwloc_reads_no_device_tree(lstopo: str, tmp_path: Path) -> None:
    """The chips of ``power7-lpar`` are named only by ``/proc/device-tree/cpus/*/ibm,chip-id``:
    hwloc's topology is the same with ``HWLOC_USE_DT=1`` (hwloc 2.1's switch for its old
    device-tree code) and without the tree, and its packages are the cores; so no oracle of
    numa-pin's counts on those chips."""
    spec = shape("power7-lpar")
    root = build_once(spec, tmp_path).root
    chip_ids = [int.from_bytes(p.read_bytes(), "big") for p in (root / "proc").glob("device-tree/cpus/*/ibm,chip-id")]
    assert len(chip_ids) == spec.core_count and set(chip_ids) == set(range(spec.sockets))
    with_tree = _run_lstopo(lstopo, root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLOC_")} | {"HWLOC_USE_DT": "1"}
    done = subprocess.run([lstopo, "--input", str(root), "--whole-io", "--of", "xml", "-"], capture_output=True,
                          text=True, timeout=120, env=env, check=True)
    shutil.rmtree(root / "proc" / "device-tree")
    without = _run_lstopo(lstopo, root)
    assert ET.tostring(ET.fromstring(done.stdout)) == ET.tostring(with_tree) == ET.tostring(without)
    assert _read_view(with_tree).package_sets == _spec_cores(spec)
