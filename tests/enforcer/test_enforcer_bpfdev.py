"""cgroup v2 device programs: numa-pin's replace-with-prologue, on a fake libbpf and on this kernel.

The fake (:class:`enforcer_fakes.FakeLibbpf`) checks the walk: every attached program is
treated, failures name the cgroup and errno, and a failure part-way puts back what was replaced.
The real tests attach a runtime-like deny-by-default program to a cgroup of this machine's
cgroup2 hierarchy (``/sys/fs/cgroup/unified`` on a hybrid host) and let the kernel answer: a
process in that cgroup opens ``/dev/kmsg`` (1:11, which the program does not allow) or not.
"""

from __future__ import annotations

import errno
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from enforcer_fakes import FakeLibbpf

from numa_pin.devices.devfilter import DeviceRule, Insn, carried_rules, encode
from numa_pin.enforcer import bpfdev
from numa_pin.errors import EnforcementError

KMSG = DeviceRule("c", 1, 11)
GPU0 = DeviceRule("c", 195, 0)

#: deny by default, allow c 1:3 rwm (/dev/null): the shape of runc's program
RUNTIME = encode([
    Insn(0x61, 2, 1, 0), Insn(0x54, 2, imm=0xFFFF), Insn(0x61, 4, 1, 4), Insn(0x61, 5, 1, 8),
    Insn(0x55, 2, off=4, imm=2), Insn(0x55, 4, off=3, imm=1), Insn(0x55, 5, off=2, imm=3),
    Insn(0xB7, 0, imm=1), Insn(0x95), Insn(0xB7, 0, imm=0), Insn(0x95),
])
#: a second, systemd-like program: allow every char device of major 1
MAJOR_ONE = encode([
    Insn(0x61, 2, 1, 0), Insn(0x54, 2, imm=0xFFFF), Insn(0x61, 4, 1, 4),
    Insn(0x55, 2, off=3, imm=2), Insn(0x55, 4, off=2, imm=1), Insn(0xB7, 0, imm=1), Insn(0x95),
    Insn(0xB7, 0, imm=0), Insn(0x95),
])


# ---- the walk, on a fake libbpf ----------------------------------------------------------
@pytest.fixture
def fake(tmp_path: Path) -> tuple[FakeLibbpf, Path]:
    cg = tmp_path / "scope"
    cg.mkdir()
    return FakeLibbpf(), cg


@pytest.mark.parametrize("programs", [[RUNTIME], [MAJOR_ONE, RUNTIME]], ids=["runc", "systemd+runc"])
def test_every_attached_program_gets_the_rules_and_loses_them_again(fake, programs) -> None:
    lib, cg = fake
    for p in programs:
        lib.attach(cg, p)
    added = bpfdev.add_rules(str(cg), [KMSG, GPU0], lib)  # type: ignore[arg-type]
    assert added == (KMSG, GPU0)
    assert [carried_rules(p) for p in lib.on(cg)] == [(KMSG, GPU0)] * len(programs)
    assert all(now.endswith(old) for now, old in zip(lib.on(cg), programs))
    assert bpfdev.add_rules(str(cg), [KMSG], lib) == (), "already carried: nothing to add or undo"  # type: ignore[arg-type]
    assert bpfdev.remove_rules(str(cg), added, lib) == len(programs)  # type: ignore[arg-type]
    assert lib.on(cg) == programs, "the originals, byte for byte"


def test_a_cgroup_without_device_programs_is_left_alone(fake) -> None:
    lib, cg = fake
    assert bpfdev.add_rules(str(cg), [KMSG], lib) == ()  # type: ignore[arg-type]
    assert lib.calls == []


@pytest.mark.parametrize(
    "op, after, err",
    [("load", 0, errno.EACCES), ("replace", 1, errno.EINVAL), ("load", 1, errno.ENOMEM)],
    ids=["first-load-refused", "second-replace-refused", "second-load-refused"],
)
def test_failure_part_way_puts_back_what_was_replaced(fake, op, after, err) -> None:
    lib, cg = fake
    lib.attach(cg, MAJOR_ONE)
    lib.attach(cg, RUNTIME)
    lib.fail[op], lib.fail_after[op] = err, after
    with pytest.raises(EnforcementError) as exc:
        bpfdev.add_rules(str(cg), [KMSG], lib)  # type: ignore[arg-type]
    assert exc.value.errno == err and exc.value.path == str(cg)
    assert os.strerror(err) in str(exc.value) and "rollback incomplete" not in str(exc.value)
    assert lib.on(cg) == [MAJOR_ONE, RUNTIME]


def test_failed_put_back_is_reported_not_dropped(fake) -> None:
    lib, cg = fake
    lib.attach(cg, MAJOR_ONE)
    lib.attach(cg, RUNTIME)
    lib.fail["replace"], lib.fail_after["replace"] = errno.EINVAL, 1
    real = lib.load

    def load_then_break(insns: bytes, name: str, gpl: bool) -> int:
        if lib.calls.count("load") >= 2:  # the put-back's load
            raise OSError(errno.EPERM, "BPF_PROG_LOAD: Operation not permitted")
        return real(insns, name, gpl)

    lib.load = load_then_break  # type: ignore[method-assign]
    with pytest.raises(EnforcementError) as exc:
        bpfdev.add_rules(str(cg), [KMSG], lib)  # type: ignore[arg-type]
    assert "rollback incomplete" in str(exc.value) and "Operation not permitted" in str(exc.value)


def test_a_protected_program_is_an_error_naming_it(fake) -> None:
    lib, cg = fake
    lib.protected.add(lib.attach(cg, RUNTIME))
    with pytest.raises(EnforcementError, match="an LSM may protect it") as exc:
        bpfdev.add_rules(str(cg), [KMSG], lib)  # type: ignore[arg-type]
    assert exc.value.errno == errno.EPERM and exc.value.path == str(cg)


def test_removing_from_a_gone_cgroup_is_nothing(tmp_path: Path) -> None:
    assert bpfdev.remove_rules(str(tmp_path / "gone"), [KMSG], FakeLibbpf()) == 0  # type: ignore[arg-type]


# ---- this kernel ---------------------------------------------------------------------------
def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            return Path(left.split()[4])
    return None


CGROUP2 = _cgroup2_mount()


@pytest.fixture
def real_cgroup() -> Iterator[tuple[bpfdev.Libbpf, Path]]:
    if CGROUP2 is None:
        pytest.skip("needs a cgroup2 hierarchy")
    try:
        lib = bpfdev.libbpf()
    except EnforcementError as exc:
        pytest.skip(str(exc))
    cg = CGROUP2 / f"numa-pin-bpf-{secrets.token_hex(4)}"
    cg.mkdir()
    try:
        yield lib, cg
    finally:
        os.rmdir(cg)


def _attach(lib: bpfdev.Libbpf, cg: Path, insns: bytes) -> None:
    fd = lib.load(insns, "np_test_rt", False)
    cg_fd = os.open(cg, os.O_RDONLY | os.O_DIRECTORY)
    try:
        lib.attach(cg_fd, fd)
    finally:
        os.close(cg_fd)
        os.close(fd)  # the attachment keeps the program


def _open_kmsg(cg: Path, mode: str = "w") -> str:
    """Open /dev/kmsg from a process inside ``cg``: OPENED or DENIED, as the kernel decides."""
    dd = "dd if=/dev/null of=/dev/kmsg count=0 conv=notrunc" if mode == "w" else "dd if=/dev/kmsg of=/dev/null count=0"
    code = f"echo $$ > {cg}/cgroup.procs && {dd} 2>/dev/null && echo OPENED || echo DENIED"
    return subprocess.run(["sh", "-c", code], capture_output=True, text=True, timeout=30).stdout.strip()



@pytest.mark.root
@pytest.mark.parametrize("programs", [[RUNTIME], [RUNTIME, MAJOR_ONE]], ids=["one-program", "two-programs"])
def test_kernel_allows_the_granted_device_only_while_granted(real_cgroup, programs) -> None:
    lib, cg = real_cgroup
    for p in programs:
        _attach(lib, cg, p)
    assert _open_kmsg(cg) == "DENIED"
    added = bpfdev.add_rules(str(cg), [KMSG])
    assert _open_kmsg(cg) == "OPENED"
    attached = bpfdev.read_programs(str(cg))
    assert [carried_rules(p.insns) for p in attached] == [(KMSG,)] * len(programs)
    assert bpfdev.remove_rules(str(cg), added) == len(programs)
    assert _open_kmsg(cg) == "DENIED"
    assert sorted(p.insns for p in bpfdev.read_programs(str(cg))) == sorted(programs), \
        "the kernel holds the original instructions again"


@pytest.mark.root
def test_kernel_checks_the_access_letters_of_a_rule(real_cgroup) -> None:
    lib, cg = real_cgroup
    _attach(lib, cg, RUNTIME)
    bpfdev.add_rules(str(cg), [DeviceRule("c", 1, 11, "w")])
    assert (_open_kmsg(cg, "w"), _open_kmsg(cg, "r")) == ("OPENED", "DENIED")
