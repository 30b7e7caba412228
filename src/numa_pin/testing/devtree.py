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

from numa_pin.record import replace
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


__all__ = ["CX6_PF", "DRM_MAJOR", "UVERBS_MAJOR", "gpu8_devnodes", "make_dev_nodes", "write_cdi_spec"]
