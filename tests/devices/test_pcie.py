"""PCIe placement of devices: the DRA attributes numa-pin describes its devices with, and the
link between two devices as ``nvidia-smi topo -m`` names it (issue 26, sections 1 and 3).

Oracles: the kernel-shaped sysfs tree itself (the ``pci<domain>:<bus>`` directory under
``/sys/devices`` a function's resolved path starts from is its root complex, which is what
Kubernetes' ``resource.kubernetes.io/pcieRoot`` names), and the kit's declaration of where each
function sits (GPUs 2 and 3 and :data:`devtree.SWITCH_NIC` below one switch,
:data:`devtree.ROOT_NIC` below another root port of the same root bus).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from numa_pin.admission.decide import NodeSettings
from numa_pin.base.cpuset import parse_list
from numa_pin.base.record import replace
from numa_pin.cluster.nrt import build_nrt
from numa_pin.devices import pcie
from numa_pin.devices.model import DeviceInfo
from numa_pin.ledger.model import LedgerState
from numa_pin.testing import devtree, machine, shapes
from numa_pin.testing.pci_spec import CLASS_ETHERNET, CLASS_PCI_BRIDGE, PciSpec
from numa_pin.topology.discover import discover

SPEC = devtree.gpudirect()
GPUS = sorted(p.address for p in SPEC.pci if p.gpu_minor is not None)
NIC0 = "0000:32:00.0"  # E810 PF, node 0
CX6 = devtree.CX6_PF  # node 3
CX6_VF = "0000:c9:00.3"


def test_every_pcie_root_is_the_sysfs_directory_the_function_hangs_from(built, topo):
    devices = os.path.realpath(built.sysfs_root / "devices")
    for dev in topo.pci_devices:
        real = os.path.realpath(built.sysfs_root / "bus" / "pci" / "devices" / dev.address)
        assert pcie.pcie_root(topo, dev.address) == os.path.relpath(real, devices).split(os.sep)[0], dev.address


@pytest.mark.parametrize(
    "a, b, want",
    [(GPUS[2], GPUS[2], "X"), (GPUS[2], GPUS[3], "PIX"), (GPUS[2], devtree.SWITCH_NIC, "PIX"),
     (GPUS[3], devtree.ROOT_NIC, "PHB"), (GPUS[0], NIC0, "NODE"), (GPUS[0], GPUS[2], "SYS"),
     (CX6, CX6_VF, "PIX"), (GPUS[6], CX6_VF, "NODE"), (GPUS[0], "0000:ff:00.0", "?")],
    ids=["itself", "one-switch", "gpudirect-switch", "one-root-complex", "one-node", "across-nodes", "vf-of-pf",
         "vf-same-node", "unknown"],
)
def test_link_between_two_devices(topo, a, b, want):
    assert pcie.link(topo, a, b) == want
    assert pcie.link(topo, b, a) == want


#: ``gpudirect`` with :data:`devtree.ROOT_NIC`'s second port (function 1 of the same card, right
#: below the same root port) and, below that root port through a bridge of its own, a third NIC
ROOT_NIC_PORT1 = "0000:41:00.1"
BEHIND_BRIDGE = "0000:43:00.0"


def _dual_port_spec():
    def fn(address: str, parent: str, pci_class: str = CLASS_ETHERNET) -> PciSpec:
        bridge = pci_class == CLASS_PCI_BRIDGE
        return PciSpec(address, "0x15b3", "0x101b", pci_class, 1, driver="pcieport" if bridge else "mlx5_core",
                       parent=parent, netdevs=() if bridge else (f"ens{address[5:7]}f{address[-1]}",))

    root_port = next(p.parent for p in SPEC.pci if p.address == devtree.ROOT_NIC)
    extra = (fn(ROOT_NIC_PORT1, root_port), fn("0000:42:00.0", root_port, CLASS_PCI_BRIDGE),
             fn(BEHIND_BRIDGE, "0000:42:00.0"))
    return replace(SPEC, name="gpudirect-dual-port", pci=(*SPEC.pci, *extra))


@pytest.mark.parametrize(
    "a, b, want",
    [(devtree.ROOT_NIC, ROOT_NIC_PORT1, "PIX"), (ROOT_NIC_PORT1, BEHIND_BRIDGE, "PXB"),
     (devtree.ROOT_NIC, GPUS[2], "PHB")],
    ids=["two-ports-of-one-card", "root-port-and-a-bridge", "other-root-port"],
)
def test_link_between_the_ports_of_one_card(tmp_path_factory, a, b, want):
    """``nvidia-smi topo -m``: PIX is "at most a single PCIe bridge" between them, PXB "multiple
    PCIe bridges (without traversing the PCIe Host Bridge)": the two functions of one dual-port
    NIC below a root port have that one root port between them."""
    built = machine.build_once(_dual_port_spec(), tmp_path_factory.getbasetemp())
    topo = discover(built.sysfs_root, built.proc_root)
    assert a.rsplit(".", 1)[0] == b.rsplit(".", 1)[0] or want != "PIX"
    assert pcie.link(topo, a, b) == want
    assert pcie.link(topo, b, a) == want


def test_topology_json_carries_the_dra_attributes(built, topo):
    out = subprocess.run([sys.executable, "-m", "numa_pin.cli.main", "topology", "--json", "--sysfs-root",
                          str(built.sysfs_root), "--proc-root", str(built.proc_root)],
                         capture_output=True, text=True, check=True).stdout
    by = {d["address"]: d["dra"] for d in json.loads(out)["pci_devices"]}
    gpu = topo.device(GPUS[2])
    assert by[GPUS[2]] == {"resource.kubernetes.io/pciBusID": GPUS[2],
                           "resource.kubernetes.io/pcieRoot": pcie.pcie_root(topo, GPUS[2]),
                           "resource.kubernetes.io/numaNode": gpu.numa_node,
                           "numaNode": gpu.numa_node}  # the name of earlier releases, for one more
    assert by[CX6_VF]["resource.kubernetes.io/pcieRoot"] == by[CX6]["resource.kubernetes.io/pcieRoot"]
    lists = {d["address"]: d["dra_lists"] for d in json.loads(out)["pci_devices"]}
    # gpu8: two sockets of two sub-NUMA nodes each (SLIT 11 within a socket, 21 across)
    assert lists[GPUS[2]] == {"resource.kubernetes.io/numaNode": [1, 0]}
    assert lists[CX6] == {"resource.kubernetes.io/numaNode": [3, 2]}


def test_topology_pcie_prints_the_matrix(built, topo):
    out = subprocess.run([sys.executable, "-m", "numa_pin.cli.main", "topology", "--pcie", "--sysfs-root",
                          str(built.sysfs_root), "--proc-root", str(built.proc_root)],
                         capture_output=True, text=True, check=True).stdout
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:] if line[:3] in ("GPU", "NIC")
            and ":" not in line}
    names = out.splitlines()[0].split()[:-1]
    where = {line.split(":", 1)[0]: line.split()[1] for line in out.splitlines() if ": 0000:" in line}
    for a in names:
        for b, cell in zip(names, rows[a], strict=False):
            assert cell == pcie.link(topo, where[a], where[b])
        assert rows[a][-1] == str(topo.device(where[a]).numa_node)


def test_nrt_zones_describe_their_devices_with_dra_attributes(topo):
    gpus = tuple(DeviceInfo(a, (topo.device(a).numa_node,)) for a in GPUS)
    obj = build_nrt(topo, NodeSettings(), LedgerState(), {"nvidia.com/gpu": gpus}, "n1")
    zone = next(z for z in obj["zones"] if z["name"] == "node-1")
    attrs = {a["name"]: a["value"] for a in zone["attributes"]}
    here = sorted(a for a in GPUS if topo.device(a).numa_node == 1)
    assert attrs == {"resource.kubernetes.io/numaNode": "1", "numaNode": "1",
                     "resource.kubernetes.io/pcieRoot": pcie.pcie_root(topo, here[0]),
                     "resource.kubernetes.io/pciBusID/nvidia.com/gpu": ",".join(here)}


def _kep6072_list(sysfs: str, node: int) -> list[int]:
    """KEP-6072's list, read from the kit's sysfs files alone: the node, then the nodes at the
    minimum non-self distance of its ``distance`` row that share its CPUs' ``physical_package_id``."""
    base = os.path.join(sysfs, "devices/system/node")
    nodes = sorted(int(n[4:]) for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit())

    def package(n: int) -> set[str]:
        cpus = parse_list(open(os.path.join(base, f"node{n}", "cpulist")).read().strip())
        return {open(os.path.join(sysfs, f"devices/system/cpu/cpu{c}/topology/physical_package_id")).read().strip()
                for c in cpus}

    row = dict(zip(nodes, map(int, open(os.path.join(base, f"node{node}", "distance")).read().split()), strict=True))
    others = {n: d for n, d in row.items() if n != node}
    nearest = min(others.values(), default=None)
    mine = package(node)
    return [node] + [n for n, d in sorted(others.items()) if d == nearest and len(mine) == 1 and package(n) == mine]


@pytest.mark.parametrize("shape", ["intel-2s-ht", "gpu8-sriov", "amd-nps4-8node", "cpuless-memory-node"])
def test_numa_node_list_form_is_kep6072s(tmp_path_factory, shape):
    """``resource.kubernetes.io/numaNode`` as an integer list (KEP-6072): the node first, then the
    nodes of its socket at its minimum SLIT distance; across sockets, or from a CPU-less node,
    nothing is added."""
    built = machine.build_once(shapes.SHAPES[shape](), tmp_path_factory.getbasetemp())
    topo = discover(built.sysfs_root, built.proc_root)
    lists = {n: list(pcie.numa_node_list(topo, n)) for n in topo.node_ids}
    assert lists == {n: _kep6072_list(str(built.sysfs_root), n) for n in topo.node_ids}
    if shape == "gpu8-sriov":
        assert lists == {0: [0, 1], 1: [1, 0], 2: [2, 3], 3: [3, 2]}
    if shape == "intel-2s-ht":
        assert lists == {0: [0], 1: [1]}
