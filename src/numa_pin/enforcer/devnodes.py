"""The device nodes a granted GPU needs, as values (pure).

A GPU is usable from a container when the container's ``/dev`` holds its character nodes and
its device rules allow them (see :mod:`numa_pin.enforcer.gpu` for the rules):

* ``/dev/nvidia<minor>`` (major 195, the *device minor*, never the NVML index);
* ``/dev/nvidiactl`` (195:255);
* ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools`` (the ``nvidia-uvm`` major, minors 0 and 1)
  while that module is loaded.

:func:`gpu_device_nodes` lists them; :func:`oci_device_entry` and :func:`oci_allow_rule` write
them the way a runtime reads them from ``config.json`` (``linux.devices`` and
``linux.resources.devices``).

In prestart mode (runc, crun, containerd: no config edit possible) :func:`create_device_nodes`
makes the nodes inside the container's mount namespace: a forked child joins
``/proc/<pid>/ns/mnt`` (``setns``) and calls ``mknod`` there, so the nodes land in the
container's own ``/dev`` tmpfs and never on the host. At prestart/createRuntime the container's
mounts exist but ``pivot_root`` has not happened, so its root is still ``root.path``; later the
root is ``/``. The same child writes the list of granted GPUs to ``/run/numa-pin/gpus`` when
``/run`` is a mount of its own (a tmpfs, as podman and CRI-O give), else to
``/dev/numa-pin/gpus`` (the runtime's ``/dev`` tmpfs), never into the image itself. Paths that are symlinks are
refused, so an image cannot point a write at the host.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from numa_pin.base.record import record
from numa_pin.enforcer.gpu import NVIDIA_MAJOR, NVIDIACTL_MINOR, DeviceRule, gpu_minors
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError
from numa_pin.topology.model import PciDevice

#: permissions of a created node (the NVIDIA driver's default for its nodes)
NODE_MODE = 0o666
#: where the container finds the list of its GPUs (the first whose top directory is a mount)
GPU_LIST_PATHS = ("/run/numa-pin/gpus", "/dev/numa-pin/gpus")
#: where the container finds ``PCIDEVICE_<RESOURCE>=<addresses>`` lines of its other devices
ENV_FILE_PATHS = ("/run/numa-pin/devices.env", "/dev/numa-pin/devices.env")
CLONE_NEWNS = 0x00020000


@record
class DeviceNode:
    """One character device node: where it lives in the container and its numbers."""

    path: str  # absolute, inside the container ("/dev/nvidia0")
    major: int
    minor: int
    mode: int = NODE_MODE
    type: str = "c"

    @property
    def rule(self) -> DeviceRule:
        """The device-cgroup rule that lets the container use this node."""
        return DeviceRule(self.type, self.major, self.minor, "rwm")


def gpu_device_nodes(gpus: Iterable[PciDevice], uvm_major: int | None) -> tuple[DeviceNode, ...]:
    """The nodes ``gpus`` need (see the module doc), GPUs by minor, then the shared ones.

    Raises EnforcementError for a GPU without a device minor (driver not loaded).
    """
    nodes = [DeviceNode(f"/dev/nvidia{m}", NVIDIA_MAJOR, m) for m in sorted(set(gpu_minors(gpus)))]
    nodes.append(DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR))
    if uvm_major is not None:
        nodes.append(DeviceNode("/dev/nvidia-uvm", uvm_major, 0))
        nodes.append(DeviceNode("/dev/nvidia-uvm-tools", uvm_major, 1))
    return tuple(nodes)


#: ``/dev/vfio/vfio``, the VFIO container node every VFIO user opens (misc minor 196)
VFIO_CONTAINER = DeviceNode("/dev/vfio/vfio", 10, 196)


def _numbers(path: str) -> tuple[int, int] | None:
    """``major:minor`` from a sysfs ``dev`` file, or None when it is absent or garbage."""
    from numa_pin.base.boundedio import UnsafeInput, read_regular_file

    try:
        major, _, minor = read_regular_file(path, 64).decode().strip().partition(":")
        return int(major), int(minor)
    except (OSError, UnsafeInput, UnicodeDecodeError, ValueError):
        return None


def function_nodes(dev: PciDevice, sysfs_root: str) -> tuple[DeviceNode, ...]:
    """The nodes a granted non-GPU function needs, as sysfs lists them.

    * bound to ``vfio-pci`` (DPDK): ``/dev/vfio/<IOMMU group>`` (``class/vfio/<group>/dev``) and
      ``/dev/vfio/vfio``;
    * with RDMA verbs (``<function>/infiniband_verbs/uverbs<N>``): ``/dev/infiniband/uverbs<N>``,
      and ``/dev/infiniband/rdma_cm`` (``class/misc/rdma_cm/dev``) when the kernel has it.
    """
    nodes: list[DeviceNode] = []
    if dev.driver == "vfio-pci" and dev.iommu_group is not None:
        numbers = _numbers(os.path.join(sysfs_root, "class", "vfio", str(dev.iommu_group), "dev"))
        if numbers is not None:
            nodes += [DeviceNode(f"/dev/vfio/{dev.iommu_group}", *numbers), VFIO_CONTAINER]
    verbs = os.path.join(sysfs_root, "bus", "pci", "devices", dev.address, "infiniband_verbs")
    try:
        names = sorted(os.listdir(verbs))[:64]
    except OSError:
        names = []
    for name in names:
        numbers = _numbers(os.path.join(verbs, name, "dev"))
        if numbers is not None:
            nodes.append(DeviceNode(f"/dev/infiniband/{name}", *numbers))
    if names:
        numbers = _numbers(os.path.join(sysfs_root, "class", "misc", "rdma_cm", "dev"))
        if numbers is not None:
            nodes.append(DeviceNode("/dev/infiniband/rdma_cm", *numbers))
    return tuple(nodes)


def pcidevice_env(resource: str) -> str:
    """sriov-network-device-plugin's variable for ``resource``: ``intel.com/sriov_vf`` ->
    ``PCIDEVICE_INTEL_COM_SRIOV_VF`` (upper case, every other character than a letter or digit
    an underscore)."""
    return "PCIDEVICE_" + "".join(c if c.isascii() and c.isalnum() else "_" for c in resource).upper()


def oci_device_entry(node: DeviceNode) -> dict[str, Any]:
    """The ``linux.devices`` entry that makes the runtime create ``node`` (owner root)."""
    return {
        "path": node.path, "type": node.type, "major": node.major, "minor": node.minor,
        "fileMode": node.mode, "uid": 0, "gid": 0,
    }


def oci_allow_rule(node: DeviceNode) -> dict[str, Any]:
    """The ``linux.resources.devices`` entry that allows ``node``."""
    return {"allow": True, "type": node.type, "major": node.major, "minor": node.minor, "access": "rwm"}


def gpu_list_text(gpus: Sequence[PciDevice]) -> str:
    """What the container is told about its GPUs: one ``<uuid or address> <minor>`` line each."""
    return "".join(f"{g.gpu_uuid or g.address} {'' if g.gpu_minor is None else g.gpu_minor}".rstrip() + "\n"
                   for g in gpus)


# ---- I/O: inside the container's mount namespace ------------------------------------------
def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, CLONE_NEWNS)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def in_mount_namespace(pid: int | str, proc_root: str, work: Callable[[], Any], what: str) -> Any:
    """Run ``work`` in a forked child that joined ``<proc_root>/<pid>/ns/mnt``; return its JSON result.

    Raises EnforcementError (naming ``what`` and the namespace) when the namespace cannot be
    joined or ``work`` raised OSError or ValueError there.
    """
    ns = os.path.join(proc_root, str(pid), "ns", "mnt")
    try:
        ns_fd = os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise EnforcementError(f"{what}: cannot open the container's mount namespace: {exc.strerror}",
                               path=ns) from exc
    read_end, write_end = os.pipe()
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child, checked through the pipe
            reply: dict[str, Any]
            try:
                os.close(read_end)
                _setns(ns_fd)
                reply = {"ok": work()}
            except (OSError, ValueError) as exc:
                reply = {"error": str(exc), "errno": getattr(exc, "errno", None)}
            except BaseException as exc:  # the child must always answer and exit
                reply = {"error": f"{type(exc).__name__}: {exc}", "errno": None}
            try:
                os.write(write_end, json.dumps(reply).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        write_end = -1
        chunks = []
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
        os.waitpid(child, 0)
    finally:
        os.close(ns_fd)
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    try:
        answer = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        answer = {}
    if "ok" not in answer:
        raise EnforcementError(f"{what} in the container's mount namespace: {answer.get('error', 'no answer')}",
                               path=ns)
    return answer["ok"]


def _container_root(rootfs: str | None) -> str:
    """Inside the joined namespace: ``rootfs`` before pivot_root, ``/`` after."""
    if rootfs and rootfs != "/" and os.path.isdir(os.path.join(rootfs, "dev")):
        return rootfs
    return "/"


def _no_symlink(path: str) -> None:
    if os.path.islink(path):
        raise ValueError(f"{path} is a symlink; numa-pin does not follow links inside a container")


def _make_nodes(rootfs: str | None, nodes: Sequence[tuple[str, int, int, int]], gpu_text: str | None,
                env_text: str | None = None) -> list[str]:
    """In the container's namespace: mknod what is missing, write the GPU list and the device
    variables; created paths. On failure what was created is removed again before the error
    propagates."""
    created: list[str] = []
    try:
        return _make_nodes_into(_container_root(rootfs), nodes, gpu_text, created, env_text)
    except (OSError, ValueError):
        _remove(rootfs, created)
        raise


def _make_nodes_into(root: str, nodes: Sequence[tuple[str, int, int, int]], gpu_text: str | None,
                     created: list[str], env_text: str | None = None) -> list[str]:
    dirs = 0  # directories made for nodes stay behind every node in ``created`` (removed last)
    for path, major, minor, mode in nodes:
        target = os.path.join(root, path.lstrip("/"))
        parent = os.path.dirname(target)
        _no_symlink(parent)
        if not os.path.isdir(parent) and os.path.dirname(path) not in ("", "/", "/dev"):
            os.mkdir(parent, 0o755)  # /dev/vfio, /dev/infiniband: one level below the runtime's /dev
            created.append(os.path.dirname(path))
            dirs += 1
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            os.mknod(target, stat.S_IFCHR | mode, os.makedev(major, minor))
            os.chmod(target, mode)
            created.insert(len(created) - dirs, path)
            continue
        if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (major, minor):
            raise ValueError(f"{path} exists in the container and is not character device {major}:{minor}")
    for text, paths in ((gpu_text, GPU_LIST_PATHS), (env_text, ENV_FILE_PATHS)):
        if text is None:
            continue
        candidates = [p for p in paths if _own_mount(os.path.join(root, p.lstrip("/").split("/", 1)[0]))]
        for i, path in enumerate(candidates):
            try:
                _write_list(root, path, text, created)
                break
            except OSError as exc:  # a read-only image /run: try the next place (/dev is the runtime's tmpfs)
                if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or i == len(candidates) - 1:
                    raise
    return created


def _own_mount(path: str) -> bool:
    """A real directory that is a mount of its own (the runtime's tmpfs), so a write there stays in
    the container; before pivot_root the image's own ``/run`` is the host's disk."""
    return os.path.isdir(path) and not os.path.islink(path) and os.path.ismount(path)


def _write_list(root: str, path: str, text: str, created: list[str]) -> None:
    directory = os.path.join(root, os.path.dirname(path).lstrip("/"))
    _no_symlink(directory)
    if not os.path.isdir(directory):
        os.mkdir(directory, 0o755)
        created.append(os.path.dirname(path))
    target = os.path.join(directory, os.path.basename(path))
    _no_symlink(target)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode("ascii", errors="replace"))
    finally:
        os.close(fd)
    created.insert(0, path)


def _remove(rootfs: str | None, paths: Sequence[str]) -> list[str]:
    root = _container_root(rootfs)
    for path in paths:  # files before the directory that holds them
        target = os.path.join(root, path.lstrip("/"))
        try:
            if os.path.isdir(target) and not os.path.islink(target):
                os.rmdir(target)
            else:
                os.unlink(target)
        except FileNotFoundError:
            pass
    return list(paths)


def create_device_nodes(
    pid: int | str,
    nodes: Sequence[DeviceNode],
    proc_root: str,
    rootfs: str | None,
    undo: UndoLog,
    *,
    gpu_text: str | None = None,
    env_text: str | None = None,
) -> tuple[str, ...]:
    """Create ``nodes`` (and the GPU list file, and the device variables file
    :data:`ENV_FILE_PATHS`) in the mount namespace of container ``pid``.

    Nodes that already exist with the right numbers are left alone (the runtime or CDI made
    them); what this call created is recorded in ``undo`` and returned (container paths).
    Raises EnforcementError when the namespace cannot be joined, a path is a symlink, a node
    exists with other numbers, or mknod/write fail (nothing of this call is left then).
    """
    spec = [(n.path, n.major, n.minor, n.mode) for n in nodes]
    created = in_mount_namespace(pid, proc_root, lambda: _make_nodes(rootfs, spec, gpu_text, env_text),
                                 "creating device nodes")
    paths = tuple(str(p) for p in created)
    if paths:
        undo.record(f"container {pid}: device nodes {', '.join(paths)}",
                    lambda: remove_device_nodes(pid, paths, proc_root, rootfs))
    return paths


def expose_gpus(gpus: Sequence[PciDevice], pid: int | str, proc_root: str, rootfs: str | None,
                undo: UndoLog) -> tuple[str, ...]:
    """The nodes of ``gpus`` and the GPU list, created in container ``pid`` (see
    :func:`create_device_nodes`; also raises EnforcementError for an unreadable /proc/devices)."""
    from numa_pin.enforcer.gpu import read_uvm_major

    nodes = gpu_device_nodes(gpus, read_uvm_major(proc_root))
    return create_device_nodes(pid, nodes, proc_root, rootfs, undo, gpu_text=gpu_list_text(gpus))


def remove_device_nodes(pid: int | str, paths: Sequence[str], proc_root: str, rootfs: str | None) -> None:
    """Remove ``paths`` from container ``pid``'s namespace; a container that is gone took them along.

    Raises EnforcementError when the namespace exists but the removal fails.
    """
    try:
        in_mount_namespace(pid, proc_root, lambda: _remove(rootfs, list(paths)), "removing device nodes")
    except EnforcementError as exc:
        if exc.__cause__ is not None and getattr(exc.__cause__, "errno", None) in (errno.ENOENT, errno.ESRCH):
            return
        raise


__all__ = [
    "GPU_LIST_PATHS",
    "NODE_MODE",
    "DeviceNode",
    "create_device_nodes",
    "expose_gpus",
    "gpu_device_nodes",
    "gpu_list_text",
    "in_mount_namespace",
    "oci_allow_rule",
    "oci_device_entry",
    "remove_device_nodes",
]
