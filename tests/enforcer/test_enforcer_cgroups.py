"""cgroup layout detection, /proc/<pid>/cgroup parsing, and escape-proof path joins."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from enforcer_fakes import MOUNTINFO_HYBRID, MOUNTINFO_V1, MOUNTINFO_V2, FakeProc, write

from numa_pin.enforcer import cgroups
from numa_pin.enforcer.cgroups import CgroupRef, enforcement_path, find_cgroup, safe_join
from numa_pin.enforcer.mounts import detect_layout, layout_from_mounts, parse_mountinfo
from numa_pin.errors import CgroupEscapeError, EnforcementError

HYBRID_CPUSET_ON_UNIFIED = (
    "26 25 0:22 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
    "30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    "27 25 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n"
)
V1_COMOUNTED = "29 25 0:25 / /sys/fs/cgroup/cpu,cpuset rw - cgroup cgroup rw,cpu,cpuset\n"
V1_ESCAPED_SPACE = "29 25 0:25 / /sys/fs/cgroup/my\\040cpuset rw - cgroup cgroup rw,cpuset\n"
V2_BIND_FIRST = (
    "40 30 0:26 /system.slice /mnt/cg rw - cgroup2 cgroup2 rw\n"
    "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
)
V1_SUBTREE_MOUNT = "29 25 0:25 /docker/abc /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"


# ---- detect_layout ------------------------------------------------------------------
@pytest.mark.parametrize(
    "mountinfo, mode, cpuset_mount, cpuset_version, unified",
    [
        (MOUNTINFO_V2, "v2", "/sys/fs/cgroup", 2, "/sys/fs/cgroup"),
        (MOUNTINFO_V1, "v1", "/sys/fs/cgroup/cpuset", 1, None),
        (MOUNTINFO_HYBRID, "hybrid", "/sys/fs/cgroup/cpuset", 1, "/sys/fs/cgroup/unified"),
        (HYBRID_CPUSET_ON_UNIFIED, "hybrid", "/sys/fs/cgroup/unified", 2,
         "/sys/fs/cgroup/unified"),
        (V1_COMOUNTED, "v1", "/sys/fs/cgroup/cpu,cpuset", 1, None),
        (V1_ESCAPED_SPACE, "v1", "/sys/fs/cgroup/my cpuset", 1, None),
        (V2_BIND_FIRST, "v2", "/sys/fs/cgroup", 2, "/sys/fs/cgroup"),
    ],
    ids=["v2", "v1", "hybrid", "hybrid-cpuset-on-unified", "v1-comounted", "octal-escape",
         "v2-bind-mount-listed-first"],
)
def test_detect_layout(fake_proc: FakeProc, mountinfo: str, mode: str, cpuset_mount: str,
                       cpuset_version: int, unified: str | None) -> None:
    fake_proc.add_pid(42, "0::/\n", mountinfo)
    layout = detect_layout(fake_proc.root, 42)
    assert (layout.mode, layout.cpuset_mount, layout.cpuset_version, layout.unified_mount) == (
        mode, cpuset_mount, cpuset_version, unified)
    assert layout.source == str(fake_proc.root / "42" / "mountinfo")


@pytest.mark.parametrize(
    "text, match",
    [
        ("garbage line\n", "not a mountinfo line"),
        ("1 2 3:4 / /x rw -\n", "truncated"),
        ("22 27 0:21 / /proc rw - proc proc rw\n", "no cgroup"),
        ("", "no cgroup"),
    ],
    ids=["no-separator", "truncated", "no-cgroup-mounts", "empty"],
)
def test_detect_layout_rejects(fake_proc: FakeProc, text: str, match: str) -> None:
    fake_proc.add_pid("self", "0::/\n", text)
    with pytest.raises(EnforcementError, match=match) as err:
        detect_layout(fake_proc.root)
    assert err.value.path == str(fake_proc.root / "self" / "mountinfo")


def test_detect_layout_missing_file_names_it(fake_proc: FakeProc) -> None:
    with pytest.raises(EnforcementError) as err:
        detect_layout(fake_proc.root, 999)
    assert err.value.path == str(fake_proc.root / "999" / "mountinfo")


def test_controllers_ignore_flags_and_named_hierarchies() -> None:
    mounts = parse_mountinfo(MOUNTINFO_HYBRID)
    by_point = {m.mount_point: m.controllers for m in mounts}
    assert by_point["/sys/fs/cgroup/systemd"] == frozenset()
    assert by_point["/sys/fs/cgroup/cpu,cpuacct"] == {"cpu", "cpuacct"}
    assert by_point["/sys/fs/cgroup/unified"] == frozenset()
    assert layout_from_mounts(mounts).v1_mount("devices").mount_point == "/sys/fs/cgroup/devices"


# ---- find_cgroup --------------------------------------------------------------------
CASES = [
    # id, mountinfo, /proc/<pid>/cgroup, rel_path, dir below cgroup root, driver, pid rel
    ("v2-systemd-runc", MOUNTINFO_V2, "0::/system.slice/runc-abc123.scope\n",
     "/system.slice/runc-abc123.scope", "system.slice/runc-abc123.scope", "systemd", None),
    ("v2-systemd-podman", MOUNTINFO_V2, "0::/machine.slice/libpod-abc123.scope\n",
     "/machine.slice/libpod-abc123.scope", "machine.slice/libpod-abc123.scope", "systemd",
     None),
    ("v2-crun-container-leaf", MOUNTINFO_V2, "0::/machine.slice/libpod-abc123.scope/container\n",
     "/machine.slice/libpod-abc123.scope", "machine.slice/libpod-abc123.scope", "systemd",
     "/machine.slice/libpod-abc123.scope/container"),
    ("v2-kubepods-containerd", MOUNTINFO_V2,
     "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b.slice/"
     "cri-containerd-abc123.scope\n",
     "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b.slice/"
     "cri-containerd-abc123.scope",
     "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b.slice/"
     "cri-containerd-abc123.scope", "systemd", None),
    ("v2-kubepods-crio-crun-leaf", MOUNTINFO_V2,
     "0::/kubepods.slice/kubepods-pod9.slice/crio-abc123.scope/container\n",
     "/kubepods.slice/kubepods-pod9.slice/crio-abc123.scope",
     "kubepods.slice/kubepods-pod9.slice/crio-abc123.scope", "systemd",
     "/kubepods.slice/kubepods-pod9.slice/crio-abc123.scope/container"),
    ("v2-cgroupfs-runc", MOUNTINFO_V2, "0::/runc/abc123\n", "/runc/abc123", "runc/abc123",
     "cgroupfs", None),
    ("v2-cgroupfs-libpod", MOUNTINFO_V2, "0::/libpod_parent/libpod-abc123\n",
     "/libpod_parent/libpod-abc123", "libpod_parent/libpod-abc123", "cgroupfs", None),
    ("v2-cgroupfs-bare-id", MOUNTINFO_V2, "0::/abc123\n", "/abc123", "abc123", "cgroupfs", None),
    ("v2-container-leaf-not-under-scope-kept", MOUNTINFO_V2, "0::/runc/container\n",
     "/runc/container", "runc/container", "cgroupfs", None),
    ("v1-systemd-runc", MOUNTINFO_V1,
     "5:devices:/system.slice/runc-abc123.scope\n3:cpuset:/system.slice/runc-abc123.scope\n"
     "1:name=systemd:/system.slice/runc-abc123.scope\n",
     "/system.slice/runc-abc123.scope", "cpuset/system.slice/runc-abc123.scope", "systemd",
     None),
    ("v1-cgroupfs-libpod", MOUNTINFO_V1, "3:cpuset:/libpod_parent/libpod-abc123\n",
     "/libpod_parent/libpod-abc123", "cpuset/libpod_parent/libpod-abc123", "cgroupfs", None),
    ("v1-container-leaf-kept", MOUNTINFO_V1,
     "3:cpuset:/machine.slice/libpod-abc123.scope/container\n",
     "/machine.slice/libpod-abc123.scope/container",
     "cpuset/machine.slice/libpod-abc123.scope/container", "systemd", None),
    ("v1-comounted", V1_COMOUNTED, "4:cpu,cpuset:/runc/abc123\n", "/runc/abc123",
     "cpu,cpuset/runc/abc123", "cgroupfs", None),
    ("hybrid-uses-cpuset-line", MOUNTINFO_HYBRID,
     "9:name=systemd:/user.slice\n3:cpuset:/runc/abc123\n0::/user.slice/session-1.scope\n",
     "/runc/abc123", "cpuset/runc/abc123", "cgroupfs", None),
    ("hybrid-cpuset-on-unified", HYBRID_CPUSET_ON_UNIFIED,
     "2:cpu,cpuacct:/x\n0::/machine.slice/libpod-abc123.scope/container\n",
     "/machine.slice/libpod-abc123.scope", "unified/machine.slice/libpod-abc123.scope",
     "systemd", "/machine.slice/libpod-abc123.scope/container"),
    ("v1-mounted-subtree-stripped", V1_SUBTREE_MOUNT, "3:cpuset:/docker/abc/inner\n", "/inner",
     "cpuset/inner", "cgroupfs", None),
    ("root-cgroup", MOUNTINFO_V2, "0::/\n", "/", "", "cgroupfs", None),
]


@pytest.mark.parametrize("mountinfo, proc_cgroup, rel, subdir, driver, pid_rel",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_find_cgroup(fake_proc: FakeProc, cgroup_root: Path, mountinfo: str, proc_cgroup: str,
                     rel: str, subdir: str, driver: str, pid_rel: str | None) -> None:
    fake_proc.add_pid(4242, proc_cgroup, mountinfo)
    layout = detect_layout(fake_proc.root, 4242)
    ref = find_cgroup(4242, fake_proc.root, cgroup_root, layout)
    assert ref.rel_path == rel
    assert ref.cpuset_dir == (os.path.join(str(cgroup_root), subdir) if subdir
                              else str(cgroup_root))
    assert ref.driver == driver
    assert ref.pid_rel_path == (pid_rel or rel)
    assert ref.version == layout.cpuset_version
    # the hierarchy root is the cgroup root plus the hierarchy sub-directory only
    own_hierarchy_dir = ref.version == 1 or subdir.startswith("unified")
    expected_root = str(cgroup_root / subdir.split("/")[0]) if own_hierarchy_dir else str(
        cgroup_root)
    assert ref.hierarchy_root == expected_root


@pytest.mark.parametrize(
    "rel, expected",
    [
        ("/system.slice/runc-abc.scope", "abc"),
        ("/machine.slice/libpod-abc.scope", "abc"),
        ("/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope", "abc"),
        ("/crio/crio-abc", "abc"),
        ("/runc/abc", "abc"),
        ("/abc", "abc"),
        ("/kubepods.slice/kubepods-pod1.slice", None),
        ("/", None),
    ],
    ids=["runc-scope", "libpod-scope", "containerd-scope", "crio-cgroupfs", "runc-cgroupfs",
         "bare", "slice", "root"],
)
def test_container_id(rel: str, expected: str | None) -> None:
    assert CgroupRef(2, rel, "/x" + rel).container_id == expected


@pytest.mark.parametrize(
    "rel, version, expected",
    [
        ("/a.slice/b.scope/container", 2, "/a.slice/b.scope"),
        ("/a.slice/b.scope/container", 1, "/a.slice/b.scope/container"),
        ("/a.slice/b.scope/other", 2, "/a.slice/b.scope/other"),
        ("/container", 2, "/container"),
        ("/a.slice/container", 2, "/a.slice/container"),
    ],
    ids=["v2-steps-out", "v1-untouched", "other-leaf", "top-level-container", "under-slice"],
)
def test_enforcement_path(rel: str, version: int, expected: str) -> None:
    assert enforcement_path(rel, version) == expected


@pytest.mark.parametrize(
    "proc_cgroup, mountinfo, match",
    [
        ("this is not a cgroup file\n", MOUNTINFO_V2, "not 'id:controllers:/path'"),
        ("x:cpuset:/a\n", MOUNTINFO_V1, "not 'id:controllers:/path'"),
        ("3:cpuset:relative/path\n", MOUNTINFO_V1, "not 'id:controllers:/path'"),
        ("", MOUNTINFO_V2, "empty"),
        ("3:cpuset:/a\n", MOUNTINFO_V2, r"no cgroup v2 line"),
        ("0::/a\n5:devices:/a\n", MOUNTINFO_V1, "no line for the v1 cpuset controller"),
    ],
    ids=["free-text", "non-numeric-id", "relative-path", "empty-file", "v2-line-missing",
         "cpuset-line-missing"],
)
def test_find_cgroup_garbage_names_file(fake_proc: FakeProc, cgroup_root: Path,
                                        proc_cgroup: str, mountinfo: str, match: str) -> None:
    fake_proc.add_pid(7, proc_cgroup, mountinfo)
    layout = detect_layout(fake_proc.root, 7)
    with pytest.raises(EnforcementError, match=match) as err:
        find_cgroup(7, fake_proc.root, cgroup_root, layout)
    assert err.value.path == str(fake_proc.root / "7" / "cgroup")


def test_find_cgroup_missing_pid(fake_proc: FakeProc, cgroup_root: Path) -> None:
    fake_proc.add_pid("self", "0::/\n", MOUNTINFO_V2)
    layout = detect_layout(fake_proc.root)
    with pytest.raises(EnforcementError, match="no such process 31337") as err:
        find_cgroup(31337, fake_proc.root, cgroup_root, layout)
    assert err.value.path == str(fake_proc.root / "31337" / "cgroup")
    assert not isinstance(err.value, CgroupEscapeError)


def test_find_cgroup_without_cpuset_hierarchy(fake_proc: FakeProc, cgroup_root: Path) -> None:
    only_cpu = "30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    fake_proc.add_pid(7, "2:cpu:/a\n", only_cpu)
    layout = detect_layout(fake_proc.root, 7)
    with pytest.raises(EnforcementError, match="cpuset controller"):
        find_cgroup(7, fake_proc.root, cgroup_root, layout)


# ---- escapes ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "proc_cgroup, mountinfo",
    [
        ("0::/../../etc\n", MOUNTINFO_V2),
        ("0::/system.slice/../../../etc\n", MOUNTINFO_V2),
        ("3:cpuset:/../devices/x\n", MOUNTINFO_V1),
    ],
    ids=["v2-dotdot", "v2-dotdot-inside", "v1-dotdot-into-other-hierarchy"],
)
def test_find_cgroup_rejects_dotdot(fake_proc: FakeProc, cgroup_root: Path, proc_cgroup: str,
                                    mountinfo: str) -> None:
    fake_proc.add_pid(7, proc_cgroup, mountinfo)
    with pytest.raises(CgroupEscapeError):
        find_cgroup(7, fake_proc.root, cgroup_root, detect_layout(fake_proc.root, 7))


def test_find_cgroup_rejects_symlink_escape(fake_proc: FakeProc, cgroup_root: Path,
                                            tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (cgroup_root / "system.slice").symlink_to(outside)
    fake_proc.add_pid(7, "0::/system.slice/runc-abc.scope\n", MOUNTINFO_V2)
    with pytest.raises(CgroupEscapeError, match="outside"):
        find_cgroup(7, fake_proc.root, cgroup_root, detect_layout(fake_proc.root, 7))


@pytest.mark.parametrize(
    "rel, expected",
    [
        ("a/b", "a/b"),
        ("/a/b", "a/b"),
        ("/etc/passwd", "etc/passwd"),
        ("a/./b//c", "a/b/c"),
        ("/", ""),
        ("inside-link/x", "inside-link/x"),
    ],
    ids=["relative", "cgroup-absolute", "absolute-anchored-not-escaping", "dots-and-slashes",
         "root", "symlink-staying-inside"],
)
def test_safe_join_accepts(tmp_path: Path, rel: str, expected: str) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "inside-link").symlink_to(root / "real")
    got = safe_join(root, rel)
    assert got == (os.path.join(str(root), expected) if expected else str(root))
    real_root = os.path.realpath(root)
    assert os.path.realpath(got).startswith(real_root)


@pytest.mark.parametrize(
    "rel",
    ["..", "../x", "a/../../x", "/a/b/../../../etc", "a/..", "out-link", "out-link/deeper",
     "abs-link/x", "nul\x00byte"],
    ids=["dotdot", "dotdot-prefix", "dotdot-inside", "absolute-dotdot", "dotdot-back-to-root",
         "symlink-out", "symlink-out-deeper", "absolute-symlink-out", "nul-byte"],
)
@pytest.mark.parametrize("memo", [False, True], ids=["no-memo", "memo-warm"])
def test_safe_join_rejects(tmp_path: Path, rel: str, memo: bool) -> None:
    """With a memo of real paths (one batch of checks, issue 21) too: its parent already
    resolved, a symlink at the leaf is still followed."""
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "out-link").symlink_to("../elsewhere")
    (root / "abs-link").symlink_to("/etc")
    real_dirs: dict[str, str] | None = None
    if memo:
        real_dirs = {}
        (root / "plain").mkdir()
        safe_join(root, "plain", real_dirs)  # the root and its real path are in the memo now
    with pytest.raises(CgroupEscapeError) as err:
        safe_join(root, rel, real_dirs)
    assert err.value.path == str(root)


def test_realpath_with_a_memo_agrees_with_os_realpath(tmp_path: Path) -> None:
    """One memo over a batch of paths through symlinked parents, symlinked leaves and missing
    leaves gives what ``os.path.realpath`` gives for each."""
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "link-to-a").symlink_to("a")
    (root / "a" / "leaf-link").symlink_to("../../elsewhere")
    (root / "a" / "b" / "dot-link").symlink_to(".")
    paths = [root / p for p in ("a", "a/b", "link-to-a", "link-to-a/b", "a/leaf-link", "link-to-a/leaf-link",
                                "a/missing", "link-to-a/missing", "a/b/dot-link", "a/b/dot-link/missing", "")]
    real_dirs: dict[str, str] = {}
    for path in paths * 2:  # the second round answers from the memo
        assert cgroups.realpath(str(path), real_dirs) == os.path.realpath(path), path


def test_safe_join_root_itself_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real-root"
    (real / "a").mkdir(parents=True)
    link = tmp_path / "link-root"
    link.symlink_to(real)
    assert safe_join(link, "/a") == str(link / "a")


# ---- file seam -----------------------------------------------------------------------
def test_write_cgroup_file_never_creates(tmp_path: Path) -> None:
    with pytest.raises(EnforcementError, match="cannot open") as err:
        cgroups.write_cgroup_file(str(tmp_path / "cpuset.cpus"), "0-1")
    assert err.value.path == str(tmp_path / "cpuset.cpus")
    assert not (tmp_path / "cpuset.cpus").exists()


def test_write_cgroup_file_replaces_with_newline(tmp_path: Path) -> None:
    f = tmp_path / "cpuset.cpus"
    write(f, "0-15\n")
    cgroups.write_cgroup_file(str(f), "3")
    assert f.read_text() == "3\n"
    assert cgroups.read_cgroup_file(str(f)) == "3"


def test_read_cgroup_file_missing_names_it(tmp_path: Path) -> None:
    with pytest.raises(EnforcementError) as err:
        cgroups.read_cgroup_file(str(tmp_path / "nope"))
    assert err.value.path == str(tmp_path / "nope")


@pytest.mark.parametrize(
    "mountinfo, rel, subdir, version",
    [
        (MOUNTINFO_V2, "/system.slice/runc-a.scope", "system.slice/runc-a.scope", 2),
        (MOUNTINFO_V1, "/runc/a", "cpuset/runc/a", 1),
        (MOUNTINFO_V2, "machine.slice/libpod-a.scope/container",
         "machine.slice/libpod-a.scope/container", 2),
    ],
    ids=["v2", "v1", "no-step-out-and-anchored"],
)
def test_ref_from_path(fake_proc: FakeProc, cgroup_root: Path, mountinfo: str, rel: str,
                       subdir: str, version: int) -> None:
    fake_proc.add_pid("self", "0::/\n", mountinfo)
    ref = cgroups.ref_from_path(rel, cgroup_root, detect_layout(fake_proc.root))
    assert ref.cpuset_dir == str(cgroup_root / subdir)
    assert ref.version == version
    assert ref.rel_path == "/" + rel.strip("/")
    with pytest.raises(CgroupEscapeError):
        cgroups.ref_from_path("/../x", cgroup_root, detect_layout(fake_proc.root))
