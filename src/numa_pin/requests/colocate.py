"""``numa-pin.io/colocate``: which resources' devices must share a PCIe root, a NUMA node or a
socket (pure parsing; :mod:`numa_pin.allocators.colocate` honours it).
"""

from __future__ import annotations

from numa_pin.base.quantity import ASCII_BLANKS
from numa_pin.base.text import quote
from numa_pin.errors import RequestError
from numa_pin.requests.pairs import split_pairs

#: what ``numa-pin.io/colocate`` may ask devices to share
COLOCATE_SCOPES = ("pcie-root", "numa-node", "socket")


def parse_colocate(text: str, annotation: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``"pcie-root:nvidia.com/gpu,example.com/nic"`` -> ``(("pcie-root", (...)),)``; groups are
    separated by ``;``, a group names at least two resources and a resource is in one group."""
    out: list[tuple[str, tuple[str, ...]]] = []
    seen: set[str] = set()
    for part, scope, rest in split_pairs(text, ";", ":", "<scope>:resource,resource", annotation):
        if scope not in COLOCATE_SCOPES:
            raise RequestError(f"unknown value {quote(scope)} (expected one of {', '.join(COLOCATE_SCOPES)})",
                               annotation=annotation)
        names = tuple(dict.fromkeys(n.strip(ASCII_BLANKS) for n in rest.split(",") if n.strip(ASCII_BLANKS)))
        if len(names) < 2 or any("/" not in n for n in names):
            raise RequestError(f"{quote(part)} must name two or more resources (domain/name)", annotation=annotation)
        if seen & set(names):
            raise RequestError(f"{quote(part)} names a resource of another group", annotation=annotation)
        seen.update(names)
        out.append((scope, names))
        if len(out) > 16:
            raise RequestError("more than 16 groups", annotation=annotation)
    return tuple(out)


__all__ = ["COLOCATE_SCOPES", "parse_colocate"]
