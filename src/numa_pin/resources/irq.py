"""Device interrupts off exclusive CPUs: the pure half of the IRQ knob (no I/O).

A container asks with ``irq-load-balancing.crio.io`` (or ``numa-pin.io/irq-load-balancing``):

* ``disable``: no movable IRQ may fire on any of its CPUs;
* ``housekeeping``: IRQs stay off its CPUs except its first core (the first CPU and its
  thread siblings inside the grant), as CRI-O does; that core is the container's own
  housekeeping core.

Two grants never fight over an IRQ: the affinity written is a function of all live grants,
never a per-grant edit. :func:`banned_cpus` is the union, over the live grants that ask, of the
CPUs they keep IRQs off; every movable IRQ gets :func:`target_affinity` of its own baseline
(its affinity before any grant asked, kept by the I/O half) and that union. A grant that goes
simply drops out of the union, and the last one gives every IRQ its baseline back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from numa_pin.resources.base import Resource

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from numa_pin.ledger.model import Grant
    from numa_pin.topology.model import Topology

DISABLE = "disable"
HOUSEKEEPING = "housekeeping"
#: the annotations a container asks with, CRI-O's name first
ANNOTATIONS = ("irq-load-balancing.crio.io", "numa-pin.io/irq-load-balancing")
MODES = (DISABLE, HOUSEKEEPING)


def irq_mode(grant: Grant) -> str | None:
    """What ``grant`` asked of its IRQs (``disable``, ``housekeeping``), None: nothing. Read
    straight from ``Grant.isolation`` (:mod:`numa_pin.requests.isolation` checked it when the
    grant was made): it runs for every grant of the ledger on each recomputation."""
    mode = grant.isolation.get("irq")
    return mode if mode in MODES and grant.cpus else None


def kept_off(grant: Grant, topology: Topology) -> frozenset[int]:
    """The CPUs of ``grant`` that IRQs must leave: all of them (``disable``), or all but the
    first core's (``housekeeping``); empty when it asks nothing."""
    mode = irq_mode(grant)
    if mode is None:
        return frozenset()
    if mode == DISABLE:
        return grant.cpus
    first = min(grant.cpus)
    cpu = topology.cpus.get(first)
    core = (cpu.siblings if cpu is not None else frozenset({first})) & grant.cpus
    return grant.cpus - core


def banned_cpus(grants: Iterable[Grant], topology: Topology) -> frozenset[int]:
    """Every CPU some live grant keeps IRQs off (the reference count is the ledger itself)."""
    out: set[int] = set()
    for grant in grants:
        out |= kept_off(grant, topology)
    return frozenset(out)


def target_affinity(base: frozenset[int], banned: frozenset[int], online: frozenset[int]) -> frozenset[int]:
    """An IRQ's affinity under ``banned``: its baseline without the banned CPUs; when nothing
    is left (it was bound to isolated CPUs only), every online CPU that is not banned."""
    kept = base - banned
    return kept if kept else online - banned


def parse_mask(text: str) -> frozenset[int]:
    """A kernel hex CPU mask (``"ff"``, ``"00000000,0000000f"``) as CPU ids. Raises ValueError."""
    digits = text.strip().replace(",", "")
    if not digits:
        raise ValueError("an empty CPU mask")
    value = int(digits, 16)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def format_mask(cpus: Iterable[int], digits: int = 8) -> str:
    """CPU ids as a kernel hex mask, at least ``digits`` hex digits wide, in comma-separated
    32-bit groups as the kernel prints them (``"f"``, ``"ffffffff,0000000f"``)."""
    value = 0
    for c in cpus:
        value |= 1 << c
    text = f"{value:x}".rjust(max(1, digits), "0")
    head = len(text) % 8 or 8
    return ",".join([text[:head]] + [text[i:i + 8] for i in range(head, len(text), 8)])


def mask_digits(text: str) -> int:
    """How many hex digits a kernel mask has (what :func:`format_mask` writes back)."""
    return len(text.strip().replace(",", ""))


def unmovable_words(unmovable: Mapping[str, str]) -> list[str]:
    """``irq-unmovable=<irqs>`` when the kernel refused to move some IRQs."""
    return [f"irq-unmovable={','.join(sorted(unmovable, key=irq_key))}"] if unmovable else []


def irq_key(name: str) -> tuple[int, str]:
    """Sorts IRQ numbers numerically, names (``default``) after them."""
    return (int(name), "") if name.isdigit() else (1 << 30, name)


class IrqResource(Resource):
    """The pure half: a grant's words for ``status`` (``irq=disable``)."""

    name = "irq"

    def describe(self, grant: Grant) -> list[str]:
        mode = irq_mode(grant)
        return [f"irq={mode}"] if mode else []


__all__ = [
    "ANNOTATIONS", "DISABLE", "HOUSEKEEPING", "MODES", "IrqResource", "banned_cpus", "format_mask", "irq_mode",
    "irq_key", "kept_off", "mask_digits", "parse_mask", "target_affinity", "unmovable_words",
]
