"""GPU device grants on fake v1 trees and fake v2 device programs, /proc/devices, the GPU list file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from enforcer_fakes import (
    MOUNTINFO_HYBRID,
    MOUNTINFO_V1,
    MOUNTINFO_V2,
    FakeCgroupTree,
    FakeLibbpf,
    FakeProc,
    snapshot,
)

from numa_pin.devices.devfilter import DeviceRule, Insn, carried_rules, encode
from numa_pin.enforcer import cgroups
from numa_pin.enforcer.gpu import (
    allow_device_rules,
    expose_gpu_env_file,
    gpu_rules,
    nvidia_rules,
    oci_allows,
    oci_rules_from_config,
    parse_char_majors,
    revoke_device_rules,
)
from numa_pin.enforcer.mounts import detect_layout
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError
from numa_pin.topology.model import KIND_GPU, PciDevice

PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
236 nvidia-uvm
237 nvidia-caps
254 gpiochip

Block devices:
  7 loop
236 not-a-char-device
"""


def gpu(addr: str, minor: int | None) -> PciDevice:
    return PciDevice(address=addr, vendor="0x10de", device="0x2330", pci_class="0x030200",
                     numa_node=0, kind=KIND_GPU, gpu_minor=minor, gpu_uuid=f"GPU-{addr}")


GPU0 = gpu("0000:3b:00.0", 0)
GPU3 = gpu("0000:d8:00.0", 3)


# ---- pure helpers --------------------------------------------------------------------
def test_parse_char_majors_only_reads_character_section() -> None:
    majors = parse_char_majors(PROC_DEVICES)
    assert majors["nvidia-uvm"] == 236
    assert majors["nvidia-frontend"] == 195
    assert "loop" not in majors and "not-a-char-device" not in majors


@pytest.mark.parametrize(
    "minors, uvm, expected",
    [
        ([0], 236, ["c 195:0 rwm", "c 195:255 rwm", "c 236:0 rwm", "c 236:1 rwm"]),
        ([3, 0, 3], 236, ["c 195:0 rwm", "c 195:3 rwm", "c 195:255 rwm", "c 236:0 rwm",
                          "c 236:1 rwm"]),
        ([1], None, ["c 195:1 rwm", "c 195:255 rwm"]),
    ],
    ids=["one-gpu", "two-gpus-deduplicated", "uvm-not-loaded"],
)
def test_nvidia_rules(minors, uvm, expected) -> None:
    assert [str(r) for r in nvidia_rules(minors, uvm)] == expected


@pytest.mark.parametrize(
    "have, want, covered",
    [
        ("a *:* rwm", "c 195:0 rwm", True),
        ("c *:* rwm", "c 195:0 rwm", True),
        ("c 195:* rwm", "c 195:0 rwm", True),
        ("c 195:0 rw", "c 195:0 rwm", False),
        ("c 195:1 rwm", "c 195:0 rwm", False),
        ("b 195:0 rwm", "c 195:0 rwm", False),
        ("a", "c 1:3 r", True),
    ],
    ids=["allow-all", "all-char", "major-wildcard", "missing-mknod", "other-minor",
         "block-not-char", "bare-a"],
)
def test_device_rule_covers(have: str, want: str, covered: bool) -> None:
    assert DeviceRule.parse(have).covers(DeviceRule.parse(want)) is covered


@pytest.mark.parametrize("text", ["", "x 1:2 rw", "c 1-2 rw", "c 1:2 rwx", "c a:2 r", "c 1:2"],
                         ids=["empty", "bad-type", "no-colon", "bad-access", "bad-major",
                              "no-access"])
def test_device_rule_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        DeviceRule.parse(text)


DENY_ALL = {"allow": False, "access": "rwm"}


@pytest.mark.parametrize(
    "config, allowed",
    [
        ({"linux": {"resources": {"devices": [DENY_ALL]}}}, False),
        ({"linux": {"resources": {"devices": [
            DENY_ALL, {"allow": True, "type": "c", "major": 195, "access": "rwm"},
            {"allow": True, "type": "c", "major": 236, "access": "rwm"}]}}}, True),
        ({"linux": {"resources": {"devices": [
            DENY_ALL, {"allow": True, "type": "c", "major": 195, "access": "rw"},
            {"allow": True, "type": "c", "major": 236, "access": "rwm"}]}}}, False),
        ({"linux": {"resources": {"devices": [
            DENY_ALL, {"allow": True, "type": "c", "major": 195, "access": "rwm"},
            {"allow": True, "type": "c", "major": 236, "access": "rwm"},
            {"allow": False, "type": "c", "major": 195, "minor": 0, "access": "rwm"}]}}}, False),
        ({"linux": {"resources": {"devices": [DENY_ALL]},
                    "devices": [
                        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
                        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
                        {"path": "/dev/nvidia-uvm", "type": "c", "major": 236, "minor": 0},
                        {"path": "/dev/nvidia-uvm-tools", "type": "u", "major": 236,
                         "minor": 1}]}}, True),
        ({"linux": {"resources": {"devices": [{"allow": True, "access": "rwm"}]}}}, True),
        ({}, False),
    ],
    ids=["deny-all", "allow-majors", "missing-mknod", "later-deny-wins", "linux-devices-grant",
         "privileged-allow-all", "no-rules-means-deny"],
)
def test_oci_allows(config, allowed: bool) -> None:
    rules = oci_rules_from_config(config)
    wanted = nvidia_rules([0], 236)
    assert all(oci_allows(rules, r) for r in wanted) is allowed


def test_oci_rules_malformed() -> None:
    with pytest.raises(EnforcementError, match="malformed"):
        oci_rules_from_config({"linux": {"resources": {"devices": [{"type": "c"}]}}})


# ---- cgroup v1 grants ----------------------------------------------------------------
def setup_v1(fake_proc: FakeProc, cgroup_root: Path, listing: str,
             mountinfo: str = MOUNTINFO_V1) -> tuple[Path, FakeCgroupTree]:
    tree = FakeCgroupTree(cgroup_root, 1)
    fake_proc.set_devices(PROC_DEVICES)
    fake_proc.add_pid(77, "5:devices:/system.slice/runc-abc.scope\n"
                          "3:cpuset:/system.slice/runc-abc.scope\n", mountinfo)
    return tree.devices_cg("/system.slice/runc-abc.scope", listing), tree


@pytest.mark.parametrize("mountinfo", [MOUNTINFO_V1, MOUNTINFO_HYBRID], ids=["v1", "hybrid"])
def test_grant_v1_appends_rules_and_undo_denies(fake_proc: FakeProc, cgroup_root: Path,
                                                kernel_factory, mountinfo: str) -> None:
    devdir, tree = setup_v1(fake_proc, cgroup_root, "c 1:3 rwm", mountinfo)
    kernel = kernel_factory(tree)
    before = snapshot(cgroup_root)
    undo = UndoLog()
    grant = allow_device_rules(gpu_rules([GPU0, GPU3], fake_proc.root), 77, fake_proc.root, cgroup_root,
                       detect_layout(fake_proc.root, 77), undo)
    assert grant.version == 1 and grant.verified
    assert grant.cgroup_dir == str(devdir)
    allowed = [t for p, t in kernel.writes if p.endswith("devices.allow")]
    assert allowed == ["c 195:0 rwm", "c 195:3 rwm", "c 195:255 rwm", "c 236:0 rwm",
                       "c 236:1 rwm"]
    assert [str(r) for r in grant.added] == allowed
    listing = (devdir / "devices.list").read_text().splitlines()
    assert "c 1:3 rwm" in listing and "c 195:3 rwm" in listing
    assert len(undo) == 5
    assert undo.rollback() == ()
    denied = [t for p, t in kernel.writes if p.endswith("devices.deny")]
    assert denied == list(reversed(allowed))
    assert snapshot(cgroup_root) == before


def test_grant_v1_skips_rules_already_covered(fake_proc: FakeProc, cgroup_root: Path,
                                              kernel_factory) -> None:
    _, tree = setup_v1(fake_proc, cgroup_root, "c 195:* rwm")
    kernel = kernel_factory(tree)
    undo = UndoLog()
    grant = allow_device_rules(gpu_rules([GPU0], fake_proc.root), 77, fake_proc.root, cgroup_root,
                       detect_layout(fake_proc.root, 77), undo)
    assert [t for _, t in kernel.writes] == ["c 236:0 rwm", "c 236:1 rwm"]
    assert [str(r) for r in grant.added] == ["c 236:0 rwm", "c 236:1 rwm"]
    assert len(undo) == 2


def test_grant_v1_allow_all_cgroup_writes_nothing(fake_proc: FakeProc, cgroup_root: Path,
                                                  kernel_factory) -> None:
    _, tree = setup_v1(fake_proc, cgroup_root, "a *:* rwm")
    kernel = kernel_factory(tree)
    grant = allow_device_rules(gpu_rules([GPU0], fake_proc.root), 77, fake_proc.root, cgroup_root,
                       detect_layout(fake_proc.root, 77), UndoLog())
    assert kernel.writes == [] and grant.added == ()


def test_grant_v1_refused_rolls_back(fake_proc: FakeProc, cgroup_root: Path,
                                     kernel_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    devdir, tree = setup_v1(fake_proc, cgroup_root, "")
    kernel = kernel_factory(tree)
    before = snapshot(cgroup_root)
    real = kernel.__call__

    def refuse_uvm(path: str, text: str) -> None:
        if text.startswith("c 236:"):
            raise EnforcementError(f"writing {text!r} failed: Operation not permitted", path=path)
        real(path, text)

    monkeypatch.setattr(cgroups, "write_cgroup_file", refuse_uvm)
    undo = UndoLog()
    with pytest.raises(EnforcementError, match="Operation not permitted") as err:
        allow_device_rules(gpu_rules([GPU0], fake_proc.root), 77, fake_proc.root, cgroup_root,
                   detect_layout(fake_proc.root, 77), undo)
    assert err.value.path == str(devdir)
    assert "rollback complete" in str(err.value)
    assert snapshot(cgroup_root) == before
    assert len(undo) == 0


def test_grant_without_minor(fake_proc: FakeProc, cgroup_root: Path) -> None:
    setup_v1(fake_proc, cgroup_root, "")
    with pytest.raises(EnforcementError, match="0000:af:00.0 has no device minor"):
        allow_device_rules(gpu_rules([gpu("0000:af:00.0", None)], fake_proc.root), 77, fake_proc.root, cgroup_root,
                   detect_layout(fake_proc.root, 77), UndoLog())


def test_grant_missing_proc_devices_names_it(fake_proc: FakeProc, cgroup_root: Path) -> None:
    fake_proc.add_pid(77, "0::/x\n", MOUNTINFO_V2)
    with pytest.raises(EnforcementError) as err:
        allow_device_rules(gpu_rules([GPU0], fake_proc.root), 77, fake_proc.root, cgroup_root, detect_layout(fake_proc.root, 77),
                   UndoLog())
    assert err.value.path == str(fake_proc.root / "devices")


# ---- cgroup v2 -----------------------------------------------------------------------
#: a deny-by-default device program, as a runtime attaches
RUNTIME_PROG = encode([Insn(0xB7, 0, imm=0), Insn(0x95)])
ALL_GRANTED = {"linux": {"resources": {"devices": [
    DENY_ALL, {"allow": True, "type": "c", "major": 195, "access": "rwm"},
    {"allow": True, "type": "c", "major": 236, "access": "rwm"}]}}}
UVM_MISSING = {"linux": {"resources": {"devices": [
    DENY_ALL, {"allow": True, "type": "c", "major": 195, "access": "rwm"}]}}}


@pytest.fixture
def v2_container(fake_proc: FakeProc, cgroup_root: Path, monkeypatch: pytest.MonkeyPatch):
    """crun + systemd on v2: the pid in ``<scope>/container``, a device program on each."""
    from numa_pin.enforcer import bpfdev

    FakeCgroupTree(cgroup_root, 2)
    fake_proc.set_devices(PROC_DEVICES)
    fake_proc.add_pid(77, "0::/machine.slice/libpod-abc.scope/container\n", MOUNTINFO_V2)
    scope = cgroup_root / "machine.slice" / "libpod-abc.scope"
    (scope / "container").mkdir(parents=True, exist_ok=True)
    lib = FakeLibbpf()
    lib.attach(scope, RUNTIME_PROG)
    lib.attach(scope / "container", RUNTIME_PROG)
    monkeypatch.setattr(bpfdev, "_LIB", lib)
    return lib, scope, detect_layout(fake_proc.root, 77)


def test_grant_v2_extends_every_device_program_and_undo_restores_them(
        fake_proc: FakeProc, cgroup_root: Path, v2_container) -> None:
    lib, scope, layout = v2_container
    undo = UndoLog()
    grant = allow_device_rules(gpu_rules([GPU0], fake_proc.root), 77, fake_proc.root, cgroup_root, layout, undo)
    wanted = (DeviceRule("c", 195, 0), DeviceRule("c", 195, 255), DeviceRule("c", 236, 0), DeviceRule("c", 236, 1))
    assert grant.version == 2 and grant.verified and grant.cgroup_dir == str(scope)
    assert grant.bpf_dirs == (str(scope / "container"), str(scope))
    assert [str(r) for r in grant.added] == [str(w) for w in wanted]
    for d in grant.bpf_dirs:
        assert [carried_rules(p) for p in lib.on(d)] == [wanted]
    assert len(undo) == 2 and undo.rollback() == ()
    assert lib.on(scope) == [RUNTIME_PROG] and lib.on(scope / "container") == [RUNTIME_PROG]


def test_revoke_takes_the_recorded_rules_out(fake_proc: FakeProc, cgroup_root: Path, v2_container) -> None:
    lib, scope, layout = v2_container
    grant = allow_device_rules(gpu_rules([GPU0], fake_proc.root), 77, fake_proc.root, cgroup_root, layout, UndoLog())
    revoke_device_rules([str(r) for r in grant.added], grant.bpf_dirs)
    assert lib.on(scope) == [RUNTIME_PROG] and lib.on(scope / "container") == [RUNTIME_PROG]
    revoke_device_rules([str(r) for r in grant.added], grant.bpf_dirs)  # idempotent


def test_grant_v2_failure_on_the_second_cgroup_rolls_back_the_first(
        fake_proc: FakeProc, cgroup_root: Path, v2_container) -> None:
    lib, scope, layout = v2_container
    lib.fail["load"], lib.fail_after["load"] = errno.EPERM, 1
    undo = UndoLog()
    with pytest.raises(EnforcementError) as err:
        allow_device_rules(gpu_rules([GPU0], fake_proc.root), 77, fake_proc.root, cgroup_root, layout, undo)
    assert err.value.errno == errno.EPERM and err.value.path == str(scope)
    assert "granting GPUs failed" in str(err.value) and "rollback complete" in str(err.value)
    assert lib.on(scope) == [RUNTIME_PROG] and lib.on(scope / "container") == [RUNTIME_PROG]
    assert len(undo) == 0


@pytest.mark.parametrize("config, changed", [(None, True), (UVM_MISSING, True), (ALL_GRANTED, False)],
                         ids=["no-rules-given", "uvm-missing", "all-granted"])
def test_grant_v2_leaves_programs_alone_when_the_runtime_grants_already(
        fake_proc: FakeProc, cgroup_root: Path, v2_container, kernel_factory, config, changed: bool) -> None:
    lib, scope, layout = v2_container
    kernel = kernel_factory(FakeCgroupTree(cgroup_root, 2))
    rules = oci_rules_from_config(config) if config is not None else None
    grant = allow_device_rules(gpu_rules([GPU0], fake_proc.root), 77, fake_proc.root, cgroup_root, layout, UndoLog(), oci_rules=rules)
    assert grant.version == 2 and grant.verified
    assert (lib.on(scope) != [RUNTIME_PROG]) is changed and bool(grant.added) is changed
    assert kernel.writes == [], "no cgroup file is written on v2"


# ---- GPU list file -------------------------------------------------------------------
def test_expose_gpu_env_file(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    undo = UndoLog()
    path = expose_gpu_env_file(rootfs, ["GPU-aaa", "GPU-bbb"], undo)
    assert path == str(rootfs / "run" / "numa-pin" / "gpus")
    assert Path(path).read_text() == "GPU-aaa\nGPU-bbb\n"
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    # replacing is atomic and leaves no temporary behind
    expose_gpu_env_file(rootfs, ["GPU-ccc"])
    assert Path(path).read_text() == "GPU-ccc\n"
    assert sorted(os.listdir(rootfs / "run" / "numa-pin")) == ["gpus"]
    assert undo.rollback() == ()
    assert not (rootfs / "run").exists()


@pytest.mark.parametrize(
    "setup, relpath",
    [
        ("run-symlink-out", "run/numa-pin/gpus"),
        ("none", "../escape/gpus"),
        ("file-symlink-out", "run/numa-pin/gpus"),
    ],
    ids=["dir-symlink-out", "dotdot", "file-symlink-out"],
)
def test_expose_gpu_env_file_refuses_escape(tmp_path: Path, setup: str, relpath: str) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    outside = tmp_path / "host"
    outside.mkdir()
    if setup == "run-symlink-out":
        (rootfs / "run").symlink_to(outside)
    elif setup == "file-symlink-out":
        (rootfs / "run" / "numa-pin").mkdir(parents=True)
        (rootfs / "run" / "numa-pin" / "gpus").symlink_to(outside / "gpus")
    with pytest.raises(EnforcementError):
        expose_gpu_env_file(rootfs, ["GPU-aaa"], relpath=relpath)
    assert os.listdir(outside) == []
