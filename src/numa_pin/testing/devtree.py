"""Device trees for tests: what DRA drivers, CDI and device plugins leave on a node.

* :func:`gpu8_devnodes`: the ``gpu8-sriov`` machine whose GPUs have DRM render nodes
  (``/sys/dev/char/226:<128+i>``) and whose ConnectX-6 PF has an RDMA verbs node
  (``231:192``), plus the kernel's virtual ``vfio`` and ``rdma_cm`` misc devices; NVIDIA's own
  ``/dev/nvidia<i>`` (195:i) have no ``/sys/dev/char`` entry, as on real machines;
* :func:`write_cdi_spec`: a CDI spec file as nvidia-ctk or a DRA driver writes it (JSON or
  YAML, any ``cdiVersion``);
* :func:`make_dev_nodes`: real character device nodes under a fake ``/dev`` (root only).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from numa_pin.base.record import replace
from numa_pin.testing.spec import MachineSpec

#: the DRM render node major and the RDMA verbs major of the kit
DRM_MAJOR = 226
UVERBS_MAJOR = 231
#: the PF whose verbs node the kit writes
CX6_PF = "0000:c9:00.0"


def gpu8_devnodes() -> MachineSpec:
    """``gpu8-sriov`` with DRM render nodes on its GPUs and a verbs node on its ConnectX-6."""
    from numa_pin.testing.shapes import SHAPES

    base = SHAPES["gpu8-sriov"]()
    pci = []
    for dev in base.pci:
        if dev.gpu_minor is not None:
            dev = replace(dev, dev_nodes=(f"drm/renderD{128 + dev.gpu_minor}={DRM_MAJOR}:{128 + dev.gpu_minor}",))
        elif dev.address == CX6_PF:
            dev = replace(dev, dev_nodes=(f"infiniband_verbs/uverbs0={UVERBS_MAJOR}:192",))
        pci.append(dev)
    return replace(base, name="gpu8-devnodes", pci=tuple(pci))


#: ``gpudirect``: a ConnectX NIC below node 1's GPU switch (beside GPUs 2 and 3) and one below a
#: second root port of the same root bus (same root complex, another root port)
SWITCH_NIC = "0000:3f:00.0"
#: ``gpudirect``: the E810 PF and its VF bound to vfio-pci
E810_PF = "0000:32:00.0"
VFIO_VF = "0000:32:01.3"
ROOT_NIC = "0000:41:00.0"


def gpudirect() -> MachineSpec:
    """:func:`gpu8_devnodes` plus :data:`SWITCH_NIC` (``PIX`` to GPUs 2 and 3) and
    :data:`ROOT_NIC` (``PHB`` to them): GPUDirect RDMA placements for co-location tests; and
    the E810's VF :data:`VFIO_VF` bound to ``vfio-pci``."""
    from numa_pin.testing.pci_spec import CLASS_ETHERNET, CLASS_PCI_BRIDGE, PciSpec

    base = gpu8_devnodes()
    node = 1
    def bridge(address: str, parent: str) -> PciSpec:
        return PciSpec(address, "0x1000", "0xc010", CLASS_PCI_BRIDGE, node, driver="pcieport", parent=parent)

    def nic(address: str, parent: str, netdev: str, dev_nodes: tuple[str, ...] = ()) -> PciSpec:
        return PciSpec(address, "0x15b3", "0x101b", CLASS_ETHERNET, node, driver="mlx5_core", parent=parent,
                       netdevs=(netdev,), dev_nodes=dev_nodes)

    extra = (
        bridge("0000:3c:02.0", "0000:3b:00.0"),  # a third downstream port of node 1's GPU switch
        nic(SWITCH_NIC, "0000:3c:02.0", "ens3f0", (f"infiniband_verbs/uverbs1={UVERBS_MAJOR}:193",)),
        PciSpec("0000:3a:02.0", "0x8086", "0x347a", CLASS_PCI_BRIDGE, node, driver="pcieport"),
        nic(ROOT_NIC, "0000:3a:02.0", "ens4f0"),
    )
    pci = []
    for dev in base.pci:
        if dev.address == E810_PF:  # its last VF bound to vfio-pci (DPDK): no netdev
            vfs = tuple(replace(vf, netdev=None, driver="vfio-pci") if vf.address == VFIO_VF else vf for vf in dev.vfs)
            dev = replace(dev, vfs=vfs)
        pci.append(dev)
    return replace(base, name="gpudirect", pci=(*pci, *extra))


#: a device node of a CDI spec: ``(path, major, minor)``; None numbers are left out of the file
Node = tuple[str, int | None, int | None]


def write_cdi_spec(directory: str | os.PathLike[str], kind: str, devices: Mapping[str, Sequence[Node]], *,
                   shared: Sequence[Node] = (), version: str = "0.6.0", fmt: str = "yaml",
                   name: str | None = None) -> Path:
    """Write one CDI spec file of ``kind`` with ``devices`` (name -> nodes) and the spec-level
    ``shared`` nodes; returns its path."""

    def nodes(items: Sequence[Node]) -> list[dict[str, object]]:
        out = []
        for path, major, minor in items:
            node: dict[str, object] = {"path": path, "type": "c"}
            if version >= "0.5.0":
                node["hostPath"] = path
            if major is not None:
                node["major"], node["minor"] = major, minor
            out.append(node)
        return out

    doc: dict[str, object] = {
        "cdiVersion": version,
        "kind": kind,
        "devices": [{"name": n, "containerEdits": {"deviceNodes": nodes(v), "env": [f"DEVICE={n}"]}}
                    for n, v in devices.items()],
    }
    if shared:
        doc["containerEdits"] = {"deviceNodes": nodes(shared)}
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / (name or f"{kind.replace('/', '-')}.{fmt}")
    if fmt == "json":
        path.write_text(json.dumps(doc, indent=2))
    else:
        import yaml

        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def make_dev_nodes(dev_root: str | os.PathLike[str], nodes: Sequence[Node]) -> None:
    """Character device nodes ``<dev_root>/<path below /dev>`` with those numbers (needs root)."""
    for path, major, minor in nodes:
        assert path.startswith("/dev/") and major is not None and minor is not None
        target = Path(dev_root) / path[len("/dev/"):]
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(major, minor))


__all__ = [
    "CX6_PF", "DRM_MAJOR", "E810_PF", "ROOT_NIC", "SWITCH_NIC", "UVERBS_MAJOR", "VFIO_VF", "gpu8_devnodes", "gpudirect",
    "make_dev_nodes", "write_cdi_spec",
]
