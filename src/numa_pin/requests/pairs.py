"""The ``key<op>value`` lists annotations are written in (pure): ``nvidia.com/gpu=2,example.com/vf=1``
(``numa-pin.io/devices``), ``vlan=100,trust=on`` (``numa-pin.io/vf-config``),
``pcie-root:a.com/x,b.com/y;socket:...`` (``numa-pin.io/colocate``).

Items are separated by one character; around items, keys and values only ASCII blanks are
ignored (:data:`numa_pin.base.quantity.ASCII_BLANKS`: Kubernetes refuses Unicode spaces), and empty
items are skipped. What a key or a value may be is the caller's to check.
"""

from __future__ import annotations

from numa_pin.base.quantity import ASCII_BLANKS
from numa_pin.base.text import quote
from numa_pin.errors import RequestError


def split_pairs(text: str, item_sep: str, pair_sep: str, form: str, annotation: str) -> list[tuple[str, str, str]]:
    """``(item, key, value)`` for each non-empty item of ``text``, all three without blanks.

    Raises:
        RequestError: naming ``annotation``, ``expected <form>, got '<item>'`` for an item
            without ``pair_sep`` or with nothing before it.
    """
    out: list[tuple[str, str, str]] = []
    for part in text.split(item_sep):
        part = part.strip(ASCII_BLANKS)
        if not part:
            continue
        key, sep, value = part.partition(pair_sep)
        key, value = key.strip(ASCII_BLANKS), value.strip(ASCII_BLANKS)
        if not sep or not key:
            raise RequestError(f"expected {form}, got {quote(part)}", annotation=annotation)
        out.append((part, key, value))
    return out


__all__ = ["split_pairs"]
