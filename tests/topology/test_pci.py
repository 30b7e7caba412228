"""PCI discovery: NUMA fallbacks, SR-IOV links, drivers, IOMMU groups, NVIDIA identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.errors import SysfsError
from numa_pin.topology.discover import discover
from numa_pin.topology.pci import classify, is_pci_address, parse_nvidia_information

# two_node: node0 = {0,1,4,5}, node1 = {2,3,6,7}
ROOT_PORT = "0000:00:01.0"
SWITCH = "0000:01:00.0"
LEAF = "0000:02:00.0"


def _chain(fake, port: dict, switch: dict, leaf: dict) -> None:
    """root port -> switch port -> leaf device, each with its own attributes."""
    fake.pci(ROOT_PORT, pci_class="0x060400", **port)
    fake.pci(SWITCH, under=f"pci0000:00/{ROOT_PORT}", pci_class="0x060400", **switch)
    fake.pci(LEAF, under=f"pci0000:00/{ROOT_PORT}/{SWITCH}", **leaf)


NUMA_CASES = [
    # (root port attrs, switch attrs, leaf attrs, expected leaf node)
    ({}, {}, {"numa_node": 1}, 1),
    ({}, {}, {"numa_node": -1, "local_cpulist": [2, 3]}, 1),
    ({}, {}, {"numa_node": None, "local_cpulist": [0, 4]}, 0),
    ({}, {"numa_node": 1}, {"numa_node": -1, "local_cpulist": range(8)}, 1),
    ({"numa_node": 0}, {"numa_node": -1}, {"numa_node": -1}, 0),
    ({"numa_node": -1, "local_cpulist": [6, 7]}, {"numa_node": -1}, {"numa_node": None}, 1),
    ({"numa_node": -1, "local_cpulist": range(8)}, {"numa_node": -1}, {"numa_node": -1}, None),
    ({}, {}, {"numa_node": 5, "local_cpulist": [1]}, 0),
    ({}, {}, {"numa_node": -1, "local_cpulist": [2, 3, 40]}, 1),
    ({}, {}, {"numa_node": -1, "local_cpulist": [40, 41]}, None),
]
NUMA_IDS = [
    "numa_node-file",
    "minus1-local-cpulist",
    "missing-file-local-cpulist",
    "local-cpus-span-nodes-parent-bridge",
    "grandparent-bridge",
    "grandparent-local-cpulist",
    "nothing-anywhere-none",
    "offline-node-falls-back",
    "unknown-cpus-ignored",
    "only-unknown-cpus-none",
]


@pytest.mark.parametrize("port,switch,leaf,expected", NUMA_CASES, ids=NUMA_IDS)
def test_numa_node_resolution(two_node, port, switch, leaf, expected) -> None:
    _chain(two_node, port, switch, leaf)
    topo = discover(two_node.root)
    dev = topo.device(LEAF)
    assert dev is not None
    assert dev.numa_node == expected
    assert dev.parent == SWITCH
    assert topo.device(SWITCH).parent == ROOT_PORT
    assert topo.device(ROOT_PORT).parent is None


def test_local_cpus_mask_when_list_missing(two_node) -> None:
    rel = two_node.pci(LEAF, numa_node=-1)
    two_node.write(f"{rel}/local_cpus", "000000cc")  # CPUs 2,3,6,7
    dev = discover(two_node.root).device(LEAF)
    assert dev.local_cpus == {2, 3, 6, 7}
    assert dev.numa_node == 1


def test_sriov_pf_and_vfs(two_node) -> None:
    pf = two_node.pci(
        "0000:5e:00.0",
        numa_node=1,
        driver="ice",
        netdevs=["ens1f0"],
        sriov_totalvfs=64,
        sriov_numvfs=12,
        iommu_group=40,
    )
    vfs = {}
    for i in range(12):
        # virtfn10/11 must come after virtfn9 (numeric, not name order), and the order is
        # the virtfn index even where addresses run the other way (here: descending)
        j = 11 - i
        addr = f"0000:5e:{1 + j // 8:02x}.{j % 8}"
        vfs[i] = two_node.pci(
            addr,
            numa_node=1,
            driver="vfio-pci" if i % 2 else "iavf",
            netdevs=[] if i % 2 else [f"ens1f0v{i}"],
            iommu_group=100 + i,
        )
    two_node.sriov(pf, vfs)
    topo = discover(two_node.root)

    pf_dev = topo.device("0000:5e:00.0")
    expected_vfs = tuple(rel.rsplit("/", 1)[1] for _, rel in sorted(vfs.items()))
    assert pf_dev.vfs == expected_vfs
    assert pf_dev.vfs[0] == "0000:5e:02.3" and pf_dev.vfs[10] == "0000:5e:01.1"
    assert (pf_dev.sriov_totalvfs, pf_dev.sriov_numvfs) == (64, 12)
    assert pf_dev.is_pf and not pf_dev.is_vf and pf_dev.physfn is None
    assert pf_dev.netdevs == ("ens1f0",) and pf_dev.driver == "ice" and pf_dev.iommu_group == 40
    for i, addr in enumerate(expected_vfs):
        vf = topo.device(addr)
        assert vf.physfn == "0000:5e:00.0" and vf.is_vf and not vf.is_pf
        assert vf.driver == ("vfio-pci" if i % 2 else "iavf")
        assert vf.netdevs == (() if i % 2 else (f"ens1f0v{i}",))
        assert vf.iommu_group == 100 + i
        assert vf.vfs == () and vf.sriov_totalvfs is None


def test_optional_attributes_absent(two_node) -> None:
    two_node.pci("0000:00:1f.0", pci_class="0x060100", numa_node=None)
    dev = discover(two_node.root).device("0000:00:1f.0")
    assert dev.driver is None and dev.iommu_group is None and dev.netdevs == ()
    assert dev.physfn is None and dev.vfs == () and dev.sriov_numvfs is None
    assert dev.local_cpus == frozenset() and dev.numa_node is None
    assert dev.gpu_uuid is None and dev.gpu_minor is None


def test_no_pci_bus(two_node) -> None:
    assert discover(two_node.root).pci_devices == ()


@pytest.mark.parametrize(
    "pci_class,kind",
    [
        ("0x030000", "gpu"),
        ("0x030200", "gpu"),
        ("0x038000", "gpu"),
        ("0x020000", "nic"),
        ("0x020001", "nic"),
        ("0x020700", "rdma"),
        ("0x010802", "other"),
        ("0x060400", "other"),
        ("0x120000", "other"),
        ("0xffff00", "other"),
    ],
    ids=[
        "vga",
        "3d",
        "display-other",
        "ethernet",
        "ethernet-progif",
        "infiniband",
        "nvme",
        "bridge",
        "accelerator",
        "virtio-unclassified",
    ],
)
def test_classify(pci_class: str, kind: str) -> None:
    assert classify(pci_class) == kind


@pytest.mark.parametrize(
    "name,ok",
    [
        ("0000:3b:00.0", True),
        ("10000:00:00.7", True),
        ("0000:3b:00.8", False),
        ("pci0000:00", False),
        ("0000:3b:00", False),
        ("virtfn0", False),
    ],
    ids=["plain", "vmd-domain", "bad-function", "root-bus", "no-function", "link-name"],
)
def test_is_pci_address(name: str, ok: bool) -> None:
    assert is_pci_address(name) is ok


NVIDIA_INFO = """Model: \t\t NVIDIA A100-SXM4-40GB
IRQ:   \t\t 172
GPU UUID: \t GPU-5e3c4d2a-1b2f-4d1e-9c7a-0a1b2c3d4e5f
Video BIOS: \t 92.00.45.00.03
Bus Type: \t PCIe
DMA Size: \t 47 bits
DMA Mask: \t 0x7fffffffffff
Bus Location: \t 0000:3b:00.0
Device Minor: \t 3
GPU Excluded:\t No
"""


def _with_gpu(two_node, tmp_path: Path, info: str | None) -> Path:
    two_node.pci(
        "0000:3b:00.0",
        pci_class="0x030200",
        vendor="0x10de",
        device="0x20b0",
        numa_node=0,
        driver="nvidia",
    )
    proc = tmp_path / "proc"
    if info is not None:
        path = proc / "driver/nvidia/gpus/0000:3b:00.0/information"
        path.parent.mkdir(parents=True)
        path.write_text(info)
    proc.mkdir(exist_ok=True)
    return proc


def test_nvidia_identity_from_proc(two_node, tmp_path: Path) -> None:
    proc = _with_gpu(two_node, tmp_path, NVIDIA_INFO)
    gpu = discover(two_node.root, proc).device("0000:3b:00.0")
    assert gpu.gpu_uuid == "GPU-5e3c4d2a-1b2f-4d1e-9c7a-0a1b2c3d4e5f"
    assert gpu.gpu_minor == 3
    assert (gpu.kind, gpu.vendor, gpu.numa_node) == ("gpu", "0x10de", 0)


@pytest.mark.parametrize("info", [None, NVIDIA_INFO], ids=["no-information-file", "no-proc-root"])
def test_nvidia_identity_absent(two_node, tmp_path: Path, info) -> None:
    proc = _with_gpu(two_node, tmp_path, info)
    gpu = discover(two_node.root, proc if info is None else None).device("0000:3b:00.0")
    assert gpu.gpu_uuid is None and gpu.gpu_minor is None


@pytest.mark.parametrize(
    "text",
    [
        NVIDIA_INFO.replace("GPU-5e3c", "5e3c"),
        NVIDIA_INFO.replace("Device Minor: \t 3", "Device Minor: \t three"),
        NVIDIA_INFO.replace("Device Minor: \t 3", "Device Minor: \t -1"),
        NVIDIA_INFO.replace("GPU UUID", "UUID"),
        "",
    ],
    ids=[
        "uuid-without-prefix",
        "minor-not-a-number",
        "negative-minor",
        "uuid-line-missing",
        "empty",
    ],
)
def test_nvidia_information_garbage(two_node, tmp_path: Path, text: str) -> None:
    with pytest.raises(ValueError):
        parse_nvidia_information(text)
    proc = _with_gpu(two_node, tmp_path, text)
    with pytest.raises(SysfsError) as err:
        discover(two_node.root, proc)
    assert str(proc / "driver/nvidia/gpus/0000:3b:00.0/information") in str(err.value)
