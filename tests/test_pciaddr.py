"""The one PCI-address parser: accepted forms, the canonical form, and what is refused."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.base import pciaddr
from numa_pin.base.pciaddr import PciAddress

GOOD = [
    ("canonical", "0000:3b:02.1", PciAddress(0, 0x3B, 2, 1), "0000:3b:02.1"),
    ("upper-case", "0000:3B:0A.7", PciAddress(0, 0x3B, 0x0A, 7), "0000:3b:0a.7"),
    ("short-form-domain-0000", "3b:00.0", PciAddress(0, 0x3B, 0, 0), "0000:3b:00.0"),
    ("other-domain", "0001:af:00.0", PciAddress(1, 0xAF, 0, 0), "0001:af:00.0"),
    ("vmd-domain-5-digits", "10000:e1:00.0", PciAddress(0x10000, 0xE1, 0, 0), "10000:e1:00.0"),
    ("8-digit-domain-leading-zeros", "0000abcd:00:1f.3", PciAddress(0xABCD, 0, 0x1F, 3), "abcd:00:1f.3"),
    ("highest-everything", "ffffffff:ff:ff.7", PciAddress(0xFFFFFFFF, 0xFF, 0xFF, 7), "ffffffff:ff:ff.7"),
]


@pytest.mark.parametrize(("case", "text", "parsed", "canonical"), GOOD, ids=[c[0] for c in GOOD])
def test_good_addresses(case: str, text: str, parsed: PciAddress, canonical: str) -> None:
    assert pciaddr.parse(text) == parsed
    assert pciaddr.normalise(text) == canonical
    assert str(parsed) == canonical


BAD = [
    ("empty", ""),
    ("bus-and-device-only", "3b:00"),
    ("function-8", "0000:3b:00.8"),
    ("function-hex", "0000:3b:00.a"),
    ("three-digit-domain", "000:3b:00.0"),
    ("nine-digit-domain", "000000000:3b:00.0"),
    ("one-digit-bus", "0000:3:00.0"),
    ("three-digit-device", "0000:3b:000.0"),
    ("not-hex", "0000:3g:00.0"),
    ("leading-space", " 0000:3b:00.0"),
    ("trailing-newline", "0000:3b:00.0\n"),
    ("colon-for-dot", "0000:3b:00:0"),
    ("netdev-name", "ens2f0"),
    ("unicode-digit", "0000:3b:0\u0663.0"),
]


@pytest.mark.parametrize(("case", "text"), BAD, ids=[c[0] for c in BAD])
def test_bad_addresses(case: str, text: str) -> None:
    with pytest.raises(ValueError, match="not a PCI address"):
        pciaddr.parse(text)
    assert not pciaddr.is_address(text, domain_optional=True)


@pytest.mark.parametrize("value", [None, 3, b"0000:3b:00.0"], ids=["none", "int", "bytes"])
def test_non_strings_are_value_errors(value: object) -> None:
    with pytest.raises(ValueError, match="not a PCI address"):
        pciaddr.parse(value)  # type: ignore[arg-type]


def test_short_form_only_where_allowed() -> None:
    assert pciaddr.is_address("0000:3b:00.0")
    assert not pciaddr.is_address("3b:00.0")
    assert pciaddr.is_address("3b:00.0", domain_optional=True)
    with pytest.raises(ValueError, match="not a PCI address"):
        pciaddr.normalise("3b:00.0", domain_optional=False)


def test_order_is_numeric_not_textual() -> None:
    # "10000:..." sorts before "ffff:..." as text; as addresses it comes after
    assert pciaddr.parse("ffff:00:00.0") < pciaddr.parse("10000:00:00.0")


# An independent oracle: the kernel's own format string, "%04x:%02x:%02x.%d", applied to
# numbers drawn directly, then written back in random case with or without the domain.
_numbers = st.tuples(st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFF), st.integers(0, 0xFF), st.integers(0, 7))


@given(_numbers, st.booleans(), st.booleans(), st.integers(0, 4))
def test_parse_reads_what_the_kernel_prints(numbers: tuple[int, int, int, int], upper: bool,
                                            short: bool, pad: int) -> None:
    domain, bus, dev, fn = numbers
    kernel = "%04x:%02x:%02x.%d" % numbers  # noqa: UP031 - the kernel's format, on purpose
    domain_text, rest = kernel.split(":", 1)
    padded = "0" * min(pad, 8 - len(domain_text)) + domain_text
    text = rest if short and domain == 0 else f"{padded}:{rest}"
    text = text.upper() if upper else text
    assert pciaddr.parse(text) == PciAddress(domain, bus, dev, fn)
    assert pciaddr.normalise(text) == kernel


_texts = st.one_of(
    st.from_regex(re.compile(r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"), fullmatch=True),
    st.text(alphabet="0123456789abcdefABCDEF:.x ", max_size=16),
)


@given(_texts)
def test_normalise_is_idempotent(text: str) -> None:
    try:
        once = pciaddr.normalise(text)
    except ValueError:
        return
    assert pciaddr.normalise(once) == once
    assert pciaddr.parse(once) == pciaddr.parse(text)
    assert pciaddr.is_address(once)  # the canonical form always carries its domain
