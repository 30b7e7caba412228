"""Kubernetes resource quantities ("512Mi", "1.5Gi", "500m", "1e3") as integers (pure).

The grammar is the one of ``k8s.io/apimachinery/pkg/api/resource.Quantity``::

    quantity ::= sign? number suffix?
    number   ::= digits | digits "." digits? | "." digits
    suffix   ::= Ki | Mi | Gi | Ti | Pi | Ei          (binary, powers of 1024)
               | m | k | M | G | T | P | E            (decimal, milli to exa)
               | ("e" | "E") sign? digits             (decimal exponent)

Arithmetic is exact (integers only, no floats). A value that is not a whole number of
bytes is rounded *up*, as ``Quantity.Value()`` does, so ``"1.5"`` bytes is 2 bytes and
``"500m"`` bytes is 1 byte. Surrounding ASCII whitespace is ignored; any other Unicode
whitespace (no-break space, ideographic space, NEL, ...) makes the value malformed. Negative values,
``NaN``/``inf``, and values above ``2**63 - 1`` (Go's ``int64``) are refused.

Every parser raises :class:`numa_pin.errors.RequestError` (``annotation=what``) and
nothing else; the message quotes the offending value.
"""

from __future__ import annotations

import re

from numa_pin.errors import RequestError

#: the largest value accepted (Go int64, what kubelet stores quantities in)
MAX_VALUE = 2**63 - 1

#: longer input is refused before any arithmetic (guards int() and 10**n against abuse)
MAX_LENGTH = 100

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)"
    r"(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[mkMGTPE])?"
)

_EXAMPLES = "e.g. 512Mi, 2Gi, 1G, 1500, 1.5Gi, 1e3"
_COUNT_EXAMPLES = "a whole number, e.g. 2, 16"
_CPU_EXAMPLES = "e.g. 2, 500m, 1.5"
#: the whitespace ignored around a quantity (ASCII only: str.strip() would also take Unicode
#: spaces, which Kubernetes refuses)
ASCII_BLANKS = " \t\n\r\f\v"


def parse_bytes(text: str | int, what: str) -> int:
    """Parse a byte quantity; fractional byte counts are rounded up.

    ``what`` names the annotation, flag or key the value came from.

    Raises:
        RequestError: ``text`` is empty, not a quantity, negative or above ``2**63 - 1``.
    """
    return _parse(text, what, extra_scale=0, whole=False, examples=_EXAMPLES)


def parse_count(text: str | int, what: str) -> int:
    """Parse a non-negative whole number (a device count, a CPU count).

    Quantity suffixes are allowed as long as the result is whole (``"2"``, ``"1k"``);
    ``"1.5"`` and ``"500m"`` are refused, as kubelet refuses fractional extended resources.

    Raises:
        RequestError: as :func:`parse_bytes`, or the value is not a whole number.
    """
    return _parse(text, what, extra_scale=0, whole=True, examples=_COUNT_EXAMPLES)


def parse_cpu_millis(text: str | int, what: str) -> int:
    """Parse a CPU quantity into millicores: ``"2"`` -> 2000, ``"500m"`` -> 500, ``"1.5"`` -> 1500.

    Precision finer than one millicore is rounded up (``Quantity.MilliValue()``).

    Raises:
        RequestError: as :func:`parse_bytes`.
    """
    return _parse(text, what, extra_scale=3, whole=False, examples=_CPU_EXAMPLES)


def format_bytes(n: int) -> str:
    """Format a byte count with the largest binary suffix that divides it exactly.

    ``format_bytes(2 * 1024**3) == "2Gi"``, ``format_bytes(1536 * 1024**2) == "1536Mi"``,
    ``format_bytes(1000) == "1000"``. :func:`parse_bytes` reads every result back exactly.

    Raises:
        ValueError: ``n`` is negative (a programming error, not user input).
    """
    if n < 0:
        raise ValueError(f"byte count must not be negative, got {n}")
    if n == 0:
        return "0"
    for suffix, power in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
        unit = 1 << (10 * power)
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def _parse(text: str | int, what: str, *, extra_scale: int, whole: bool, examples: str) -> int:
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise RequestError(
            f"{text!r} is not a quantity: expected a string or an integer ({examples})",
            annotation=what,
        )
    if isinstance(text, int):  # an integer from YAML/JSON: no suffix, no rounding
        if text < 0:
            raise RequestError(f"quantity {text} must not be negative", annotation=what)
        factor: int = 10**extra_scale
        if text > MAX_VALUE // factor:
            shown = str(text) if text.bit_length() < 256 else f"<{text.bit_length()}-bit integer>"
            raise RequestError(f"quantity {shown} is larger than {MAX_VALUE}", annotation=what)
        return text * factor
    shown = text if len(text) <= MAX_LENGTH else text[:MAX_LENGTH] + "..."
    raw = text.strip(ASCII_BLANKS)  # str.strip() would also drop U+00A0, U+3000, U+0085 ...
    if not raw:
        raise RequestError(f"empty quantity {shown!r} ({examples})", annotation=what)
    odd = next((c for c in raw if not c.isascii() and (c.isspace() or not c.isprintable())), None)
    if odd is not None:
        raise RequestError(
            f"quantity {shown!r} holds the character U+{ord(odd):04X}; quantities are plain ASCII "
            "and Kubernetes trims nothing", annotation=what,
        )
    if len(raw) > MAX_LENGTH:
        raise RequestError(
            f"quantity {shown!r} is longer than {MAX_LENGTH} characters", annotation=what
        )
    match = _QUANTITY.fullmatch(raw)
    if match is None or not (match["int"] or match["frac"]):
        raise RequestError(f"{shown!r} is not a valid quantity ({examples})", annotation=what)
    if match["sign"] == "-":
        raise RequestError(f"quantity {shown!r} must not be negative", annotation=what)

    frac = match["frac"] or ""
    mantissa = int((match["int"] or "0") + frac)
    scale10 = extra_scale - len(frac)
    mult2 = 1
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        mult2 = 1 << (10 * _BINARY[suffix])
    elif suffix in _DECIMAL:
        scale10 += _DECIMAL[suffix]
    else:  # decimal exponent: "e3", "E-2"
        scale10 += int(suffix[1:])

    return _to_int(mantissa, scale10, mult2, shown, what, whole=whole)


def _to_int(mantissa: int, scale10: int, mult2: int, shown: str, what: str, *, whole: bool) -> int:
    """``mantissa * 10**scale10 * mult2`` as an int, rounded up, bounded before any power."""
    if mantissa == 0:
        return 0
    digits = len(str(mantissa))
    # value >= 10**(digits - 1 + scale10): refuse before computing a gigantic power
    if digits - 1 + scale10 >= 19:
        raise RequestError(f"quantity {shown!r} is larger than {MAX_VALUE}", annotation=what)
    # value < 10**(digits + scale10) * 2**60 < 1: a tiny positive fraction
    if digits + scale10 < -19:
        if whole:
            raise RequestError(f"quantity {shown!r} is not a whole number", annotation=what)
        return 1
    value: int
    if scale10 >= 0:
        value = mantissa * 10**scale10 * mult2
    else:
        num, den = mantissa * mult2, 10**-scale10
        if whole and num % den:
            raise RequestError(f"quantity {shown!r} is not a whole number", annotation=what)
        value = -(-num // den)
    if value > MAX_VALUE:
        raise RequestError(f"quantity {shown!r} is larger than {MAX_VALUE}", annotation=what)
    return value


__all__ = ["MAX_VALUE", "format_bytes", "parse_bytes", "parse_count", "parse_cpu_millis"]
