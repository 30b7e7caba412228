"""Whose cgroup is the state's pid in? Paths as runc, crun, podman, containerd and CRI-O name them.

Expected values follow the runtimes' documented naming (runc's ``libcontainer/specconv``:
``slice:prefix:name`` becomes ``<slice>/<prefix>-<name>.scope``; a cgroupfs ``cgroupsPath`` is
the path itself; without one the leaf is the container id), not numa-pin's output.
"""

from __future__ import annotations

import pytest

from numa_pin.enforcer.cgroups import CgroupRef
from numa_pin.enforcer.owner import ContainerCgroup, check_container_cgroup, path_matches
from numa_pin.errors import EnforcementError

KUBE_SLICE = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"

CASES = [
    ("runc-systemd", "/system.slice/runc-abc.scope", "system.slice:runc:abc", True),
    ("podman-systemd", "/machine.slice/libpod-abc.scope", "machine.slice:libpod:abc", True),
    ("containerd-systemd", f"{KUBE_SLICE}/cri-containerd-abc.scope", "kubepods-burstable-pod1.slice:cri-containerd:abc",
     True),
    ("crio-systemd", f"{KUBE_SLICE}/crio-abc.scope", "kubepods-burstable-pod1.slice:crio:abc", True),
    ("systemd-no-prefix", "/system.slice/abc.scope", "system.slice::abc", True),
    ("systemd-slice-name", "/system.slice/abc.slice", "system.slice::abc.slice", True),
    ("systemd-other-slice", "/user.slice/runc-abc.scope", "system.slice:runc:abc", False),
    ("systemd-other-unit", "/system.slice/runc-xyz.scope", "system.slice:runc:abc", False),
    ("session-process", "/user.slice/user-0.slice/session-3.scope", "system.slice:runc:abc", False),
    ("cgroupfs-absolute", "/libpod_parent/libpod-abc", "/libpod_parent/libpod-abc", True),
    ("cgroupfs-kube", "/kubepods/burstable/pod1/abc", "/kubepods/burstable/pod1/abc", True),
    ("cgroupfs-sibling", "/kubepods/burstable/pod1/xyz", "/kubepods/burstable/pod1/abc", False),
    ("cgroupfs-parent", "/kubepods/burstable/pod1", "/kubepods/burstable/pod1/abc", False),
    ("cgroupfs-relative", "/user.slice/session-3.scope/x/abc", "x/abc", True),
    ("no-path-bare-id", "/user.slice/session-3.scope/abc", None, True),
    ("no-path-runc-scope", "/system.slice/runc-abc.scope", None, True),
    ("no-path-libpod", "/machine.slice/libpod-abc.scope", None, True),
    ("no-path-other", "/user.slice/session-3.scope", None, False),
    ("no-path-prefix-of-id", "/ab", None, False),
    ("root", "/", None, False),
    ("root-with-path", "/", "/", False),
]


@pytest.mark.parametrize("path, cgroups_path, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_path_matches(path, cgroups_path, expected):
    assert path_matches(path, ContainerCgroup("abc", cgroups_path)) is expected


def ref(rel: str, pid_rel: str | None = None) -> CgroupRef:
    return CgroupRef(2, rel, "/sys/fs/cgroup" + rel, pid_rel if pid_rel is not None else rel)


def test_crun_container_subgroup_is_the_scopes():
    r = ref("/machine.slice/libpod-abc.scope", "/machine.slice/libpod-abc.scope/container")
    check_container_cgroup(r, ContainerCgroup("abc", "machine.slice:libpod:abc"), 7, "proc/7/cgroup")
    check_container_cgroup(r, ContainerCgroup("abc"), 7, "proc/7/cgroup")


def test_root_cgroup_is_refused_even_without_expectations():
    with pytest.raises(EnforcementError, match=r"^proc/7/cgroup: pid 7 is in the root cgroup; numa-pin never "
                                               r"writes the root of a hierarchy$"):
        check_container_cgroup(ref("/"), None, 7, "proc/7/cgroup")


def test_foreign_cgroup_names_both_sides():
    with pytest.raises(EnforcementError) as err:
        check_container_cgroup(ref("/user.slice/session-3.scope"), ContainerCgroup("abc", "system.slice:runc:abc"), 7,
                               "proc/7/cgroup")
    assert str(err.value) == (
        "proc/7/cgroup: pid 7 is in cgroup /user.slice/session-3.scope, which is not container abc's "
        "(linux.cgroupsPath 'system.slice:runc:abc'); refusing to pin another process"
    )
