"""A whole fake node for admissions without root: a kit machine plus fake proc and cgroup trees.

:class:`FakeNode` lays out, under one directory:

* the machine's sysfs (built once per shape by :func:`~numa_pin.testing.machine.build_once`);
* ``proc/self/mountinfo`` with a cgroup v1 cpuset hierarchy at ``cgroup/cpuset``;
* the hierarchy's top ``cpuset.cpus``/``cpuset.mems``;
* per container (:meth:`FakeNode.add_container`): a cgroup ``/<parent>/<name>`` and
  ``proc/<pid>/cgroup`` pointing at it, as a runtime would leave them before the hook runs, and
  with ``netns=NAME`` a network namespace: ``proc/<pid>/ns/net`` links to ``netns/NAME``, so the
  containers (and :meth:`FakeNode.join_netns` processes, a pod's pause) given one name share its
  identity (device and inode), as the containers of a pod share the sandbox's;
  :meth:`FakeNode.stop_container` removes both, as a container that ended leaves them.

Writes to the fake cgroup files are plain file writes, so the tree shows exactly what the
enforcer wrote. Used by the hook, agent and agent-server tests and by ``bench/hook_latency.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from numa_pin.base.cpuset import format_list
from numa_pin.testing import machine, shapes
from numa_pin.testing.spec import MachineSpec


class FakeNode:
    """Build with ``FakeNode(root, shape)`` (a name in :data:`~numa_pin.testing.shapes.SHAPES`, or
    a :class:`~numa_pin.testing.spec.MachineSpec` such as :func:`~numa_pin.testing.devtree.gpudirect`);
    ``cpus``/``mems`` override the top cpuset."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        shape: str | MachineSpec = "intel-2s-ht",
        *,
        machines: str | os.PathLike[str] | None = None,
        cpus: str | None = None,
        mems: str | None = None,
        parent: str = "ctr",  # containers live at /<parent>/<name>; "" puts them at the top
    ) -> None:
        self.root = Path(root)
        spec = shapes.SHAPES[shape]() if isinstance(shape, str) else shape
        built = machine.build_once(spec, machines if machines is not None else self.root / "machines")
        model = machine.expected_topology(spec)
        self.sysfs_root = Path(built.sysfs_root)
        self.proc_root = self.root / "proc"
        self.cgroup_root = self.root / "cgroup"
        self.state_dir = self.root / "state"
        self.cache_dir = self.root / "cache"
        self.parent = parent
        self.cpus = cpus if cpus is not None else format_list(model.cpu_ids)
        self.mems = mems if mems is not None else format_list(model.node_ids)
        (self.proc_root / "self").mkdir(parents=True)
        (self.proc_root / "self" / "mountinfo").write_text(
            f"35 25 0:30 / {self.cgroup_root}/cpuset rw,nosuid - cgroup cgroup rw,cpuset\n"
        )
        self._write_cpuset(self.cgroup_root / "cpuset", self.cpus)

    def _write_cpuset(self, directory: Path, cpus: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpuset.cpus").write_text(cpus + "\n")
        (directory / "cpuset.mems").write_text(self.mems + "\n")

    def cgroup_dir(self, name: str) -> Path:
        return self.cgroup_root / "cpuset" / self.parent / name

    def add_container(self, name: str, pid: int, cpus: str | None = None, *, netns: str | None = None) -> int:
        """The container's cgroup (inheriting the top cpuset unless ``cpus``) and its init pid,
        in the network namespace ``netns`` when given (see :meth:`join_netns`)."""
        self._write_cpuset(self.cgroup_dir(name), cpus if cpus is not None else self.cpus)
        (self.proc_root / str(pid)).mkdir(parents=True, exist_ok=True)
        rel = "/".join(part for part in (self.parent, name) if part)
        (self.proc_root / str(pid) / "cgroup").write_text(f"4:cpuset:/{rel}\n")
        if netns is not None:
            self.join_netns(pid, netns)
        return pid

    def join_netns(self, pid: int, netns: str) -> Path:
        """Put process ``pid`` into the fake network namespace ``netns`` (created on first use):
        ``proc/<pid>/ns/net`` becomes a link to ``netns/<netns>``. Returns that file."""
        target = self.root / "netns" / netns
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
        ns_dir = self.proc_root / str(pid) / "ns"
        ns_dir.mkdir(parents=True, exist_ok=True)
        link = ns_dir / "net"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
        return target

    def stop_container(self, name: str, pid: int) -> None:
        """The container ended: its cgroup and ``proc/<pid>`` are gone (no poststop implied)."""
        import shutil

        shutil.rmtree(self.cgroup_dir(name), ignore_errors=True)
        shutil.rmtree(self.proc_root / str(pid), ignore_errors=True)

    def cpuset(self, name: str) -> tuple[str, str]:
        """``(cpuset.cpus, cpuset.mems)`` of a container's cgroup, as last written."""
        d = self.cgroup_dir(name)
        return (d / "cpuset.cpus").read_text().strip(), (d / "cpuset.mems").read_text().strip()

    def config_dict(self, **extra: object) -> dict[str, object]:
        """A config naming this node's roots; ``extra`` keys are added (``policy="restricted"``)."""
        return {
            "sysfs_root": str(self.sysfs_root), "proc_root": str(self.proc_root),
            "cgroup_root": str(self.cgroup_root), "state_dir": str(self.state_dir), "syslog": False, **extra,
        }

    def write_config(self, path: str | os.PathLike[str] | None = None, *, settled: bool = True,
                     **extra: object) -> Path:
        """Write :meth:`config_dict` as YAML (JSON is YAML). ``settled`` backdates it an hour, because
        the config loader only caches a file that has not just changed."""
        target = Path(path) if path is not None else self.root / "config.yaml"
        target.write_text(json.dumps(self.config_dict(**extra), indent=1) + "\n")
        if settled:
            old = os.stat(target).st_mtime - 3600
            os.utime(target, (old, old))
        return target

    def oci_state(self, container_id: str, pid: int, annotations: dict[str, str] | None = None) -> bytes:
        """A bundle with ``annotations`` and the OCI state a runtime would pipe to the hook."""
        bundle = self.root / "bundles" / container_id
        bundle.mkdir(parents=True, exist_ok=True)
        (bundle / "config.json").write_text(json.dumps({"annotations": annotations or {}, "root": {"path": "rootfs"}}))
        return json.dumps({"ociVersion": "1.2.0", "id": container_id, "status": "creating", "pid": pid,
                           "bundle": str(bundle), "annotations": annotations or {}}).encode()
