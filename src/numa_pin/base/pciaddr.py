"""PCI function addresses (``0000:3b:02.1``): the one parser and normaliser (pure).

The canonical form is the one sysfs uses for ``/sys/bus/pci/devices/<address>``: the PCI
domain in at least four lower-case hex digits (Linux prints ``%04x``; VMD domains reach
``10000``), then bus and device in two and the function as one octal digit::

    DDDD:BB:DD.F

:func:`parse` also reads the short form without the domain (``3b:02.1``, domain 0000) when
``domain_optional`` is true, and upper-case hex. It never strips whitespace: callers that read
user text strip it first. The device number is not checked against the 5 bits real
hardware uses; any two hex digits are accepted.
"""

from __future__ import annotations

import re

from numa_pin.base.record import record
from numa_pin.base.text import quote

_ADDRESS = re.compile(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")

#: what an address looks like, for error messages
EXAMPLE = "0000:3b:00.1"


@record(order=True)
class PciAddress:
    """One PCI function; ``str()`` is the canonical sysfs form."""

    domain: int
    bus: int
    device: int
    function: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function}"


def parse(text: str, *, domain_optional: bool = True) -> PciAddress:
    """Read ``DDDD:BB:DD.F`` (or ``BB:DD.F`` when ``domain_optional``), any hex case.

    Raises:
        ValueError: ``text`` is not a string or not a PCI address; the message quotes it.
    """
    match = _ADDRESS.fullmatch(text) if isinstance(text, str) else None
    if match is None or (match[1] is None and not domain_optional):
        form = f"{EXAMPLE} or 3b:00.1" if domain_optional else EXAMPLE
        raise ValueError(f"{quote(text)} is not a PCI address such as {form}")
    domain, bus, device, function = match.groups()
    return PciAddress(int(domain or "0", 16), int(bus, 16), int(device, 16), int(function))


def normalise(text: str, *, domain_optional: bool = True) -> str:
    """``"3B:00.1"`` -> ``"0000:3b:00.1"``: :func:`parse`, then the canonical form.

    Raises:
        ValueError: as :func:`parse`.
    """
    return str(parse(text, domain_optional=domain_optional))


def is_address(text: str, *, domain_optional: bool = False) -> bool:
    """True when :func:`parse` accepts ``text`` (by default only the full form with a domain)."""
    try:
        parse(text, domain_optional=domain_optional)
    except ValueError:
        return False
    return True


__all__ = ["EXAMPLE", "PciAddress", "is_address", "normalise", "parse"]
