"""Device resources over discovered PCI devices: selectors, ownership, health, closeness keys."""

from __future__ import annotations

import pytest

from numa_pin.devices.inventory import DeviceResource, Selector, check_resource_name, inventory, parent_keys
from numa_pin.devices.model import DeviceInfo
from numa_pin.errors import ConfigError
from numa_pin.testing.machine import expected_topology
from numa_pin.testing.shapes import shape
from numa_pin.topology.model import PciDevice, Topology

GPU8 = expected_topology(shape("gpu8-sriov"))
GPUS = ("0000:18:00.0", "0000:19:00.0", "0000:3d:00.0", "0000:3e:00.0",
        "0000:8d:00.0", "0000:8e:00.0", "0000:b8:00.0", "0000:b9:00.0")
E810_VFS = ("0000:32:01.0", "0000:32:01.1", "0000:32:01.2", "0000:32:01.3")
CX6_VFS = ("0000:c9:00.2", "0000:c9:00.3", "0000:c9:00.4", "0000:c9:00.5")


def ids(resource: str, *selectors: Selector, topo: Topology = GPU8) -> tuple[str, ...]:
    return tuple(d.id for d in inventory(topo, [DeviceResource(resource, selectors)])[resource])


SELECTOR_CASES = [
    ("vendor", (Selector(vendors=("0x10de",)),), GPUS),
    ("vendor-without-0x-upper-case", (Selector(vendors=("10DE",)),), GPUS),
    ("vendor-as-plain-string", (Selector(vendors="0x10de"),), GPUS),
    ("class-prefix", (Selector(classes=("0x0302",)),), GPUS),
    ("vendor-and-device", (Selector(vendors=("0x8086",), devices=("0x1889",)),), E810_VFS),
    ("and-across-fields", (Selector(vendors=("0x10de",), drivers=("vfio-pci",)),), ()),
    ("or-within-a-field", (Selector(drivers=("iavf", "nvme")),), E810_VFS + ("0000:5d:00.0",)),
    ("or-across-selectors", (Selector(drivers=("iavf",)), Selector(drivers=("nvme",))),
     E810_VFS + ("0000:5d:00.0",)),
    ("vfs-by-pf-name", (Selector(is_vf=True, pf_names=("ens5f0",)),), CX6_VFS),
    ("vf-index-ranges", (Selector(is_vf=True, pf_names=("ens2f0#1-2,0",)),), E810_VFS[:3]),
    ("pf-by-own-netdev", (Selector(pf_names=("ens5f0",), is_vf=False),), ("0000:c9:00.0",)),
    ("range-never-matches-a-pf", (Selector(pf_names=("ens5f0#0-3",), is_vf=False),), ()),
    ("netdev-required", (Selector(classes=("0x02",), has_netdev=True, is_vf=False),),
     ("0000:32:00.0", "0000:9c:00.0", "0000:c9:00.0")),
    ("short-address", (Selector(addresses=("5D:00.0",)),), ("0000:5d:00.0",)),
]


@pytest.mark.parametrize(("case", "selectors", "expected"), SELECTOR_CASES, ids=[c[0] for c in SELECTOR_CASES])
def test_selectors(case, selectors, expected) -> None:
    assert ids("example.com/dev", *selectors) == expected


def test_devices_carry_their_numa_node() -> None:
    infos = inventory(GPU8, [DeviceResource("nvidia.com/gpu", (Selector(vendors=("0x10de",)),)),
                             DeviceResource("example.com/nvme", (Selector(drivers=("nvme",)),))])
    assert [d.numa_nodes for d in infos["nvidia.com/gpu"]] == [(0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,)]
    # numa_node -1 in sysfs, resolved by discovery from local_cpulist (node 1's CPUs)
    assert infos["example.com/nvme"] == (DeviceInfo("0000:5d:00.0", (1,), True),)


@pytest.mark.parametrize("vf_first", [True, False], ids=["vf-resource-first", "vf-resource-last"])
def test_a_pf_whose_vfs_are_handed_out_is_never_handed_out_whole(vf_first: bool) -> None:
    vfs = DeviceResource("intel.com/sriov_netdevice", (Selector(is_vf=True, pf_names=("ens2f0",)),))
    nics = DeviceResource("example.com/nic", (Selector(classes=("0x02",), is_vf=False),))
    result = inventory(GPU8, [vfs, nics] if vf_first else [nics, vfs])
    assert tuple(d.id for d in result["intel.com/sriov_netdevice"]) == E810_VFS
    assert tuple(d.id for d in result["example.com/nic"]) == ("0000:9c:00.0", "0000:c9:00.0")


def test_first_resource_wins_a_device() -> None:
    result = inventory(GPU8, [DeviceResource("a.com/x", (Selector(vendors=("0x10de",)),)),
                              DeviceResource("b.com/y", (Selector(classes=("0x03",)),))])
    assert len(result["a.com/x"]) == 8 and result["b.com/y"] == ()


def _tiny(driver: str | None, node: int | None) -> Topology:
    return Topology(nodes={}, cpus={}, pci_devices=(
        PciDevice("0000:01:00.0", "0x1af4", "0x1000", "0x020000", node, driver=driver),))


@pytest.mark.parametrize(
    ("driver", "node", "require_driver", "expected"),
    [("virtio-pci", 0, True, DeviceInfo("0000:01:00.0", (0,), True)),
     (None, 0, True, DeviceInfo("0000:01:00.0", (0,), False)),
     (None, 1, False, DeviceInfo("0000:01:00.0", (1,), True)),
     ("vfio-pci", None, True, DeviceInfo("0000:01:00.0", (), True))],
    ids=["driver-bound", "no-driver-unhealthy", "driver-not-required", "no-numa-node"],
)
def test_health_and_topology(driver, node, require_driver, expected) -> None:
    resource = DeviceResource("example.com/virtio", (Selector(vendors=("0x1af4",)),), require_driver)
    assert inventory(_tiny(driver, node), [resource])["example.com/virtio"] == (expected,)


@pytest.mark.parametrize(
    "name",
    ["nvidia.com/gpu", "intel.com/sriov_netdevice", "example.com/a.b-c_D9", "a/b"],
    ids=["gpu", "sriov", "all-name-chars", "shortest"],
)
def test_good_resource_names(name: str) -> None:
    assert check_resource_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["gpu", "nvidia.com/", "/gpu", "a/b/c", "Nvidia.com/gpu", "kubernetes.io/gpu", "x.kubernetes.io/gpu",
     "nvidia.com/-gpu", "nvidia.com/" + "g" * 64, "nvidia..com/gpu", 7],
    ids=["no-domain", "no-name", "no-domain-part", "two-slashes", "upper-case-domain", "reserved-domain",
         "reserved-subdomain", "leading-dash", "too-long", "empty-label", "not-a-string"],
)
def test_bad_resource_names(name) -> None:
    with pytest.raises(ConfigError, match="devices"):
        DeviceResource(name, (Selector(vendors=("0x10de",)),))


@pytest.mark.parametrize(
    ("fields", "match"),
    [({}, "empty selector"), ({"vendors": ("zz",)}, "hexadecimal"), ({"addresses": ("bogus",)}, "PCI address"),
     ({"is_vf": "yes"}, "true, false"), ({"pf_names": ("ens1#x",)}, "ranges"), ({"drivers": ("",)}, "non-empty"),
     ({"classes": 2}, "list of strings")],
    ids=["empty", "bad-hex", "bad-address", "bad-bool", "bad-range", "empty-string", "not-a-list"],
)
def test_bad_selectors(fields, match) -> None:
    with pytest.raises(ConfigError, match=match):
        Selector(**fields)


def test_is_vf_false_alone_is_a_real_selector() -> None:
    assert Selector(is_vf=False).is_vf is False


def test_resource_needs_selectors_and_unique_names() -> None:
    with pytest.raises(ConfigError, match="at least one selector"):
        DeviceResource("a.com/x", ())
    resource = DeviceResource("a.com/x", [Selector(vendors=("0x10de",))])
    assert isinstance(resource.selectors, tuple)
    with pytest.raises(ConfigError, match="defined twice"):
        inventory(GPU8, [resource, resource])


def test_parent_keys_group_devices_by_pcie_tree() -> None:
    keys = parent_keys(GPU8)
    # each node's GPU pair sits behind one switch under one root port
    assert {keys[a] for a in GPUS[:2]} == {"0000:15:01.0"}
    assert {keys[a] for a in GPUS[2:4]} == {"0000:3a:01.0"}
    assert len({keys[a] for a in GPUS}) == 4
    # VFs go with their PF's tree
    assert {keys[a] for a in E810_VFS} == {keys["0000:32:00.0"]} == {"0000:31:01.0"}
    # root ports and the parentless NVMe drive have no key
    assert "0000:15:01.0" not in keys and "0000:5d:00.0" not in keys


def test_parent_keys_edge_cases() -> None:
    topo = Topology(nodes={}, cpus={}, pci_devices=(
        PciDevice("0000:01:00.0", "0x8086", "0x1", "0x020000", 0, physfn=None, sriov_totalvfs=2,
                  vfs=("0000:01:00.1",)),
        PciDevice("0000:01:00.1", "0x8086", "0x2", "0x020000", 0, physfn="0000:01:00.0"),
        PciDevice("0000:02:00.0", "0x8086", "0x3", "0x060400", 0, parent="0000:03:00.0"),
        PciDevice("0000:03:00.0", "0x8086", "0x3", "0x060400", 0, parent="0000:02:00.0"),
        PciDevice("0000:04:00.0", "0x8086", "0x4", "0x020000", 0, parent="0000:ff:00.0"),
    ))
    keys = parent_keys(topo)
    assert keys["0000:01:00.1"] == "0000:01:00.0"  # PF without a parent: the PF itself
    assert "0000:01:00.0" not in keys
    assert keys["0000:02:00.0"] in {"0000:02:00.0", "0000:03:00.0"}  # a parent loop ends
    assert keys["0000:04:00.0"] == "0000:ff:00.0"  # a parent discovery did not list
