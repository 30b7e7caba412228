"""Device nodes for GPUs: the pure node list, and creation through a real mount-namespace join.

The namespace tests join this test's own mount namespace (root only): the kernel's mknod and
lstat are the oracle, the "container root" is a temporary directory with a ``dev/``.
"""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from numa_pin.enforcer.devnodes import DeviceNode, create_device_nodes, gpu_device_nodes, remove_device_nodes
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError
from numa_pin.topology.model import PciDevice


def _gpu(address: str, minor: int | None) -> PciDevice:
    return PciDevice(address=address, vendor="0x10de", device="0x20b2", pci_class="0x030200", numa_node=0,
                     kind="gpu", gpu_minor=minor)


def test_gpu_nodes_by_minor_then_shared_nodes():
    nodes = gpu_device_nodes([_gpu("0000:19:00.0", 3), _gpu("0000:18:00.0", 1)], 507)
    assert [(n.path, n.major, n.minor) for n in nodes] == [
        ("/dev/nvidia1", 195, 1), ("/dev/nvidia3", 195, 3), ("/dev/nvidiactl", 195, 255),
        ("/dev/nvidia-uvm", 507, 0), ("/dev/nvidia-uvm-tools", 507, 1)]
    assert [n.path for n in gpu_device_nodes([_gpu("0000:18:00.0", 0)], None)] == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_a_gpu_without_minor_names_the_driver():
    with pytest.raises(EnforcementError, match="no device minor"):
        gpu_device_nodes([_gpu("0000:18:00.0", None)], None)


@pytest.fixture
def container_root(tmp_path):
    """``dev/`` and ``run/`` as tmpfs mounts of their own, like a runtime's (root only)."""
    mounted = []
    for name in ("dev", "run"):
        (tmp_path / name).mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path / name)], check=True)
        mounted.append(tmp_path / name)
    yield tmp_path
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.root
def test_nodes_and_list_are_made_and_undone(container_root):
    undo = UndoLog()
    made = create_device_nodes(os.getpid(), [DeviceNode("/dev/nvidia7", 1, 11)], "/proc", str(container_root), undo,
                               gpu_text="GPU-a 7\n")
    st = os.lstat(container_root / "dev" / "nvidia7")
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 11)
    assert stat.S_IMODE(st.st_mode) == 0o666
    assert (container_root / "run" / "numa-pin" / "gpus").read_text() == "GPU-a 7\n"
    assert set(made) == {"/dev/nvidia7", "/run/numa-pin/gpus", "/run/numa-pin"}
    assert not undo.rollback()
    assert sorted(os.listdir(container_root / "dev")) == [] and sorted(os.listdir(container_root / "run")) == []


@pytest.mark.root
def test_an_existing_right_node_is_left_alone_and_a_wrong_one_refused(container_root):
    os.mknod(container_root / "dev" / "nvidiactl", stat.S_IFCHR | 0o600, os.makedev(195, 255))
    assert create_device_nodes(os.getpid(), [DeviceNode("/dev/nvidiactl", 195, 255)], "/proc",
                               str(container_root), UndoLog()) == ()
    with pytest.raises(EnforcementError, match="not character device 195:0"):
        create_device_nodes(os.getpid(), [DeviceNode("/dev/nvidiactl", 195, 0)], "/proc", str(container_root),
                            UndoLog())


@pytest.mark.root
def test_a_symlinked_run_is_not_followed(container_root, tmp_path_factory):
    outside = tmp_path_factory.mktemp("host-etc")
    subprocess.run(["umount", str(container_root / "run")], check=True)
    (container_root / "run").rmdir()
    (container_root / "run").symlink_to(outside)
    create_device_nodes(os.getpid(), [DeviceNode("/dev/nvidia0", 1, 11)], "/proc", str(container_root),
                        UndoLog(), gpu_text="x\n")
    assert os.listdir(outside) == []
    assert (container_root / "dev" / "numa-pin" / "gpus").read_text() == "x\n"


@pytest.mark.root
def test_a_symlinked_list_directory_is_refused_and_nothing_is_left(container_root, tmp_path_factory):
    outside = tmp_path_factory.mktemp("host-etc")
    subprocess.run(["umount", str(container_root / "run")], check=True)
    (container_root / "dev" / "numa-pin").symlink_to(outside)
    with pytest.raises(EnforcementError, match="symlink"):
        create_device_nodes(os.getpid(), [DeviceNode("/dev/nvidia0", 1, 11)], "/proc", str(container_root),
                            UndoLog(), gpu_text="x\n")
    assert os.listdir(outside) == [] and os.listdir(container_root / "dev") == ["numa-pin"]


def test_a_gone_container_has_nothing_to_remove(tmp_path):
    remove_device_nodes(2**22 + 12345, ["/dev/nvidia0"], "/proc", None)  # no such pid: no error


@pytest.mark.root
def test_vfio_and_rdma_nodes_their_directories_and_the_variables_file_are_made_and_undone(container_root):
    """Nodes below /dev/vfio and /dev/infiniband (directories the runtime's /dev lacks) and
    /run/numa-pin/devices.env; the undo removes files before the directories that hold them."""
    undo = UndoLog()
    nodes = [DeviceNode("/dev/vfio/42", 1, 11), DeviceNode("/dev/vfio/vfio", 1, 12),
             DeviceNode("/dev/infiniband/uverbs0", 1, 13)]
    made = create_device_nodes(os.getpid(), nodes, "/proc", str(container_root), undo,
                               env_text="PCIDEVICE_INTEL_COM_VF=0000:32:01.3\n")
    for node in nodes:
        st = os.lstat(container_root / node.path.lstrip("/"))
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (node.major, node.minor)
    env = container_root / "run" / "numa-pin" / "devices.env"
    assert env.read_text() == "PCIDEVICE_INTEL_COM_VF=0000:32:01.3\n"
    dirs = [m for m in made if m in ("/dev/vfio", "/dev/infiniband", "/run/numa-pin")]
    assert sorted(dirs) == ["/dev/infiniband", "/dev/vfio", "/run/numa-pin"]
    assert all(made.index(n.path) < made.index(os.path.dirname(n.path)) for n in nodes)
    assert not undo.rollback()
    assert os.listdir(container_root / "dev") == [] and os.listdir(container_root / "run") == []
