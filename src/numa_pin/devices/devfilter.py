"""cgroup v2 device programs as values: the allow-prologue numa-pin puts in front of them (pure).

On cgroup v2 a device access is allowed only when every ``BPF_PROG_TYPE_CGROUP_DEVICE`` program
attached to the cgroup returns 1. numa-pin grants a device by replacing each such program with a
copy that starts with a short *prologue*: for an access that one of the granted rules allows it
returns 1 at once; for anything else it falls through into the original instructions, unchanged
(BPF jumps are relative, so prepending code keeps every jump of the original valid). The
runtime's rules are therefore kept exactly, and the granted devices are added.

The prologue only uses ``r0`` and ``r2``-``r5`` and never writes ``r1`` (the context pointer the
original program reads), so the original starts as if it had been entered directly::

    r0 = MARK_START                  ; marker: "this program carries numa-pin rules"
    r2 = *(u32 *)(r1 + 0)            ; access_type = access << 16 | type
    w3 = w2
    w2 &= 0xffff                     ; type: 1 block, 2 char
    w3 >>= 16                        ; access: 1 mknod, 2 read, 4 write
    r4 = *(u32 *)(r1 + 4)            ; major
    r5 = *(u32 *)(r1 + 8)            ; minor
    ; per rule "c MAJ:MIN rwm":
    if r2 != 2 goto next ; if r4 != MAJ goto next ; if r5 != MIN goto next
    r0 = 1 ; exit
    ; per rule with less than rwm, before "r0 = 1":
    w0 = w3 ; w0 &= ~ACCESS ; if r0 != 0 goto next
    r0 = MARK_END                    ; then the original program
    ...original instructions...

The two markers make the prologue recognisable in what the kernel hands back (its "xlated"
instructions), so undo needs no saved state: :func:`split` reads the rules back and returns the
original instructions, and :func:`with_rules` rebuilds a program with rules added or removed.
Rules must name one device (``c``/``b``, numbers within the kernel's 12-bit major and 20-bit
minor); wildcards are refused.

Note: the kernel hands back what its verifier made of a program. On x86-64 and arm64 the
prologue comes back as loaded; architectures whose JIT needs zero-extension instructions get
extra instructions inserted, and :func:`split` then reports a malformed prologue
(ValueError) rather than guess.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from numa_pin.base.record import record

#: ``r0 = MARK_START`` opens the prologue ("NPG1"), ``r0 = MARK_END`` closes it ("NPG0")
MARK_START = 0x4E504731
MARK_END = 0x4E504730
#: bpf_cgroup_dev_ctx: access_type, major, minor (each u32)
CTX_ACCESS, CTX_MAJOR, CTX_MINOR = 0, 4, 8
DEV_TYPES = {"b": 1, "c": 2}
ACCESS_BITS = {"m": 1, "r": 2, "w": 4}
ALL_ACCESS = 7
MAX_MAJOR = (1 << 12) - 1
MAX_MINOR = (1 << 20) - 1

# opcodes used by the prologue (class | op | source)
LDX_MEM_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W
ALU32_AND_K = 0x54
ALU32_RSH_K = 0x74
ALU32_MOV_X = 0xBC
ALU64_MOV_K = 0xB7
JMP_JNE_K = 0x55
JMP_EXIT = 0x95

_INSN = struct.Struct("<BBhi")


@record
class Insn:
    """One BPF instruction: opcode, destination and source register, offset, immediate."""

    code: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0


@record
class DeviceRule:
    """A device cgroup rule, the one form numa-pin gives them: ``type major:minor access``.

    ``type`` is ``c`` (character), ``b`` (block) or ``a`` (all devices); ``major``/``minor``
    None is ``*``; ``access`` is letters of ``rwm``. The same value is a ``devices.list`` line and
    a ``devices.allow``/``devices.deny`` write (cgroup v1), an entry of numa-pin's prologue in a
    device program (cgroup v2: one device only, see :meth:`device`), and the device part of an
    OCI ``linux.resources.devices`` entry.

    Raises:
        ValueError: an unknown type, an access that is not letters of ``rwm``, or a number
            outside the kernel's limits (12-bit major, 20-bit minor; they also keep the 32-bit
            immediate of a 64-bit compare positive, where sign extension would never match).
    """

    type: str
    major: int | None = None
    minor: int | None = None
    access: str = "rwm"

    def __post_init__(self) -> None:
        if self.type not in ("a", *DEV_TYPES):
            raise ValueError(f"device rule type must be 'a', 'b' or 'c', not {self.type!r}")
        if not self.access or not set(self.access) <= set(ACCESS_BITS):
            raise ValueError(f"device rule access must be letters of 'rwm', not {self.access!r}")
        for name, value, top in (("major", self.major, MAX_MAJOR), ("minor", self.minor, MAX_MINOR)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top):
                raise ValueError(f"device rule {name} must be a number from 0 to {top}, not {value!r}")

    @classmethod
    def device(cls, type: str, major: int | None, minor: int | None, access: str = "rwm") -> DeviceRule:
        """A rule for one block or character device (what a device program's prologue holds).
        Raises ValueError for ``a`` or a wildcard, and as the constructor does."""
        if type not in DEV_TYPES:
            raise ValueError(f"device rule type must be 'b' or 'c', not {type!r}")
        for name, value, top in (("major", major, MAX_MAJOR), ("minor", minor, MAX_MINOR)):
            if value is None:
                raise ValueError(f"device rule {name} must be a number from 0 to {top}, not None")
        return cls(type, major, minor, access)

    @property
    def mask(self) -> int:
        """The access letters as the kernel's bits (``m`` 1, ``r`` 2, ``w`` 4)."""
        return sum(ACCESS_BITS[c] for c in set(self.access))

    def __str__(self) -> str:
        if self.type == "a":
            return "a"
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.type} {major}:{minor} {self.access}"

    def covers(self, other: DeviceRule) -> bool:
        """True when this single rule grants everything ``other`` asks for."""
        if self.type != "a" and self.type != other.type:
            return False
        if self.type != "a":
            if self.major is not None and self.major != other.major:
                return False
            if self.minor is not None and self.minor != other.minor:
                return False
        return set(other.access) <= set(self.access)

    @classmethod
    def parse(cls, text: str) -> DeviceRule:
        """Parse a ``devices.list`` line (``c 195:0 rwm``, ``a *:* rwm``, ``a``).

        Raises ValueError for anything else.
        """
        fields = text.split()
        if not fields or fields[0] not in ("a", "b", "c"):
            raise ValueError(f"not a device rule: {text!r}")
        if len(fields) == 1 and fields[0] == "a":
            return cls("a", None, None, "rwm")
        if len(fields) != 3:
            raise ValueError(f"not a device rule: {text!r}")
        major_s, sep, minor_s = fields[1].partition(":")
        if not sep or not set(fields[2]) <= set(ACCESS_BITS) or not fields[2]:
            raise ValueError(f"not a device rule: {text!r}")
        try:
            major = None if major_s == "*" else int(major_s)
            minor = None if minor_s == "*" else int(minor_s)
        except ValueError:
            raise ValueError(f"not a device rule: {text!r}") from None
        return cls(fields[0], major, minor, fields[2])


def encode(insns: Iterable[Insn]) -> bytes:
    """The kernel's ``struct bpf_insn`` array (little-endian, 8 bytes each)."""
    return b"".join(_INSN.pack(i.code, (i.src << 4) | i.dst, i.off, i.imm) for i in insns)


def decode(data: bytes) -> tuple[Insn, ...]:
    """Instructions from ``struct bpf_insn`` bytes. Raises ValueError for a partial instruction."""
    if len(data) % _INSN.size:
        raise ValueError(f"{len(data)} bytes is not a whole number of BPF instructions")
    return tuple(Insn(code, regs & 0xF, regs >> 4, off, imm) for code, regs, off, imm in _INSN.iter_unpack(data))


def _header() -> list[Insn]:
    return [
        Insn(ALU64_MOV_K, 0, imm=MARK_START),
        Insn(LDX_MEM_W, 2, 1, CTX_ACCESS),
        Insn(ALU32_MOV_X, 3, 2),
        Insn(ALU32_AND_K, 2, imm=0xFFFF),
        Insn(ALU32_RSH_K, 3, imm=16),
        Insn(LDX_MEM_W, 4, 1, CTX_MAJOR),
        Insn(LDX_MEM_W, 5, 1, CTX_MINOR),
    ]


def _rule(rule: DeviceRule) -> list[Insn]:
    if rule.type not in DEV_TYPES or rule.major is None or rule.minor is None:
        raise ValueError(f"a device program rule names one device, not {rule}")
    tail = [Insn(ALU64_MOV_K, 0, imm=1), Insn(JMP_EXIT)]
    if rule.mask != ALL_ACCESS:  # a check whose outcome the verifier cannot know (see the module doc)
        tail = [Insn(ALU32_MOV_X, 0, 3), Insn(ALU32_AND_K, 0, imm=ALL_ACCESS & ~rule.mask),
                Insn(JMP_JNE_K, 0, off=2, imm=0), *tail]
    n = 3 + len(tail)
    return [
        Insn(JMP_JNE_K, 2, off=n - 1, imm=DEV_TYPES[rule.type]),
        Insn(JMP_JNE_K, 4, off=n - 2, imm=rule.major),
        Insn(JMP_JNE_K, 5, off=n - 3, imm=rule.minor),
        *tail,
    ]


def prologue(rules: Sequence[DeviceRule]) -> tuple[Insn, ...]:
    """The instructions that allow ``rules`` and otherwise fall through (see the module doc)."""
    out = _header()
    for rule in rules:
        out += _rule(rule)
    out.append(Insn(ALU64_MOV_K, 0, imm=MARK_END))
    return tuple(out)


def _read_rule(insns: Sequence[Insn], at: int) -> tuple[DeviceRule, int]:
    """The rule encoded at ``insns[at]`` and the index after it. Raises ValueError."""
    head = insns[at:at + 3]
    if len(head) < 3 or [(i.code, i.dst) for i in head] != [(JMP_JNE_K, 2), (JMP_JNE_K, 4), (JMP_JNE_K, 5)]:
        raise ValueError(f"instruction {at}: not a numa-pin device rule")
    kind = {v: k for k, v in DEV_TYPES.items()}.get(head[0].imm)
    if kind is None:
        raise ValueError(f"instruction {at}: unknown device type {head[0].imm}")
    access = "rwm"
    rest = at + 3
    if insns[rest:rest + 1] == (Insn(ALU32_MOV_X, 0, 3),):
        check = insns[rest + 1:rest + 3]
        if len(check) < 2 or check[0].code != ALU32_AND_K or check[1] != Insn(JMP_JNE_K, 0, off=2, imm=0):
            raise ValueError(f"instruction {rest}: malformed access check")
        mask = ALL_ACCESS & ~check[0].imm
        access = "".join(c for c in "rwm" if ACCESS_BITS[c] & mask)
        rest += 3
    if tuple(insns[rest:rest + 2]) != (Insn(ALU64_MOV_K, 0, imm=1), Insn(JMP_EXIT)):
        raise ValueError(f"instruction {rest}: a numa-pin rule must end in 'r0 = 1; exit'")
    end = rest + 2
    if [i.off for i in head] != [end - at - 1, end - at - 2, end - at - 3]:
        raise ValueError(f"instruction {at}: jumps do not lead to the next rule")
    rule = DeviceRule.device(kind, head[1].imm, head[2].imm, access)
    return rule, end


def split(insns: Sequence[Insn]) -> tuple[tuple[DeviceRule, ...], tuple[Insn, ...]]:
    """``(rules of numa-pin's prologue, the original instructions)``; ``((), insns)`` when the
    program carries no prologue. Raises ValueError when it starts with numa-pin's marker but the
    prologue is not one :func:`prologue` builds (numa-pin does not guess at such a program)."""
    insns = tuple(insns)
    if not insns or insns[0] != Insn(ALU64_MOV_K, 0, imm=MARK_START):
        return (), insns
    header = _header()
    if list(insns[:len(header)]) != header:
        raise ValueError("numa-pin marker without numa-pin's prologue")
    rules: list[DeviceRule] = []
    at = len(header)
    while at < len(insns) and insns[at] != Insn(ALU64_MOV_K, 0, imm=MARK_END):
        rule, at = _read_rule(insns, at)
        rules.append(rule)
    if at >= len(insns):
        raise ValueError("numa-pin prologue without its end marker")
    return tuple(rules), insns[at + 1:]


def with_rules(program: bytes, add: Iterable[DeviceRule] = (), remove: Iterable[DeviceRule] = ()) -> bytes | None:
    """``program`` (``struct bpf_insn`` bytes) with numa-pin's rules changed: ``add`` appended
    where missing, ``remove`` taken out; no rule left means no prologue at all, i.e. the original
    instructions byte for byte. None when nothing would change. Raises ValueError as
    :func:`split` does."""
    have, body = split(decode(program))
    gone = set(remove)
    rules = [r for r in have if r not in gone]
    rules += [r for r in dict.fromkeys(add) if r not in rules and r not in gone]
    if rules == list(have):
        return None
    return encode((prologue(rules) if rules else ()) + body)


def carried_rules(program: bytes) -> tuple[DeviceRule, ...]:
    """The rules numa-pin's prologue in ``program`` allows (empty without one). Raises ValueError."""
    return split(decode(program))[0]


__all__ = [
    "ALL_ACCESS",
    "MARK_END",
    "MARK_START",
    "MAX_MAJOR",
    "MAX_MINOR",
    "DeviceRule",
    "Insn",
    "carried_rules",
    "decode",
    "encode",
    "prologue",
    "split",
    "with_rules",
]
