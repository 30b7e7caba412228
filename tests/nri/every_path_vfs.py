"""SR-IOV VFs on every path, for the every-path matrix's VF rows.

A VF node of the matrix (:meth:`every_path_world.MatrixNode.vfs`) is the GPU node with the
E810 PF ``ens2f0`` (0000:32:00.0, node 0) as an SR-IOV VF resource, :data:`VF_RES`, and the
service tests' netlink fake (``tests/service/vf_world.py``, from ``tests/enforcer/netlink_fakes.py``:
every request goes through pyroute2's encoder and decoder) holding the PF, its VFs with netdevs
(0000:32:01.0-2; the kit binds 0000:32:01.3 to vfio-pci) and their PF-side state. The container's
network namespace is ``proc/<pid>/ns/net``, made with the container.

Who moves a VF differs by path, what the container ends with must not: numa-pin at prestart
(and the prestart hook after precreate), or at NRI's ``StartContainer``; the runtime where
precreate hands it ``linux.netDevices`` (:func:`runtime_moves`, as runc does: the host's
interface into the container's namespace under the name given, nothing set on the PF).
:func:`seen` is what the matrix compares: where each VF's interface is and under which name,
and each VF's PF-side state that changed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location(
    "every_path_vf_world", Path(__file__).resolve().parents[1] / "service" / "vf_world.py")
assert _spec is not None and _spec.loader is not None
vf_world: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vf_world)

VF_RES = vf_world.VF_RES
HOST = vf_world.HOST
#: the VFs of ``ens2f0`` that have a network interface on the matrix's GPU machine
VFS = vf_world.VFS[:3]
#: the VF resource: the VFs of ``ens2f0`` with a network interface
VF_RESOURCES = {VF_RES: [{"is_vf": True, "has_netdev": True, "pf_names": ["ens2f0"]}]}
#: where :func:`seen` says a VF is when it is in the container's network namespace
CONTAINER = "<container>"


def world(proc_root: Path) -> Any:
    """The PF and its VFs in the host's namespace, each VF with PF-side state of its own."""
    net = vf_world.fakes.World(proc_root)
    net.ns[HOST] = {2: vf_world.fakes.Link("ens2f0", "0c:42:a1:00:00:01", vf_world.PF, up=True)}
    for i, bdf in enumerate(VFS):
        net.ns[HOST][10 + i] = vf_world.fakes.Link(f"ens2f0v{i}", f"0e:00:00:00:00:1{i}", bdf, up=True)
    net.pf_index = 2
    net.vfs = {i: vf_world.fakes.vf_state(vlan=5 * i, qos=i % 2) for i in range(len(VFS))}
    return net


def runtime_moves(net: Any, pid: int, net_devices: dict[str, str]) -> None:
    """runc's ``linux.netDevices``: each host interface moved into ``pid``'s namespace and
    renamed; the PF is left alone."""
    host, target = net.ns[HOST], net.ns[net.netns_path(pid)]
    for name, new_name in net_devices.items():
        (index,) = (i for i, link in host.items() if link.name == name)
        link = target[index] = host.pop(index)
        link.name = new_name


def seen(net: Any, pid: int, before: dict[int, dict[str, Any]]) -> tuple[dict[str, tuple[str, str]],
                                                                         dict[int, dict[str, Any]]]:
    """(``{vf: (namespace, name)}`` of the VFs away from the host, the container's namespace
    named :data:`CONTAINER`; ``{vf index: PF-side state}`` of the VFs whose state differs from
    ``before``)."""
    ns = net.netns_path(pid)
    where = {bdf: (CONTAINER if at[0] == ns else at[0], at[1]) for bdf in VFS
             if (at := net.where(bdf)) is not None and at[0] != HOST}
    return where, {n: dict(state) for n, state in net.vfs.items() if state != before.get(n)}


__all__ = ["CONTAINER", "HOST", "VFS", "VF_RES", "VF_RESOURCES", "runtime_moves", "seen", "world"]
