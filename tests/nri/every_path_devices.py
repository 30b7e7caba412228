"""What a container sees of its devices on every path, for the every-path matrix's device rows.

A GPU node of the matrix (:meth:`every_path_world.MatrixNode.gpus`) has a cgroup v1 ``devices``
hierarchy beside ``cpuset`` and ``cpu``, and each container there a ``/dev`` of its own:
:class:`ContainerDevices` holds the character nodes in it and the rules of its ``devices``
cgroup, whoever made them:

* the runtime (runc, containerd), from what its path hands it: :meth:`ContainerDevices.runtime`
  makes the config's ``linux.devices`` and, as runc does on cgroup v1, denies everything, then
  allows the config's ``linux.resources.devices`` and runc's own default devices
  (:data:`RUNC_DEFAULTS`);
* numa-pin at prestart (or at NRI's ``StartContainer``): :func:`kernel` stands in for the two
  things a fake node cannot do, and only those: the forked child that joins the container's
  mount namespace (``devnodes.in_mount_namespace``; its work runs in this process, on the
  container's ``/dev`` held here, where ``mknod`` of a node that exists with the same numbers is
  left alone and one with other numbers refused, as ``devnodes._make_nodes`` does on a real
  ``/dev``), and the kernel's ``devices`` controller, which turns a rule written to
  ``devices.allow`` or ``devices.deny`` into ``devices.list`` (numa-pin's own writes and
  read-back stay real files of the fake cgroup tree).

So :attr:`ContainerDevices.nodes` and :meth:`ContainerDevices.rules` (beside runc's defaults)
are the same thing on every path, and the matrix compares them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from numa_pin.devices.devfilter import DeviceRule

#: runc's default allowed devices (libcontainer/specconv AllowedDevices), appended to the
#: config's rules on cgroup v1: null, zero, full, tty, urandom, random, the ptys and ptmx
RUNC_DEFAULTS = ("c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 5:0 rwm", "c 1:9 rwm", "c 1:8 rwm", "c 136:* rwm",
                 "c 5:2 rwm")
#: where numa-pin's GPU list and device variables land in the container (a runtime's ``/dev`` tmpfs)
GPU_FILE, ENV_FILE = "/dev/numa-pin/gpus", "/dev/numa-pin/devices.env"
#: a device node as the matrix compares it: (path in the container, type, major, minor)
Node = tuple[str, str, int, int]


class ContainerDevices:
    """The ``/dev`` of the node's one container, and its ``devices`` cgroup ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.nodes: dict[str, Node] = {}
        self.lists: dict[str, str] = {}  # the files numa-pin wrote there (the GPU list, devices.env)

    # -- the runtime --------------------------------------------------------------------------

    def runtime(self, devices: list[Node], rules: list[dict[str, Any]]) -> None:
        """What runc does with a config before the first hook: the nodes of ``linux.devices``,
        then deny all and allow ``rules`` (``linux.resources.devices``) and :data:`RUNC_DEFAULTS`."""
        for node in devices:
            self.nodes[node[0]] = node
        self.write("devices.deny", "a *:* rwm")
        for rule in rules:
            text = " ".join((rule.get("type") or "a", f"{_number(rule.get('major'))}:{_number(rule.get('minor'))}",
                             rule.get("access") or "rwm"))
            self.write("devices.allow" if rule.get("allow") else "devices.deny", text)
        for text in RUNC_DEFAULTS:
            self.write("devices.allow", text)

    def rules(self) -> frozenset[str]:
        """The container's allowed devices beside runc's defaults (``devices.list``)."""
        lines = (self.directory / "devices.list").read_text().split("\n")
        return frozenset(line for line in lines if line and line not in RUNC_DEFAULTS)

    # -- the kernel ---------------------------------------------------------------------------

    def write(self, name: str, text: str) -> None:
        """A write of ``text`` to the cgroup's ``name`` as the v1 controller takes it."""
        (self.directory / name).write_text(text + "\n")
        self.wrote(name, text)

    def wrote(self, name: str, text: str) -> None:
        """``devices.list`` after ``text`` was written to ``devices.allow``/``devices.deny``."""
        listed = self.directory / "devices.list"
        have = [line for line in listed.read_text().split("\n") if line] if listed.exists() else ["a *:* rwm"]
        rule = DeviceRule.parse(text.strip())
        if name == "devices.deny":
            have = [] if rule.type == "a" else [line for line in have if DeviceRule.parse(line) != rule]
        elif not any(DeviceRule.parse(line).covers(rule) for line in have):
            have.append("a *:* rwm" if rule.type == "a" else str(rule))
        listed.write_text("".join(line + "\n" for line in have))

    def make_nodes(self, nodes: list[tuple[str, int, int, int]], gpu_text: str | None,
                   env_text: str | None) -> list[str]:
        """``devnodes._make_nodes`` on this ``/dev``: the paths created."""
        created = []
        for path, major, minor, _mode in nodes:
            have = self.nodes.get(path)
            if have is not None and have[2:] != (major, minor):
                raise ValueError(f"{path} exists in the container and is not character device {major}:{minor}")
            if have is None:
                self.nodes[path] = (path, "c", major, minor)
                created.append(path)
        for text, path in ((gpu_text, GPU_FILE), (env_text, ENV_FILE)):
            if text is not None:
                self.lists[path] = text
                created.insert(0, path)
        return created

    def remove(self, paths: list[str]) -> list[str]:
        for path in paths:
            self.nodes.pop(path, None)
            self.lists.pop(path, None)
        return list(paths)


def _number(value: Any) -> str:
    return "*" if value is None else str(value)


def kernel(monkeypatch: Any, devices: ContainerDevices, pid: int) -> None:
    """Stand in for the container's mount namespace and the kernel's ``devices`` controller
    (see the module doc); numa-pin's decisions and its cgroup writes stay its own."""
    from numa_pin.enforcer import cgroups, devnodes

    write = cgroups.write_cgroup_file

    def write_cgroup_file(path: str, text: str) -> None:
        write(path, text)
        if Path(path).parent == devices.directory and Path(path).name in ("devices.allow", "devices.deny"):
            devices.wrote(Path(path).name, text)

    def in_mount_namespace(target: int | str, proc_root: str, work: Any, what: str) -> Any:
        assert int(target) == pid, f"{what}: only the container's namespace ({pid}), not {target}"
        try:
            return json.loads(json.dumps(work()))
        except (OSError, ValueError) as exc:
            from numa_pin.errors import EnforcementError

            raise EnforcementError(f"{what} in the container's mount namespace: {exc}",
                                   path=os.path.join(proc_root, str(target), "ns", "mnt")) from exc

    monkeypatch.setattr(cgroups, "write_cgroup_file", write_cgroup_file)
    monkeypatch.setattr(devnodes, "in_mount_namespace", in_mount_namespace)
    monkeypatch.setattr(devnodes, "_make_nodes", lambda rootfs, nodes, gpu_text, env_text=None:
                        devices.make_nodes(list(nodes), gpu_text, env_text))
    monkeypatch.setattr(devnodes, "_remove", lambda rootfs, paths: devices.remove(list(paths)))


__all__ = ["ENV_FILE", "GPU_FILE", "RUNC_DEFAULTS", "ContainerDevices", "Node", "kernel"]
