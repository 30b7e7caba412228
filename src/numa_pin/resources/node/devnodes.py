"""The device nodes a container carries, looked up on the host (the edge of
:mod:`numa_pin.devices.devnode`).

* :func:`cdi_devices`: every device of the CDI spec files in the spec directories
  (``/etc/cdi`` then ``/var/run/cdi``: a later directory wins, as in CDI's own registry), JSON
  or YAML, each read bounded (:mod:`numa_pin.base.boundedio`); a file that is not a CDI spec is
  skipped and named when a device cannot be found;
* :func:`locate`: a node's device numbers (from the node under the dev root when the spec
  gave none), and from ``<sysfs>/dev/<char|block>/<major>:<minor>`` the PCI function it
  belongs to (the deepest PCI address in the resolved path) or that it is a virtual device;
* :func:`with_device_nodes`: a request with its fixed device nodes: the ``linux.devices`` of
  its spec and the nodes of every CDI name no other rule maps.
"""

from __future__ import annotations

import os
import stat

from numa_pin.base.boundedio import UnsafeInput, read_regular_file
from numa_pin.base.pciaddr import is_address
from numa_pin.base.record import replace
from numa_pin.devices.cdi_spec import spec_devices
from numa_pin.devices.devnode import DeviceNode

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from numa_pin.requests.request import ContainerRequest

MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_FILES = 256
_SUFFIXES = (".json", ".yaml", ".yml")


def _load(path: str) -> object:
    text = read_regular_file(path, MAX_SPEC_BYTES).decode("utf-8-sig")
    if path.endswith(".json"):
        from numa_pin.base.boundedio import json_loads_bounded

        return json_loads_bounded(text, 32)
    from numa_pin.config.load import _parse_yaml

    return _parse_yaml(text, path)


def cdi_devices(dirs: Sequence[str]) -> tuple[dict[str, tuple[DeviceNode, ...]], list[str]]:
    """``({CDI name: nodes}, [problems])`` of the spec files under ``dirs`` (missing
    directories are normal: nothing wrote a spec there)."""
    from numa_pin.errors import NumaPinError

    found: dict[str, tuple[DeviceNode, ...]] = {}
    problems: list[str] = []
    for directory in dirs:
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(_SUFFIXES))
        except OSError:
            continue
        if len(names) > MAX_SPEC_FILES:
            problems.append(f"{directory}: more than {MAX_SPEC_FILES} spec files, the rest ignored")
            names = names[:MAX_SPEC_FILES]
        for name in names:
            path = os.path.join(directory, name)
            try:
                found.update(spec_devices(_load(path), path))
            except (OSError, UnsafeInput, UnicodeDecodeError, ValueError, NumaPinError) as exc:
                problems.append(f"{path}: {exc}" if not str(exc).startswith(path) else str(exc))
    return found, problems


def _numbers(node: DeviceNode, dev_root: str) -> DeviceNode:
    if node.major is not None and node.minor is not None:
        return node
    host = node.path
    if dev_root != "/dev" and (host == "/dev" or host.startswith("/dev/")):
        host = dev_root + host[len("/dev"):]
    try:
        st = os.stat(host)
    except OSError as exc:
        return replace(node, why=f"cannot read device node {host}: {exc.strerror}")
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        return replace(node, why=f"{host} is not a device node")
    kind = "b" if stat.S_ISBLK(st.st_mode) else "c"
    return replace(node, type=kind, major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))


def locate(node: DeviceNode, sysfs_root: str, dev_root: str = "/dev") -> DeviceNode:
    """``node`` with its numbers and, where sysfs says, its PCI function or that it is virtual."""
    if node.why or not node.path:
        return node
    node = _numbers(node, dev_root)
    if node.why or node.type not in ("c", "b"):
        return node
    link = os.path.join(sysfs_root, "dev", "block" if node.type == "b" else "char", f"{node.major}:{node.minor}")
    if not os.path.lexists(link):
        return node
    real = os.path.realpath(link)
    devices = os.path.join(os.path.realpath(sysfs_root), "devices") + os.sep
    if not real.startswith(devices):
        return node
    parts = real[len(devices):].split(os.sep)
    if parts[0] == "virtual":
        return replace(node, virtual=True)
    address = next((p for p in reversed(parts) if is_address(p)), None)
    return replace(node, address=address) if address is not None else node


def with_device_nodes(
    request: ContainerRequest,
    spec_nodes: Iterable[DeviceNode],
    *,
    sysfs_root: str,
    dev_root: str,
    cdi_dirs: Sequence[str],
    mapped_kinds: Iterable[str],
) -> ContainerRequest:
    """``request`` with :attr:`fixed_nodes`: the spec's own nodes, then the nodes of every CDI
    name whose kind is not in ``mapped_kinds`` (those other rules map), all located."""
    nodes = list(spec_nodes)
    mapped = set(mapped_kinds)
    unmapped = [d for d in request.fixed_cdi if d.kind not in mapped]
    if unmapped:
        found, problems = cdi_devices(cdi_dirs)
        for dev in unmapped:
            if str(dev) in found:
                nodes += found[str(dev)]
            else:
                why = f"no CDI spec file in {', '.join(cdi_dirs)} names it"
                if problems:
                    why += f" (skipped: {'; '.join(problems[:3])})"
                nodes.append(DeviceNode("", str(dev), why=why))
    if not nodes:
        return request
    located = tuple(dict.fromkeys(locate(n, sysfs_root, dev_root) for n in nodes))
    return replace(request, fixed_nodes=located)


__all__ = ["cdi_devices", "locate", "with_device_nodes"]
