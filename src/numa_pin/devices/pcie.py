"""Where PCI functions sit relative to each other (pure): their PCIe root, the DRA attributes
that describe them, and the link between two of them in ``nvidia-smi topo -m``'s words.

* :func:`pcie_root`: the root complex of a function, ``pci<domain>:<bus>`` (the directory under
  ``/sys/devices`` it hangs from, the form of Kubernetes' standard DRA attribute
  ``resource.kubernetes.io/pcieRoot``): the bus of its topmost upstream bridge (a VF: its PF's);
* :func:`dra_attributes`: ``resource.kubernetes.io/pciBusID``, ``resource.kubernetes.io/pcieRoot``
  and ``resource.kubernetes.io/numaNode`` (KEP-6072) of a function, so a DRA-aware operator can
  match what numa-pin grants with a ``matchAttribute`` constraint; the bare ``numaNode`` of
  earlier releases is published beside it for this release (:data:`LEGACY_NUMA_NODE`), then goes;
* :func:`numa_node_list`: KEP-6072's list form of ``resource.kubernetes.io/numaNode`` (for
  clusters with list-typed attributes): the node, then the nodes of its socket at its minimum
  SLIT distance;
* :func:`link`: ``X`` (itself), ``PIX`` (their lowest common bridge is inside a switch, one
  is the other's upstream bridge, or both hang right below it, as the ports of one dual-port
  card do: at most one bridge between them), ``PXB`` (only their root port in common: several
  bridges, no host bridge), ``PHB`` (through their common host bridge: one root),
  ``NODE`` (different roots of one NUMA node), ``SYS`` (across NUMA nodes), ``?`` (a function
  without a node, or not on this machine);
* :func:`group_key`: the value devices must share under a co-location constraint
  (``pcie-root``, ``numa-node``, ``socket``).
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.topology.model import PciDevice, Topology

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"
#: the name numa-pin published before Kubernetes standardised :data:`NUMA_NODE` (KEP-6072); still
#: published, with the same value, for one release
LEGACY_NUMA_NODE = "numaNode"
#: what a co-location constraint may name (``numa-pin.io/colocate``)
SCOPES = ("pcie-root", "numa-node", "socket")
LINKS = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")


def _by_address(topology: Topology) -> Mapping[str, PciDevice]:
    return {d.address: d for d in topology.pci_devices}


def upstream(topology: Topology, address: str) -> list[str]:
    """``address`` then its upstream bridges, nearest first (a VF goes up through its PF)."""
    by = _by_address(topology)
    chain = [address]
    dev = by.get(address)
    if dev is not None and dev.physfn is not None:
        chain.append(dev.physfn)
        dev = by.get(dev.physfn)
    while dev is not None and dev.parent is not None and dev.parent not in chain:
        chain.append(dev.parent)
        dev = by.get(dev.parent)
    return chain


def pcie_root(topology: Topology, address: str) -> str:
    """``pci<domain>:<bus>`` of the root bus ``address`` hangs from."""
    top = upstream(topology, address)[-1]
    domain, bus = top.split(":")[:2]
    return f"pci{domain}:{bus}"


def dra_attributes(topology: Topology, address: str, *, lists: bool = False) -> dict[str, str | int | list[int]]:
    """The DRA attributes of one function (its NUMA node's left out when it has none). ``lists``:
    ``resource.kubernetes.io/numaNode`` in KEP-6072's list form (:func:`numa_node_list`), else
    the node alone, which a cluster without list-typed attributes takes (``matchAttribute``
    matches the scalar against another driver's list); :data:`LEGACY_NUMA_NODE` stays the node."""
    out: dict[str, str | int | list[int]] = {PCI_BUS_ID: address, PCIE_ROOT: pcie_root(topology, address)}
    dev = topology.device(address)
    if dev is not None and dev.numa_node is not None:
        out[NUMA_NODE] = list(numa_node_list(topology, dev.numa_node)) if lists else dev.numa_node
        out[LEGACY_NUMA_NODE] = dev.numa_node
    return out


def numa_node_list(topology: Topology, node: int) -> tuple[int, ...]:
    """KEP-6072's list of ``node``: itself first, then (ascending) the other nodes at the minimum
    SLIT distance from it (over every other node) that sit on its socket; a node whose socket
    is unknown (no CPUs) is never added, and a node with no others is alone."""
    others = [n for n in topology.node_ids if n != node]
    if node not in topology.nodes or not others:
        return (node,)
    nearest = min(topology.distance(node, n) for n in others)
    socket = _socket(topology, node)
    return (node, *(n for n in others if topology.distance(node, n) == nearest
                    and socket is not None and _socket(topology, n) == socket))


def _socket(topology: Topology, node: int) -> int | None:
    """The one socket of ``node``'s CPUs (None: no CPUs, or several sockets)."""
    sockets = {topology.cpus[c].socket for c in topology.nodes[node].cpus if c in topology.cpus}
    return sockets.pop() if len(sockets) == 1 else None


def link(topology: Topology, a: str, b: str) -> str:
    """How ``a`` reaches ``b`` (see the module doc)."""
    if a == b:
        return "X"
    da, db = topology.device(a), topology.device(b)
    if da is None or db is None:
        return "?"
    up_a, up_b = upstream(topology, a), upstream(topology, b)
    common = next((x for x in up_a if x in up_b), None)
    if common is not None:
        # below one switch (the lowest common bridge has a bridge above it), one below the
        # other, or both right below it (functions of one card: one bridge between them): PIX;
        # only their root port in common, through more bridges: PXB
        inside = common in (a, b) or up_a[-1] != common or up_a[1] == common == up_b[1]
        return "PIX" if inside else "PXB"
    if pcie_root(topology, a) == pcie_root(topology, b):
        return "PHB"
    if da.numa_node is None or db.numa_node is None:
        return "?"
    return "NODE" if da.numa_node == db.numa_node else "SYS"


def matrix_text(topology: Topology) -> str:
    """``nvidia-smi topo -m`` for the machine's GPUs and NICs (physical functions; InfiniBand
    HCAs are NICs there too, as nvidia-smi lists every RDMA device): the link between every two,
    each one's NUMA node, then the legend."""
    from numa_pin.topology.model import KIND_GPU, KIND_NIC, KIND_RDMA

    devs: list[tuple[str, str]] = []
    for kinds, label in (((KIND_GPU,), "GPU"), ((KIND_NIC, KIND_RDMA), "NIC")):
        picked = sorted(d.address for d in topology.pci_devices if d.kind in kinds and not d.is_vf)
        devs += [(f"{label}{i}", a) for i, a in enumerate(picked)]
    if not devs:
        return "no GPU or NIC\n"
    width = max(5, *(len(n) + 1 for n, _ in devs))
    lines = [" " * width + "".join(f"{n:<{width}}" for n, _ in devs) + "NUMA"]
    for name, a in devs:
        dev = topology.device(a)
        node = "N/A" if dev is None or dev.numa_node is None else str(dev.numa_node)
        lines.append(f"{name:<{width}}" + "".join(f"{link(topology, a, b):<{width}}" for _, b in devs) + node)
    lines.append("")
    lines += [f"{name}: {a} ({pcie_root(topology, a)})" for name, a in devs]
    lines += ["", "Legend: X itself; PIX below one PCIe switch; PXB below one root port; PHB through one "
              "root complex (host bridge); NODE across root complexes of one NUMA node; SYS across NUMA nodes"]
    return "\n".join(lines) + "\n"


def group_key(topology: Topology, address: str, scope: str) -> str | int | None:
    """What devices must share under ``scope``; None: the device cannot say (no node)."""
    if scope == "pcie-root":
        return pcie_root(topology, address)
    dev = topology.device(address)
    if dev is None or dev.numa_node is None:
        return None
    if scope == "numa-node":
        return dev.numa_node
    return _socket(topology, dev.numa_node) if dev.numa_node in topology.nodes else None


__all__ = [
    "LEGACY_NUMA_NODE", "LINKS", "NUMA_NODE", "PCIE_ROOT", "PCI_BUS_ID", "SCOPES", "dra_attributes", "group_key",
    "link", "matrix_text", "numa_node_list", "pcie_root", "upstream",
]
