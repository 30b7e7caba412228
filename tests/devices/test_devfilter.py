"""numa-pin's allow-prologue for cgroup v2 device programs, run by a small BPF interpreter.

The oracle is an interpreter of the opcodes a device program of this kind uses, written from the
kernel's instruction set description (not from the module under test): each program is run
against a table of accesses, and the answer must be the original program's, except for the
granted devices. The ``runtime`` body below is shaped like the programs runc and systemd emit
(load the context, compare, return 0 or 1), including a block rule and a wildcard.
"""

from __future__ import annotations

import pytest

from numa_pin.devices.devfilter import (
    MARK_START,
    DeviceRule,
    Insn,
    carried_rules,
    decode,
    encode,
    prologue,
    split,
    with_rules,
)

MKNOD, READ, WRITE = 1, 2, 4
BLOCK, CHAR = 1, 2
MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF


def run(program: bytes, dev_type: int, access: int, major: int, minor: int, budget: int = 10_000) -> int:
    """Interpret a BPF_PROG_TYPE_CGROUP_DEVICE program on one access; r0 at exit."""
    ctx = {0: (access << 16) | dev_type, 4: major, 8: minor}
    insns = decode(program)
    regs = [0] * 11
    regs[1] = -1  # the context pointer: only ever a base for loads
    pc = 0
    while budget:
        budget -= 1
        i = insns[pc]
        pc += 1
        cls, op, src_x = i.code & 0x07, i.code & 0xF0, i.code & 0x08
        if i.code == 0x61:  # ldx w
            assert i.src == 1, "only context loads"
            regs[i.dst] = ctx[i.off]
        elif cls in (0x04, 0x07):  # alu32 / alu64
            b = regs[i.src] if src_x else i.imm
            a = regs[i.dst]
            if op == 0xB0:
                r = b
            elif op == 0x50:
                r = a & b
            elif op == 0x70:
                r = (a & (MASK32 if cls == 0x04 else MASK64)) >> b
            elif op == 0x40:
                r = a | b
            else:
                raise AssertionError(f"alu op {op:#x} not interpreted")
            regs[i.dst] = r & (MASK32 if cls == 0x04 else MASK64)
        elif i.code == 0x95:
            return regs[0]
        elif i.code == 0x05:
            pc += i.off
        elif cls == 0x05:  # conditional jumps, 64-bit compares
            a = regs[i.dst] & MASK64
            b = (regs[i.src] if src_x else i.imm) & MASK64
            taken = {0x10: a == b, 0x50: a != b, 0x40: bool(a & b)}[op]
            if taken:
                pc += i.off
        else:
            raise AssertionError(f"opcode {i.code:#x} not interpreted")
    raise AssertionError("program did not exit")


def runtime_body() -> tuple[Insn, ...]:
    """A deny-by-default program: c 1:3 rwm, c 1:5 rw (no mknod), b 7:* r, else 0."""
    return (
        Insn(0x61, 2, 1, 0), Insn(0x54, 2, imm=0xFFFF),        # r2 = type
        Insn(0x61, 3, 1, 0), Insn(0x74, 3, imm=16),            # r3 = access
        Insn(0x61, 4, 1, 4), Insn(0x61, 5, 1, 8),              # r4, r5 = major, minor
        # c 1:3 rwm
        Insn(0x55, 2, off=4, imm=CHAR), Insn(0x55, 4, off=3, imm=1), Insn(0x55, 5, off=2, imm=3),
        Insn(0xB7, 0, imm=1), Insn(0x95),
        # c 1:5 rw: (access & ~(r|w)) must be 0
        Insn(0x55, 2, off=7, imm=CHAR), Insn(0x55, 4, off=6, imm=1), Insn(0x55, 5, off=5, imm=5),
        Insn(0xBC, 1 + 5, 3), Insn(0x54, 6, imm=MKNOD), Insn(0x55, 6, off=2, imm=0),
        Insn(0xB7, 0, imm=1), Insn(0x95),
        # b 7:* r
        Insn(0x55, 2, off=6, imm=BLOCK), Insn(0x55, 4, off=5, imm=7),
        Insn(0xBC, 6, 3), Insn(0x54, 6, imm=MKNOD | WRITE), Insn(0x55, 6, off=2, imm=0),
        Insn(0xB7, 0, imm=1), Insn(0x95),
        Insn(0xB7, 0, imm=0), Insn(0x95),
    )


BODY = encode(runtime_body())
GPU0 = DeviceRule("c", 195, 0)
CTL = DeviceRule("c", 195, 255)
KMSG_W = DeviceRule("c", 1, 11, "w")

#: (id, device type, access, major, minor, body allows?)
ACCESSES = [
    ("null-read", CHAR, READ, 1, 3, 1),
    ("null-mknod", CHAR, MKNOD, 1, 3, 1),
    ("urandom-rw", CHAR, READ | WRITE, 1, 5, 1),
    ("urandom-mknod", CHAR, MKNOD, 1, 5, 0),
    ("loop-read", BLOCK, READ, 7, 9, 1),
    ("loop-write", BLOCK, WRITE, 7, 9, 0),
    ("gpu0-read", CHAR, READ, 195, 0, 0),
    ("gpu0-rwm", CHAR, READ | WRITE | MKNOD, 195, 0, 0),
    ("gpu1-read", CHAR, READ, 195, 1, 0),
    ("ctl-write", CHAR, WRITE, 195, 255, 0),
    ("gpu0-as-block", BLOCK, READ, 195, 0, 0),
    ("kmsg-write", CHAR, WRITE, 1, 11, 0),
    ("kmsg-read", CHAR, READ, 1, 11, 0),
    ("kmsg-rw", CHAR, READ | WRITE, 1, 11, 0),
    ("minor-max", CHAR, READ, 195, 0xFFFFF, 0),
]


def granted(rules: list[DeviceRule], dev_type: int, access: int, major: int, minor: int) -> bool:
    bits = {"m": MKNOD, "r": READ, "w": WRITE}
    for r in rules:
        mask = sum(bits[c] for c in r.access)
        if {"b": BLOCK, "c": CHAR}[r.type] == dev_type and (r.major, r.minor) == (major, minor) \
                and access & ~mask == 0:
            return True
    return False


@pytest.mark.parametrize("rules", [[], [GPU0], [GPU0, CTL], [KMSG_W], [GPU0, KMSG_W, CTL],
                                   [DeviceRule("c", 195, 0xFFFFF, "r")]],
                         ids=["none", "gpu0", "gpu0+ctl", "kmsg-w-only", "mixed", "max-minor"])
@pytest.mark.parametrize("case", ACCESSES, ids=[c[0] for c in ACCESSES])
def test_prologue_adds_exactly_the_granted_devices(rules, case) -> None:
    _, dev_type, access, major, minor, body_allows = case
    program = with_rules(BODY, add=rules) or BODY
    expected = 1 if body_allows or granted(rules, dev_type, access, major, minor) else 0
    assert run(program, dev_type, access, major, minor) == expected
    assert run(BODY, dev_type, access, major, minor) == body_allows, "the oracle body itself"


@pytest.mark.parametrize("rules", [[GPU0], [GPU0, CTL, KMSG_W]], ids=["one", "three"])
def test_original_follows_unchanged_and_strip_restores_it_byte_for_byte(rules) -> None:
    program = with_rules(BODY, add=rules)
    assert program is not None and program.endswith(BODY)
    assert decode(program)[0] == Insn(0xB7, 0, imm=MARK_START)
    assert carried_rules(program) == tuple(rules)
    assert with_rules(program, remove=rules) == BODY
    assert split(decode(BODY)) == ((), runtime_body())


def test_prologue_never_writes_r1_or_r6_to_r10() -> None:
    for insn in prologue([GPU0, KMSG_W, DeviceRule("b", 8, 0, "rm")]):
        if insn.code in (0x95, 0x55, 0x05):
            continue
        assert insn.dst in (0, 2, 3, 4, 5), insn


@pytest.mark.parametrize(
    "start, add, remove, expect",
    [
        ([], [GPU0], [], [GPU0]),
        ([GPU0], [GPU0], [], None),
        ([GPU0], [CTL], [], [GPU0, CTL]),
        ([GPU0, CTL], [], [GPU0], [CTL]),
        ([GPU0], [], [CTL], None),
        ([GPU0, CTL], [], [CTL, GPU0], []),
        ([], [], [GPU0], None),
    ],
    ids=["add", "add-again", "add-second", "remove-one", "remove-absent", "remove-all", "nothing"],
)
def test_with_rules_table(start, add, remove, expect) -> None:
    program = with_rules(BODY, add=start) or BODY
    out = with_rules(program, add=add, remove=remove)
    if expect is None:
        assert out is None
    else:
        assert out is not None and carried_rules(out) == tuple(expect)
        assert out.endswith(BODY)
        if not expect:
            assert out == BODY


def _broken(program: bytes, index: int, **change: int) -> bytes:
    insns = list(decode(program))
    fields = insns[index].__dict__ | change
    insns[index] = Insn(**fields)
    return encode(insns)


@pytest.mark.parametrize(
    "index, change, message",
    [
        (1, {"off": 4}, "marker without"),
        (7, {"imm": 9}, "unknown device type"),
        (8, {"off": 2}, "jumps do not lead"),
        (10, {"imm": 2}, "must end in"),
        (11, {"code": 0x94}, "must end in"),
        (12, {"imm": 0}, "not a numa-pin device rule"),
    ],
    ids=["header", "type", "jump", "return-value", "exit", "end-marker"],
)
def test_foreign_code_after_the_marker_is_refused_not_guessed(index, change, message) -> None:
    program = with_rules(BODY, add=[GPU0])
    assert program is not None
    with pytest.raises(ValueError, match=message):
        with_rules(_broken(program, index, **change), remove=[GPU0])


def test_prologue_without_end_marker_is_refused() -> None:
    program = encode(prologue([GPU0])[:-1])
    with pytest.raises(ValueError, match="end marker"):
        split(decode(program))


@pytest.mark.parametrize(
    "args, message",
    [(("a", 1, 2), "type"), (("c", None, 2), "major"), (("c", 1, -1), "minor"), (("c", 1, 2, ""), "access"),
     (("c", 1, 2, "rx"), "access"), (("c", 4096, 0), "major"), (("c", 1, 0x80000000), "minor")],
    ids=["all-devices", "wildcard-major", "negative-minor", "no-access", "bad-letter", "major-too-big",
         "minor-sign-bit"],
)
def test_only_single_devices_are_rules(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        DeviceRule.device(*args)


def test_partial_instruction_is_refused() -> None:
    with pytest.raises(ValueError, match="whole number"):
        decode(BODY[:-3])


@pytest.mark.parametrize("line", ["c 195:0 rwm", "c 195:255 rw", "b 8:0 m", "c 1:11 w"])
def test_one_rule_from_a_devices_list_line_to_a_device_program_and_back(line: str) -> None:
    """One device access rule for both cgroup versions: a ``devices.list`` line (v1) is the very
    value a device program's prologue carries (v2), and reading the program back gives it again."""
    rule = DeviceRule.parse(line)
    assert str(rule) == line
    assert carried_rules(encode(prologue([rule]))) == (rule,)


@pytest.mark.parametrize("rule", [DeviceRule("a"), DeviceRule("c", None, 0), DeviceRule("c", 195, None)],
                         ids=["all-devices", "any-major", "any-minor"])
def test_a_device_program_refuses_a_wildcard_rule(rule: DeviceRule) -> None:
    with pytest.raises(ValueError, match="one device"):
        prologue([rule])
