"""Broken sysfs trees: every failure is a SysfsError/TopologyError naming the file."""

from __future__ import annotations

import os

import pytest

from numa_pin.errors import SysfsError, TopologyError
from numa_pin.topology.discover import discover
from numa_pin.topology.sysfs import SysfsReader

NODE = "devices/system/node"
CPU = "devices/system/cpu"
NIC = "0000:5e:00.0"
NIC_DIR = f"devices/pci0000:00/{NIC}"


def _with_nic(fake) -> None:
    fake.pci(NIC, numa_node=1, driver="ice", iommu_group=7, local_cpulist=[2, 3])


def _replace_with_dir(fake, rel: str) -> None:
    fake.remove(rel)
    fake.p(rel).mkdir()


def _dangle(fake, rel: str) -> None:
    path = fake.p(rel)
    path.unlink()
    os.symlink("../../nowhere/at/all", path)


# (mutation, exception class, path that the message must name)
CASES = [
    (lambda f: f.remove(f"{CPU}/online"), SysfsError, f"{CPU}/online"),
    (lambda f: f.write(f"{CPU}/online", "zero-seven"), SysfsError, f"{CPU}/online"),
    (lambda f: f.write(f"{CPU}/online", ""), SysfsError, f"{CPU}/online"),
    (lambda f: f.write(f"{CPU}/cpu3/online", "maybe"), SysfsError, f"{CPU}/cpu3/online"),
    (lambda f: f.write(f"{NODE}/online", "0-x"), SysfsError, f"{NODE}/online"),
    (lambda f: f.remove(f"{NODE}/node1/cpulist"), SysfsError, f"{NODE}/node1/cpulist"),
    (lambda f: f.write(f"{NODE}/node1/cpulist", "2-"), SysfsError, f"{NODE}/node1/cpulist"),
    (
        lambda f: f.write(f"{NODE}/node0/meminfo", "hello world"),
        SysfsError,
        f"{NODE}/node0/meminfo",
    ),
    (
        lambda f: f.write(f"{NODE}/node0/meminfo", "Node 0 MemFree: 10 kB"),
        SysfsError,
        f"{NODE}/node0/meminfo",
    ),
    (lambda f: f.remove(f"{NODE}/node1/meminfo"), SysfsError, f"{NODE}/node1/meminfo"),
    (lambda f: f.write(f"{NODE}/node1/distance", "20"), SysfsError, f"{NODE}/node1/distance"),
    (lambda f: f.write(f"{NODE}/node1/distance", "20 10 30"), SysfsError, f"{NODE}/node1/distance"),
    (lambda f: f.write(f"{NODE}/node1/distance", "20 ten"), SysfsError, f"{NODE}/node1/distance"),
    (lambda f: f.write(f"{NODE}/node1/distance", "0 10"), SysfsError, f"{NODE}/node1/distance"),
    (
        lambda f: f.write(f"{NODE}/node0/distance", b"\xff\xfe10 20\n"),
        SysfsError,
        f"{NODE}/node0/distance",
    ),
    (
        lambda f: _replace_with_dir(f, f"{NODE}/node0/distance"),
        SysfsError,
        f"{NODE}/node0/distance",
    ),
    (
        lambda f: f.write(f"{NODE}/node0/hugepages/hugepages-2048kB/free_hugepages", "lots"),
        SysfsError,
        f"{NODE}/node0/hugepages/hugepages-2048kB/free_hugepages",
    ),
    (
        lambda f: f.remove(f"{NODE}/node1/hugepages/hugepages-2048kB/nr_hugepages"),
        SysfsError,
        f"{NODE}/node1/hugepages/hugepages-2048kB/nr_hugepages",
    ),
    (
        lambda f: f.remove(f"{CPU}/cpu6/topology/thread_siblings_list"),
        SysfsError,
        f"{CPU}/cpu6/topology/thread_siblings_list",
    ),
    (
        lambda f: f.write(f"{CPU}/cpu6/topology/core_id", "-4"),
        SysfsError,
        f"{CPU}/cpu6/topology/core_id",
    ),
    (
        lambda f: f.write(f"{CPU}/cpu2/topology/physical_package_id", "abc"),
        SysfsError,
        f"{CPU}/cpu2/topology/physical_package_id",
    ),
    (
        lambda f: f.write(f"{CPU}/cpu2/topology/die_id", "0x"),
        SysfsError,
        f"{CPU}/cpu2/topology/die_id",
    ),
    (
        lambda f: f.write(f"{CPU}/cpu5/topology/thread_siblings_list", "1,,5"),
        SysfsError,
        f"{CPU}/cpu5/topology/thread_siblings_list",
    ),
    (
        lambda f: f.write(f"{CPU}/cpu1/cache/index3/level", "L3"),
        SysfsError,
        f"{CPU}/cpu1/cache/index3/level",
    ),
    (
        lambda f: f.write(f"{CPU}/cpu1/cache/index3/id", "?"),
        SysfsError,
        f"{CPU}/cpu1/cache/index3/id",
    ),
    (
        lambda f: (
            f.remove(f"{CPU}/cpu1/cache/index3/id"),
            f.remove(f"{CPU}/cpu1/cache/index3/shared_cpu_list"),
            f.write(f"{CPU}/cpu1/cache/index3/shared_cpu_map", "zz"),
        ),
        SysfsError,
        f"{CPU}/cpu1/cache/index3/shared_cpu_map",
    ),
    (lambda f: f.write(f"{NODE}/node1/cpulist", "2-3,6"), TopologyError, f"{CPU}/cpu7"),
    (
        lambda f: f.write(f"{NODE}/node1/cpulist", "2-3,6-7,0"),
        TopologyError,
        f"{NODE}/node1/cpulist",
    ),
    # PCI
    (
        lambda f: (_with_nic(f), _dangle(f, f"bus/pci/devices/{NIC}")),
        SysfsError,
        f"bus/pci/devices/{NIC}",
    ),
    (lambda f: (_with_nic(f), _dangle(f, f"{NIC_DIR}/driver")), SysfsError, f"{NIC_DIR}/driver"),
    (
        lambda f: (_with_nic(f), _dangle(f, f"{NIC_DIR}/iommu_group")),
        SysfsError,
        f"{NIC_DIR}/iommu_group",
    ),
    (
        lambda f: (_with_nic(f), f.link(f"{NIC_DIR}/iommu_group", f"{CPU}")),
        SysfsError,
        f"{NIC_DIR}/iommu_group",
    ),
    (
        lambda f: (_with_nic(f), f.write(f"{NIC_DIR}/numa_node", "one")),
        SysfsError,
        f"{NIC_DIR}/numa_node",
    ),
    (
        lambda f: (_with_nic(f), f.write(f"{NIC_DIR}/vendor", "intel")),
        SysfsError,
        f"{NIC_DIR}/vendor",
    ),
    (lambda f: (_with_nic(f), f.remove(f"{NIC_DIR}/class")), SysfsError, f"{NIC_DIR}/class"),
    (
        lambda f: (_with_nic(f), f.write(f"{NIC_DIR}/local_cpulist", "2-1")),
        SysfsError,
        f"{NIC_DIR}/local_cpulist",
    ),
    (
        lambda f: (_with_nic(f), f.write(f"{NIC_DIR}/sriov_totalvfs", "8 VFs")),
        SysfsError,
        f"{NIC_DIR}/sriov_totalvfs",
    ),
    (
        lambda f: (_with_nic(f), f.write(f"{NIC_DIR}/virtfn0", "not a link")),
        SysfsError,
        f"{NIC_DIR}/virtfn0",
    ),
    (
        lambda f: (_with_nic(f), _dangle_new(f, f"{NIC_DIR}/physfn")),
        SysfsError,
        f"{NIC_DIR}/physfn",
    ),
]
IDS = [
    "cpu-online-missing",
    "cpu-online-garbage",
    "cpu-online-empty",
    "cpuN-online-garbage",
    "node-online-garbage",
    "node-cpulist-missing",
    "node-cpulist-garbage",
    "meminfo-garbage",
    "meminfo-no-memtotal",
    "meminfo-missing",
    "distance-too-short",
    "distance-too-long",
    "distance-garbage",
    "distance-zero",
    "distance-not-utf8",
    "distance-is-a-directory",
    "hugepages-free-garbage",
    "hugepages-nr-missing",
    "thread-siblings-missing",
    "core-id-negative",
    "package-id-garbage",
    "die-id-garbage",
    "siblings-garbage",
    "cache-level-garbage",
    "l3-id-garbage",
    "l3-map-garbage",
    "cpu-in-no-node",
    "cpu-in-two-nodes",
    "pci-entry-dangling",
    "driver-dangling",
    "iommu-dangling",
    "iommu-not-a-number",
    "numa-node-garbage",
    "vendor-garbage",
    "class-missing",
    "local-cpulist-garbage",
    "totalvfs-garbage",
    "virtfn-not-a-link",
    "physfn-dangling",
]


def _dangle_new(fake, rel: str) -> None:
    os.symlink("../../gone", fake.p(rel))


@pytest.mark.parametrize("mutate,exc_type,rel", CASES, ids=IDS)
def test_broken_tree_names_the_file(two_node, mutate, exc_type, rel: str) -> None:
    discover(two_node.root)  # the unbroken tree is fine
    mutate(two_node)
    with pytest.raises(exc_type) as err:
        discover(two_node.root)
    full = str(two_node.p(rel))
    assert full in str(err.value), f"{err.value!r} does not name {full}"
    if isinstance(err.value, SysfsError):
        assert err.value.path == full


def test_missing_root(tmp_path) -> None:
    with pytest.raises(SysfsError) as err:
        discover(tmp_path / "no-such-root")
    assert err.value.path == str(tmp_path / "no-such-root" / CPU / "online")
    assert "missing" in str(err.value)


@pytest.mark.parametrize(
    "method,content,reason",
    [
        ("read_int", "12 13", "garbage"),
        ("read_int", "", "garbage"),
        ("read_list", "1-2-3", "garbage"),
        ("read_mask", "xyz", "garbage"),
        ("read_hex_str", "0xZZ", "garbage"),
        ("read_link", "plain file", "not a symlink"),
        ("listdir", "plain file", "not a directory"),
    ],
    ids=[
        "int-two-fields",
        "int-empty",
        "list-double-range",
        "mask-not-hex",
        "hex-bad-digits",
        "link-on-file",
        "listdir-on-file",
    ],
)
def test_reader_errors(tmp_path, method: str, content: str, reason: str) -> None:
    (tmp_path / "attr").write_text(content + "\n")
    reader = SysfsReader(tmp_path)
    with pytest.raises(SysfsError) as err:
        getattr(reader, method)("attr")
    assert err.value.path == str(tmp_path / "attr")
    assert reason in err.value.reason


@pytest.mark.parametrize(
    "method,content,expected",
    [
        ("read_int", "-1\n", -1),
        ("read_str", "  ice \n", "ice"),
        ("read_list", "\n", frozenset()),
        ("read_list", "0-2,8", frozenset({0, 1, 2, 8})),
        ("read_mask", "00000001,00000003", frozenset({0, 1, 32})),
        ("read_hex_str", "0x10DE", "0x10de"),
    ],
    ids=["negative-int", "stripped-str", "empty-list", "list", "two-word-mask", "hex-lowercased"],
)
def test_reader_values(tmp_path, method: str, content: str, expected) -> None:
    (tmp_path / "attr").write_text(content)
    assert getattr(SysfsReader(tmp_path), method)("attr") == expected
