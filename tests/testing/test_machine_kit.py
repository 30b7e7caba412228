"""The machine kit's own tests: the tree :func:`build` writes is internally consistent and
laid out like the kernel's (links, lists, masks, PCI config space, proc files)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list, parse_mask
from numa_pin.base.record import replace
from numa_pin.errors import TopologyError
from numa_pin.testing.machine import (
    CpulessNodeSpec,
    MachineSpec,
    PciSpec,
    VfSpec,
    build,
    build_once,
    expected_topology,
    kernel_mask,
)
from numa_pin.testing.pci_spec import CLASS_ETHERNET, CLASS_PCI_BRIDGE
from numa_pin.testing.shapes import QUIRK_SHAPES, SHAPES, gpu_uuid, shape
from numa_pin.testing.spec_parts import NUL_NODE_LISTS, NUL_SYSTEM, KernelQuirks

NAMES = list(SHAPES)
#: shapes whose files follow the kernel's tidy format (no :class:`KernelQuirks`); the
#: quirky ones are checked by ``test_quirks_are_in_the_tree``
TIDY = [n for n in NAMES if shape(n).quirks == KernelQuirks()]
NODE = "devices/system/node"
CPU = "devices/system/cpu"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    cache = tmp_path_factory.getbasetemp() / "machines"
    return {name: build_once(shape(name), cache) for name in NAMES}


def _read(path: Path) -> str:
    return path.read_text().strip()


def _pci_functions(spec: MachineSpec) -> list[str]:
    return [a for p in spec.pci for a in (p.address, *(v.address for v in p.vfs))]


# ---- formats ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ids,nbits,text",
    [
        (range(8), 8, "ff"),
        ({0}, 40, "00,00000001"),
        (range(64), 64, "ffffffff,ffffffff"),
        ((), 4, "0"),
        ({1}, 2, "2"),
        ({32}, 33, "1,00000000"),
        ({0, 4}, 8, "11"),
    ],
    ids=["8-bits", "40-bits", "64-bits", "empty", "2-bits", "33-bits", "sparse"],
)
def test_kernel_mask_format(ids, nbits: int, text: str) -> None:
    assert kernel_mask(ids, nbits) == text
    assert parse_mask(text) == frozenset(ids)


# ---- links -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_every_symlink_is_relative_and_resolves_inside_the_tree(built, name: str) -> None:
    machine = built[name]
    root = machine.root.resolve()
    links = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in dirnames + filenames:
            path = Path(dirpath) / entry
            if not path.is_symlink():
                continue
            links += 1
            target = os.readlink(path)
            assert not os.path.isabs(target), f"{path} -> {target} is absolute"
            resolved = path.resolve()
            assert resolved.exists(), f"{path} -> {target} dangles"
            assert resolved.is_relative_to(root / "sys"), f"{path} leaves sysfs"
    assert links > 0


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_cpu_and_node_links_point_at_each_other(built, name: str) -> None:
    machine = built[name]
    sys_ = machine.sysfs_root
    for node in machine.spec.node_ids:
        node_dir = sys_ / NODE / f"node{node}"
        linked = {int(p.name[3:]) for p in node_dir.iterdir() if re.fullmatch(r"cpu\d+", p.name)}
        assert linked >= machine.spec.cpus_of_node(node)
        for cpu in linked:
            assert (node_dir / f"cpu{cpu}").resolve() == (sys_ / CPU / f"cpu{cpu}").resolve()
            assert (sys_ / CPU / f"cpu{cpu}" / f"node{node}").resolve() == node_dir.resolve()


# ---- cpus and nodes --------------------------------------------------------------------
@pytest.mark.parametrize("name", TIDY, ids=TIDY)
def test_node_cpulists_partition_the_online_cpus(built, name: str) -> None:
    machine = built[name]
    sys_ = machine.sysfs_root
    online = parse_list(_read(sys_ / CPU / "online"))
    seen: set[int] = set()
    for node in parse_list(_read(sys_ / NODE / "online")):
        d = sys_ / NODE / f"node{node}"
        cpus = parse_list(_read(d / "cpulist"))
        assert parse_mask(_read(d / "cpumap")) == cpus
        assert not cpus & seen, f"node {node} shares CPUs"
        seen |= cpus
    assert seen == online == machine.spec.online_cpus
    has_cpu = parse_list(_read(sys_ / NODE / "has_cpu"))
    assert has_cpu == {n for n in machine.spec.node_ids if machine.spec.cpus_of_node(n)}


@pytest.mark.parametrize("name", TIDY, ids=TIDY)
def test_topology_files_agree_with_each_other(built, name: str) -> None:
    sys_ = built[name].sysfs_root
    online = parse_list(_read(sys_ / CPU / "online"))
    package: dict[int, set[int]] = {}
    core: dict[tuple[int, int], set[int]] = {}
    for cpu in online:
        t = sys_ / CPU / f"cpu{cpu}" / "topology"
        pkg = int(_read(t / "physical_package_id"))
        package.setdefault(pkg, set()).add(cpu)
        core.setdefault((pkg, int(_read(t / "core_id"))), set()).add(cpu)
        for name_ in ("thread_siblings", "core_cpus", "core_siblings", "package_cpus", "die_cpus"):
            assert parse_mask(_read(t / name_)) == parse_list(_read(t / f"{name_}_list")), name_
    for cpu in online:
        t = sys_ / CPU / f"cpu{cpu}" / "topology"
        pkg = int(_read(t / "physical_package_id"))
        assert parse_list(_read(t / "package_cpus_list")) == package[pkg]
        assert parse_list(_read(t / "core_siblings_list")) == package[pkg]
        assert (
            parse_list(_read(t / "thread_siblings_list")) == core[(pkg, int(_read(t / "core_id")))]
        )
        assert cpu in parse_list(_read(t / "die_cpus_list"))


@pytest.mark.parametrize("name", TIDY, ids=TIDY)
def test_caches_are_shared_by_the_cpus_they_list(built, name: str) -> None:
    sys_ = built[name].sysfs_root
    online = parse_list(_read(sys_ / CPU / "online"))
    by_id: dict[tuple[int, int], frozenset[int]] = {}
    for cpu in online:
        cache = sys_ / CPU / f"cpu{cpu}" / "cache"
        levels = []
        for index in sorted(cache.iterdir()):
            level = int(_read(index / "level"))
            levels.append((level, _read(index / "type")))
            shared = parse_list(_read(index / "shared_cpu_list"))
            assert parse_mask(_read(index / "shared_cpu_map")) == shared
            assert cpu in shared
            key = (level, int(_read(index / "id")))
            assert by_id.setdefault(key, shared) == shared, f"cpu{cpu} {index.name}"
        assert levels == [(1, "Data"), (1, "Instruction"), (2, "Unified"), (3, "Unified")]


@pytest.mark.parametrize("name", TIDY, ids=TIDY)
def test_distance_rows(built, name: str) -> None:
    machine = built[name]
    sys_ = machine.sysfs_root
    nodes = sorted(parse_list(_read(sys_ / NODE / "online")))
    for i, node in enumerate(nodes):
        row = [int(x) for x in _read(sys_ / NODE / f"node{node}" / "distance").split()]
        assert len(row) == len(nodes)
        assert row[i] == 10
        assert tuple(row) == machine.spec.distance_matrix()[i]


@pytest.mark.parametrize("name", TIDY, ids=TIDY)
def test_meminfo_and_hugepages(built, name: str) -> None:
    machine = built[name]
    spec = machine.spec
    sys_ = machine.sysfs_root
    total = 0
    for node in spec.node_ids:
        d = sys_ / NODE / f"node{node}"
        info = dict(
            re.findall(rf"^Node {node} (\S+):\s+(\d+)", d.joinpath("meminfo").read_text(), re.M)
        )
        assert int(info["MemTotal"]) == spec.node_memory_kb(node)
        assert int(info["MemFree"]) <= int(info["MemTotal"])
        total += int(info["MemTotal"])
        sizes = sorted(int(p.name[10:-2]) for p in (d / "hugepages").iterdir())
        assert sizes == list(spec.hugepage_sizes())
        for size in sizes:
            pool = d / "hugepages" / f"hugepages-{size}kB"
            want = spec.node_hugepages(node).get(size, (0, 0))
            assert (int(_read(pool / "nr_hugepages")), int(_read(pool / "free_hugepages"))) == want
    meminfo = dict(
        re.findall(r"^(\S+):\s+(\d+)", (machine.proc_root / "meminfo").read_text(), re.M)
    )
    assert int(meminfo["MemTotal"]) == total


@pytest.mark.parametrize("name", TIDY, ids=TIDY)
def test_proc_cpuinfo_matches_sysfs(built, name: str) -> None:
    machine = built[name]
    sys_ = machine.sysfs_root
    blocks = [b for b in (machine.proc_root / "cpuinfo").read_text().split("\n\n") if b.strip()]
    seen = set()
    for block in blocks:
        fields = {
            k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in block.splitlines())
        }
        cpu = int(fields["processor"])
        seen.add(cpu)
        t = sys_ / CPU / f"cpu{cpu}" / "topology"
        assert fields["physical id"] == _read(t / "physical_package_id")
        assert fields["core id"] == _read(t / "core_id")
        assert int(fields["siblings"]) == len(parse_list(_read(t / "package_cpus_list")))
    assert seen == parse_list(_read(sys_ / CPU / "online"))


# ---- PCI -------------------------------------------------------------------------------
PCI_NAMES = [n for n in NAMES if shape(n).pci]


@pytest.mark.parametrize("name", PCI_NAMES, ids=PCI_NAMES)
def test_pci_bus_links_drivers_and_iommu_groups(built, name: str) -> None:
    machine = built[name]
    sys_ = machine.sysfs_root.resolve()
    listed = sorted(p.name for p in (sys_ / "bus/pci/devices").iterdir())
    assert listed == sorted(_pci_functions(machine.spec))
    for address in listed:
        dev = (sys_ / "bus/pci/devices" / address).resolve()
        assert dev.name == address
        assert re.fullmatch(
            r"pci[0-9a-f]{4}:[0-9a-f]{2}", dev.relative_to(sys_ / "devices").parts[0]
        )
        if (dev / "driver").exists():
            drv = (dev / "driver").resolve()
            assert drv.parent == sys_ / "bus/pci/drivers"
            assert (drv / address).resolve() == dev
        group = (dev / "iommu_group").resolve()
        assert group.parent == sys_ / "kernel/iommu_groups"
        assert (group / "devices" / address).resolve() == dev
        for netdev in (dev / "net").iterdir() if (dev / "net").exists() else ():
            assert (sys_ / "class/net" / netdev.name).resolve() == netdev
            assert (netdev / "device").resolve() == dev


@pytest.mark.parametrize("name", PCI_NAMES, ids=PCI_NAMES)
def test_pci_parent_directories_follow_bridges(built, name: str) -> None:
    machine = built[name]
    for dev in machine.spec.pci:
        path = machine.pci_dir(dev.address)
        if dev.parent is None:
            assert path.parent.name == f"pci{dev.address[:4]}:{dev.address[5:7]}"
        else:
            assert path.parent == machine.pci_dir(dev.parent)
        for vf in dev.vfs:
            assert machine.pci_dir(vf.address).parent == path.parent


SRIOV_PFS = [("gpu8-sriov", "0000:32:00.0", "iavf"), ("gpu8-sriov", "0000:c9:00.0", "mlx5_core")]


@pytest.mark.parametrize("name,pf,vf_driver", SRIOV_PFS, ids=["e810", "connectx6"])
def test_sriov_vf_and_pf_links(built, name: str, pf: str, vf_driver: str) -> None:
    machine = built[name]
    pf_dir = machine.pci_dir(pf)
    assert _read(pf_dir / "sriov_totalvfs") == "8"
    assert _read(pf_dir / "sriov_numvfs") == "4"
    virtfns = sorted(p.name for p in pf_dir.iterdir() if p.name.startswith("virtfn"))
    assert virtfns == [f"virtfn{i}" for i in range(4)]
    for link in virtfns:
        vf_dir = (pf_dir / link).resolve()
        assert (vf_dir / "physfn").resolve() == pf_dir
        assert os.readlink(pf_dir / link) == f"../{vf_dir.name}"
        assert os.readlink(vf_dir / "physfn") == f"../{pf}"
        assert (vf_dir / "driver").resolve().name == vf_driver
        assert _read(vf_dir / "numa_node") == _read(pf_dir / "numa_node")
        assert _read(vf_dir / "local_cpulist") == _read(pf_dir / "local_cpulist")
        assert len(list((vf_dir / "net").iterdir())) == 1
        pf_netdev = next((vf_dir / "physfn" / "net").iterdir()).name
        assert pf_netdev in {"ens2f0", "ens5f0"}


UNKNOWN_NODE = [
    ("gpu8-sriov", "0000:5d:00.0", "-1", "node1"),
    ("gpu8-sriov", "0000:9c:00.0", "-1", "all"),
    ("laptop", "0000:00:02.0", "-1", "all"),
    ("gpu8-sriov", "0000:9b:01.0", "2", "node2"),
]


@pytest.mark.parametrize(
    "name,address,text,local",
    UNKNOWN_NODE,
    ids=["nvme-local-cpulist", "nic-behind-bridge", "laptop-igpu", "bridge"],
)
def test_numa_node_files(built, name: str, address: str, text: str, local: str) -> None:
    machine = built[name]
    dev = machine.pci_dir(address)
    assert (dev / "numa_node").read_text() == f"{text}\n"
    want = machine.spec.online_cpus if local == "all" else machine.spec.cpus_of_node(int(local[4:]))
    assert parse_list(_read(dev / "local_cpulist")) == want
    assert parse_mask(_read(dev / "local_cpus")) == want


def test_config_space_carries_ids_class_and_bus_range(built) -> None:
    machine = built["gpu8-sriov"]
    gpu = (machine.pci_dir("0000:18:00.0") / "config").read_bytes()
    assert len(gpu) == 256
    assert gpu[0:4] == bytes([0xDE, 0x10, 0xB2, 0x20])
    assert (gpu[11], gpu[10], gpu[9], gpu[0x0E]) == (0x03, 0x02, 0x00, 0x00)
    root_port = (machine.pci_dir("0000:15:01.0") / "config").read_bytes()
    assert (root_port[11], root_port[10], root_port[0x0E]) == (0x06, 0x04, 0x01)
    assert (root_port[0x18], root_port[0x19], root_port[0x1A]) == (0x15, 0x16, 0x19)


def test_nvidia_information_files(built) -> None:
    machine = built["gpu8-sriov"]
    gpus = [p for p in machine.spec.pci if p.gpu_uuid]
    assert len(gpus) == 8
    for dev in gpus:
        text = (machine.proc_root / "driver/nvidia/gpus" / dev.address / "information").read_text()
        info = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())}
        assert info["GPU UUID"] == gpu_uuid(dev.gpu_minor)
        assert info["Device Minor"] == str(dev.gpu_minor)
        assert info["Bus Location"] == dev.address
    assert sorted(p.gpu_minor for p in gpus) == list(range(8))


# ---- options the named shapes do not use ------------------------------------------------
def test_offline_cpus(tmp_path: Path) -> None:
    spec = replace(shape("intel-2s-ht"), offline_cpus=frozenset({3, 19}))
    sys_ = build(spec, tmp_path).sysfs_root
    assert parse_list(_read(sys_ / CPU / "online")) == set(range(32)) - {3, 19}
    assert _read(sys_ / CPU / "offline") == "3,19"
    assert _read(sys_ / CPU / "cpu3/online") == "0"
    assert _read(sys_ / CPU / "cpu4/online") == "1"
    assert not (sys_ / CPU / "cpu0/online").exists()
    assert 3 not in parse_list(_read(sys_ / NODE / "node0/cpulist"))
    assert not (sys_ / CPU / "cpu3/topology").exists()


def test_cpuless_node_with_initiators(tmp_path: Path) -> None:
    spec = replace(
        shape("cpuless-memory-node"),
        cpuless_nodes=(CpulessNodeSpec(memory_kb=1 << 20, socket=0, initiators=True),),
    )
    sys_ = build(spec, tmp_path).sysfs_root
    assert _read(sys_ / NODE / "node2/cpulist") == ""
    assert parse_mask(_read(sys_ / NODE / "node2/cpumap")) == set()
    assert _read(sys_ / NODE / "has_memory") == "0-2"
    assert _read(sys_ / NODE / "has_cpu") == "0-1"
    initiators = sorted(p.name for p in (sys_ / NODE / "node2/access0/initiators").iterdir())
    assert initiators == ["node0", "node1"]


def test_build_refuses_an_existing_tree(tmp_path: Path) -> None:
    build(shape("laptop"), tmp_path)
    with pytest.raises(FileExistsError):
        build(shape("laptop"), tmp_path)


def _bridge(addr: str, **kw) -> PciSpec:
    return PciSpec(addr, "0x8086", "0x347a", CLASS_PCI_BRIDGE, 0, **kw)


def _nic(addr: str, **kw) -> PciSpec:
    return PciSpec(addr, "0x8086", "0x1592", CLASS_ETHERNET, **{"numa_node": 0, **kw})


BAD_SPECS = [
    lambda: MachineSpec(sockets=2, distances=((10, 21),)),
    lambda: MachineSpec(sockets=2, distances=((12, 21), (21, 10))),
    lambda: MachineSpec(sockets=2, distances=((10, 10), (21, 10))),
    lambda: MachineSpec(memory_kb=1024, hugepages={2048: (1, 1)}),
    lambda: MachineSpec(hugepages={2048: (1, 2)}),
    lambda: MachineSpec(sockets=2, memory_kb=(1, 2, 3)),
    lambda: MachineSpec(offline_cpus=frozenset({0})),
    lambda: MachineSpec(offline_cpus=frozenset({99})),
    lambda: MachineSpec(l3_scope="die"),
    lambda: MachineSpec(pci=(_nic("0000:02:00.0", parent="0000:01:00.0"),)),
    lambda: MachineSpec(pci=(_nic("0000:01:00.0"), _nic("0000:02:00.0", parent="0000:01:00.0"))),
    lambda: MachineSpec(pci=(_bridge("0000:05:00.0"), _nic("0000:04:00.0", parent="0000:05:00.0"))),
    lambda: MachineSpec(pci=(_nic("0000:01:00.0"), _nic("0000:01:00.0"))),
    lambda: MachineSpec(pci=(_nic("0000:01:00.0", numa_node=3),)),
    lambda: MachineSpec(pci=(_nic("0000:01:00.0", local_cpulist="0-63"),)),
    lambda: MachineSpec(
        pci=(_nic("0000:01:00.0", netdevs=("eth0",)), _nic("0000:02:00.0", netdevs=("eth0",)))
    ),
    lambda: _nic("0000:01:00.0", vfs=(VfSpec("0000:01:00.1"),)),
    lambda: _nic(
        "0000:01:00.0", sriov_totalvfs=1, vfs=(VfSpec("0000:01:00.1"), VfSpec("0000:01:00.2"))
    ),
    lambda: _nic("0000:3B:00.0"),
    lambda: PciSpec("0000:01:00.0", "10de", "0x20b2", "0x030200"),
    lambda: PciSpec("0000:01:00.0", "0x10de", "0x20b2", "0x0302"),
    lambda: _nic("0000:01:00.0", numa_node=-2),
    lambda: MachineSpec(cpuless_nodes=(CpulessNodeSpec(socket=1),)),
]
BAD_IDS = [
    "matrix-size",
    "diagonal",
    "off-diagonal-10",
    "hugepages-over-memory",
    "free-over-total",
    "memory-list-length",
    "cpu0-offline",
    "offline-unknown-cpu",
    "l3-scope",
    "parent-missing",
    "parent-not-bridge",
    "child-bus-above-parent",
    "duplicate-address",
    "numa-node-missing",
    "local-cpulist-unknown-cpus",
    "duplicate-netdev",
    "vfs-without-sriov",
    "too-many-vfs",
    "upper-case-address",
    "vendor-format",
    "class-format",
    "numa-node-below-minus-1",
    "cpuless-socket-missing",
]


@pytest.mark.parametrize("make", BAD_SPECS, ids=BAD_IDS)
def test_inconsistent_specs_are_refused(make) -> None:
    with pytest.raises(TopologyError):
        make()


def test_unknown_shape_names_the_known_ones() -> None:
    with pytest.raises(TopologyError, match="laptop"):
        shape("no-such-machine")


# ---- the spec's own model against numa-pin's discovery ---------------------------------
@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_expected_topology_equals_discovery(built, name: str) -> None:
    from numa_pin.topology.discover import discover  # lazy: another area's module

    machine = built[name]
    got = discover(machine.sysfs_root, machine.proc_root)
    want = expected_topology(machine.spec, source=str(machine.sysfs_root))
    assert dict(got.nodes) == dict(want.nodes)
    assert dict(got.cpus) == dict(want.cpus)
    assert got.pci_devices == want.pci_devices


GROUP_CASES = [
    (True, (None, 0, None), {"0000:01:00.0": 1, "0000:02:00.0": 0, "0000:03:00.0": 2}),
    (True, (5, None, None), {"0000:01:00.0": 5, "0000:02:00.0": 0, "0000:03:00.0": 1}),
    (False, (None, 7, None), {"0000:02:00.0": 7}),
]


@pytest.mark.parametrize(
    "iommu,wanted,groups", GROUP_CASES, ids=["skip-declared", "declared-high", "iommu-off"]
)
def test_iommu_groups(tmp_path: Path, iommu: bool, wanted, groups: dict[str, int]) -> None:
    pci = tuple(_nic(f"0000:0{i + 1}:00.0", iommu_group=g) for i, g in enumerate(wanted))
    machine = build(MachineSpec(pci=pci, iommu=iommu), tmp_path)
    seen = {}
    for address in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        link = machine.pci_dir(address) / "iommu_group"
        if link.exists():
            seen[address] = int(link.resolve().name)
    assert seen == groups
    topo = expected_topology(machine.spec)
    assert {
        d.address: d.iommu_group for d in topo.pci_devices if d.iommu_group is not None
    } == groups


def test_build_once_reuses_a_tree_per_spec(tmp_path: Path) -> None:
    first = build_once(shape("laptop"), tmp_path)
    marker = first.sysfs_root / "marker"
    marker.write_text("kept")
    again = build_once(shape("laptop"), tmp_path)
    assert again.root == first.root and marker.exists()
    other = build_once(replace(shape("laptop"), threads_per_core=1), tmp_path)
    assert other.root != first.root
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ---- quirks (issue 12): each one is really in the tree ----------------------------------
def _raw(path: Path) -> bytes:
    return path.read_bytes()


def test_every_quirk_shape_is_a_named_shape() -> None:
    assert set(QUIRK_SHAPES) <= set(SHAPES)


def test_nul_bytes_after_the_newline_where_the_quirk_says(built) -> None:
    sys_ = built["arm-nul-bytes"].sysfs_root
    system = [p for p in (sys_ / "devices/system").rglob("*") if p.is_file() and not p.is_symlink()]
    assert system and all(_raw(p).endswith(b"\n\0") for p in system)
    assert _raw(sys_ / CPU / "cpu3/topology/core_id") == b"3\n\0"
    assert not _raw(built["arm-nul-bytes"].pci_dir("0000:01:00.0") / "vendor").endswith(b"\0")
    lists = built["x86-nul-node-lists"].sysfs_root / NODE
    for name in ("online", "possible", "has_cpu", "has_normal_memory"):
        assert _raw(lists / name).endswith(b"\n\0"), name
    assert _raw(lists / "has_memory") == b"0-1\n"
    assert _raw(lists / "node0/cpulist").endswith(b"\n")
    assert shape("arm-nul-bytes").quirks.nul_after_newline == NUL_SYSTEM
    assert shape("x86-nul-node-lists").quirks.nul_after_newline == NUL_NODE_LISTS


def test_node_meminfo_with_only_memtotal(built) -> None:
    machine = built["meminfo-total-only"]
    for node in machine.spec.node_ids:
        text = (machine.sysfs_root / NODE / f"node{node}/meminfo").read_text()
        assert text.splitlines() == [f"Node {node} MemTotal:       {32 * 1024 * 1024:8d} kB"]


def test_no_distance_files(built) -> None:
    sys_ = built["no-node-distance"].sysfs_root
    assert (sys_ / NODE / "node1/cpulist").exists()
    assert not list((sys_ / NODE).glob("node*/distance"))


def test_package_id_minus_one_with_package_lists(built) -> None:
    machine = built["power-no-package-id"]
    for cpu in machine.spec.online_cpus:
        t = machine.sysfs_root / CPU / f"cpu{cpu}/topology"
        assert _read(t / "physical_package_id") == "-1"
        socket = 0 if cpu < 16 else 1
        package = set(range(16 * socket, 16 * socket + 16))
        assert parse_list(_read(t / "package_cpus_list")) == package


def test_has_cpu_empty(built) -> None:
    node = built["has-cpu-empty"].sysfs_root / NODE
    assert _raw(node / "has_cpu") == b"\n"
    assert _read(node / "node0/cpulist")


def test_cache_map_only_and_an_all_zero_l3_map(built) -> None:
    for name in ("cache-map-only", "l3-map-zero"):
        cache = built[name].sysfs_root / CPU / "cpu9/cache"
        for index in ("index0", "index1", "index2", "index3"):
            assert not (cache / index / "shared_cpu_list").exists(), (name, index)
            assert not (cache / index / "id").exists(), (name, index)
        assert parse_mask(_read(cache / "index2/shared_cpu_map")) == {9, 25}
    assert parse_mask(_read(built["cache-map-only"].sysfs_root / CPU / "cpu9/cache/index3/shared_cpu_map")) == (
        shape("cache-map-only").cpus_of_socket(1))
    assert _read(built["l3-map-zero"].sysfs_root / CPU / "cpu9/cache/index3/shared_cpu_map") == "00000000"


def test_zero_distance_rows(built) -> None:
    node = built["zero-node-distance"].sysfs_root / NODE
    assert [_read(node / f"node{n}/distance") for n in (0, 1)] == ["0 0", "0 0"]


def test_topology_with_only_the_thread_siblings(built) -> None:
    t = built["siblings-only-topology"].sysfs_root / CPU / "cpu9/topology"
    assert sorted(p.name for p in t.iterdir()) == ["thread_siblings", "thread_siblings_list"]
    assert parse_list(_read(t / "thread_siblings_list")) == parse_mask(_read(t / "thread_siblings")) == {1, 9}


def test_hugepage_pools_without_free_hugepages(built) -> None:
    node = built["hugepages-no-free"].sysfs_root / NODE
    pools = list(node.glob("node*/hugepages/hugepages-*kB"))
    assert pools and all((p / "nr_hugepages").exists() and not (p / "free_hugepages").exists() for p in pools)


def test_overlapping_node_cpulists_keep_true_links(built) -> None:
    machine = built["node-cpulists-overlap"]
    node = machine.sysfs_root / NODE
    for n in (0, 1):
        assert parse_list(_read(node / f"node{n}/cpulist")) == parse_mask(_read(node / f"node{n}/cpumap")) == set(
            range(32))
        linked = {int(p.name[3:]) for p in (node / f"node{n}").glob("cpu[0-9]*")}
        assert linked == machine.spec.cpus_of_node(n)
        for cpu in linked:
            assert (machine.sysfs_root / CPU / f"cpu{cpu}/node{n}").is_symlink()


def test_sparse_node_ids_and_their_distance_rows(built) -> None:
    machine = built["sparse-node-ids"]
    node = machine.sysfs_root / NODE
    assert _read(node / "online") == "0,2,5"
    assert sorted(p.name for p in node.glob("node*") if p.is_dir()) == ["node0", "node2", "node5"]
    assert _read(node / "node5/distance") == "26 14 10"
    assert _read(node / "node5/cpulist") == ""
    assert _read(machine.pci_dir("0000:81:00.0") / "numa_node") == "2"


def test_memoryless_node(built) -> None:
    node = built["memoryless-node"].sysfs_root / NODE
    assert _read(node / "has_memory") == "0,2" and _read(node / "has_cpu") == "0-1"
    assert re.search(r"^Node 1 MemTotal:\s+0 kB$", (node / "node1/meminfo").read_text(), re.M)


def test_hybrid_e_cores_share_a_cluster_and_an_l2(built) -> None:
    sys_ = built["hybrid-pe"].sysfs_root
    assert _read(sys_ / "devices/cpu_atom/cpus") == "16-23"
    assert _read(sys_ / "devices/cpu_core/cpus") == "0-15"
    for cpu in range(16, 24):
        t = sys_ / CPU / f"cpu{cpu}"
        cluster = set(range(16, 20)) if cpu < 20 else set(range(20, 24))
        assert parse_list(_read(t / "topology/cluster_cpus_list")) == cluster
        assert parse_list(_read(t / "topology/thread_siblings_list")) == {cpu}
        assert parse_list(_read(t / "cache/index2/shared_cpu_list")) == cluster
    assert parse_list(_read(sys_ / CPU / "cpu0/topology/thread_siblings_list")) == {0, 1}


def test_arm_clusters_of_four_cores(built) -> None:
    sys_ = built["arm-nul-bytes"].sysfs_root
    clusters = {
        int(_raw(sys_ / CPU / f"cpu{cpu}/topology/cluster_id").rstrip(b"\n\0"))
        for cpu in range(16)
    }
    assert len(clusters) == 4
