"""The enforcer against the real cgroup v1 hierarchy of this machine (root only).

Test cgroups are created under ``/sys/fs/cgroup/{cpuset,devices}/numa-pin-test-<random>``
and removed afterwards. The kernel's own view of the confined process
(``/proc/<pid>/status`` ``Cpus_allowed_list``) is the oracle.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from numa_pin.base import cpuset as cpulist
from numa_pin.enforcer.cgroups import CgroupRef, find_cgroup
from numa_pin.enforcer.cpuset import apply_cpuset, read_cpuset
from numa_pin.enforcer.gpu import allow_device_rules, gpu_rules
from numa_pin.enforcer.mounts import detect_layout
from numa_pin.enforcer.pool import resize_shared
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError
from numa_pin.topology.model import KIND_GPU, PciDevice

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPUSET = CGROUP_ROOT / "cpuset"
DEVICES = CGROUP_ROOT / "devices"

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not (CPUSET / "cpuset.cpus").exists(),
                       reason="no cgroup v1 cpuset hierarchy at /sys/fs/cgroup/cpuset"),
]


def read(path: Path) -> str:
    return path.read_text().strip()


def cpus_allowed(pid: int) -> frozenset[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return cpulist.parse_list(line.split(":", 1)[1])
    raise AssertionError("no Cpus_allowed_list")


def remove_tree(d: Path) -> None:
    """rmdir a cgroup and its children, deepest first (cgroupfs has no regular files)."""
    if not d.exists():
        return
    for child in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        child.rmdir()
    d.rmdir()


@pytest.fixture
def test_cpuset() -> Iterator[Path]:
    """A fresh cpuset cgroup initialised to all of the root's CPUs and nodes."""
    d = CPUSET / f"numa-pin-test-{secrets.token_hex(4)}"
    d.mkdir()
    try:
        (d / "cpuset.mems").write_text(read(CPUSET / "cpuset.mems"))
        (d / "cpuset.cpus").write_text(read(CPUSET / "cpuset.cpus"))
        yield d
    finally:
        remove_tree(d)


@pytest.fixture
def confined(test_cpuset: Path) -> Iterator[tuple[Path, int]]:
    """A sleeping child moved into ``test_cpuset``; killed (so rmdir works) afterwards."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        (test_cpuset / "cgroup.procs").write_text(str(proc.pid))
        yield test_cpuset, proc.pid
    finally:
        proc.kill()
        proc.wait()


def online_cpus() -> frozenset[int]:
    return cpulist.parse_list(read(CPUSET / "cpuset.cpus"))


def test_layout_and_find_cgroup_on_this_machine(confined: tuple[Path, int]) -> None:
    d, pid = confined
    layout = detect_layout("/proc", pid)
    assert layout.mode in ("v1", "hybrid") and layout.cpuset_version == 1
    ref = find_cgroup(pid, "/proc", CGROUP_ROOT, layout)
    assert ref.cpuset_dir == str(d)
    assert ref.rel_path == "/" + d.name


def test_apply_readback_undo(confined: tuple[Path, int]) -> None:
    d, pid = confined
    all_cpus = online_cpus()
    target = frozenset({max(all_cpus)})
    mems = cpulist.parse_list(read(CPUSET / "cpuset.mems"))
    ref = find_cgroup(pid, "/proc", CGROUP_ROOT, detect_layout("/proc", pid))
    undo = UndoLog()
    state = apply_cpuset(ref, target, mems, CGROUP_ROOT, undo)
    assert cpus_allowed(pid) == target  # the kernel's view of the confined task
    assert state.effective_cpus == target
    assert read_cpuset(ref).cpus == target
    assert len(undo) == 1  # mems unchanged: only cpuset.cpus written
    assert undo.rollback() == ()
    assert cpus_allowed(pid) == all_cpus
    assert cpulist.parse_list(read(d / "cpuset.cpus")) == all_cpus


@pytest.mark.skipif(len(cpulist.parse_list(
    (CPUSET / "cpuset.cpus").read_text() if (CPUSET / "cpuset.cpus").exists() else "0")) < 2,
    reason="needs two CPUs")
def test_v1_child_outside_parent_refused(test_cpuset: Path) -> None:
    cpus = sorted(online_cpus())
    (test_cpuset / "cpuset.cpus").write_text(str(cpus[0]))
    child = test_cpuset / "child"
    child.mkdir()
    before = (read(child / "cpuset.cpus"), read(child / "cpuset.mems"))
    ref = CgroupRef(1, f"/{test_cpuset.name}/child", str(child))
    mems = cpulist.parse_list(read(CPUSET / "cpuset.mems"))
    with pytest.raises(EnforcementError) as err:
        apply_cpuset(ref, {cpus[1]}, mems, CGROUP_ROOT, UndoLog())
    msg = str(err.value)
    assert f"CPUs {cpus[1]} are not in the parent cgroup {test_cpuset}" in msg
    assert "subset of its parent" in msg
    assert (read(child / "cpuset.cpus"), read(child / "cpuset.mems")) == before


@pytest.mark.skipif(not (DEVICES / "devices.allow").exists(), reason="no v1 devices hierarchy")
def test_gpu_grant_in_real_devices_cgroup() -> None:
    d = DEVICES / f"numa-pin-test-{secrets.token_hex(4)}"
    d.mkdir()
    proc = subprocess.Popen(["sleep", "300"])
    try:
        (d / "devices.deny").write_text("a")
        (d / "cgroup.procs").write_text(str(proc.pid))
        assert read(d / "devices.list") == ""
        gpu = PciDevice(address="0000:3b:00.0", vendor="0x10de", device="0x2330",
                        pci_class="0x030200", numa_node=0, kind=KIND_GPU, gpu_minor=0)
        undo = UndoLog()
        grant = allow_device_rules(gpu_rules([gpu], "/proc"), proc.pid, "/proc", CGROUP_ROOT, detect_layout("/proc"), undo)
        listing = read(d / "devices.list").splitlines()
        assert "c 195:0 rwm" in listing and "c 195:255 rwm" in listing
        assert grant.cgroup_dir == str(d)
        assert undo.rollback() == ()
        assert read(d / "devices.list") == ""
    finally:
        proc.kill()
        proc.wait()
        os.rmdir(d)


@pytest.mark.skipif(len(cpulist.parse_list(
    (CPUSET / "cpuset.cpus").read_text() if (CPUSET / "cpuset.cpus").exists() else "0")) < 2,
    reason="needs two CPUs")
def test_shared_container_with_a_nested_cpuset_cgroup_is_shrunk_and_restored(test_cpuset: Path) -> None:
    """A shared container that made its own cpuset cgroup (a nested runtime copies the parent's
    CPUs into it, then runs its task there): the kernel refuses to shrink the parent alone
    (EBUSY); resize_shared shrinks the child first and the undo restores both."""
    all_cpus = online_cpus()
    mems = read(test_cpuset / "cpuset.mems")
    inner = test_cpuset / "nested"
    inner.mkdir()
    (inner / "cpuset.mems").write_text(mems)
    (inner / "cpuset.cpus").write_text(cpulist.format_list(all_cpus))
    proc = subprocess.Popen(["sleep", "300"])
    try:
        (inner / "cgroup.procs").write_text(str(proc.pid))
        with pytest.raises(OSError, match="busy"):  # the kernel's refusal the resize must get round
            (test_cpuset / "cpuset.cpus").write_text(str(min(all_cpus)))
        pool = frozenset({min(all_cpus)})
        undo = UndoLog()
        ref = CgroupRef(1, f"/{test_cpuset.name}", str(test_cpuset))
        result = resize_shared([ref], pool, CGROUP_ROOT, undo)
        assert result.blocked == () and result.updated == (ref,)
        assert cpus_allowed(proc.pid) == pool  # the kernel's view of the nested task
        assert cpulist.parse_list(read(test_cpuset / "cpuset.cpus")) == pool
        assert undo.rollback() == ()
        assert cpus_allowed(proc.pid) == all_cpus
        assert cpulist.parse_list(read(test_cpuset / "cpuset.cpus")) == all_cpus
        assert cpulist.parse_list(read(inner / "cpuset.cpus")) == all_cpus
    finally:
        proc.kill()
        proc.wait()


def test_held_handles_on_the_real_cpuset_hierarchy(confined: tuple[Path, int]) -> None:
    """The agent's spare holds shared containers' cpuset.cpus open: on cgroupfs the file is a
    kernel attribute (no tail to cut), a write through it moves the container's task (the
    kernel's Cpus_allowed_list), a nested cgroup made since sends the resize down the nested
    path (EBUSY through the handle too), and a removed cgroup refuses the handle (ENODEV)."""
    from numa_pin.enforcer import cgroups

    d, pid = confined
    all_cpus = online_cpus()
    pool = frozenset({min(all_cpus)})
    path = str(d / "cpuset.cpus")
    handles = cgroups.open_handles([path])
    try:
        assert [plain for _, plain in handles.values()] == [False]
        ref = CgroupRef(1, f"/{d.name}", str(d))
        undo = UndoLog()
        result = resize_shared([ref], pool, CGROUP_ROOT, undo, previous=all_cpus, leaves={str(d)}, handles=handles)
        assert result.updated == (ref,) and cpus_allowed(pid) == pool
        assert undo.rollback() == () and cpus_allowed(pid) == all_cpus
        inner = d / "nested"  # made after the spare saw a leaf
        inner.mkdir()
        (inner / "cpuset.mems").write_text(read(d / "cpuset.mems"))
        (inner / "cpuset.cpus").write_text(cpulist.format_list(all_cpus))
        result = resize_shared([ref], pool, CGROUP_ROOT, UndoLog(), previous=all_cpus, leaves={str(d)},
                               handles=handles)
        assert result.updated == (ref,) and result.blocked == ()
        assert cpulist.parse_list(read(inner / "cpuset.cpus")) == pool == cpus_allowed(pid)
        inner.rmdir()
    finally:
        cgroups.close_handles(handles)
    gone = d / "gone"
    gone.mkdir()
    (gone / "cpuset.mems").write_text(read(d / "cpuset.mems"))
    (gone / "cpuset.cpus").write_text(cpulist.format_list(pool))
    handles = cgroups.open_handles([str(gone / "cpuset.cpus")])
    try:
        gone.rmdir()
        ((fd, plain),) = handles.values()
        assert not cgroups.write_cgroup_handle(fd, b"0\n", plain)
    finally:
        cgroups.close_handles(handles)
