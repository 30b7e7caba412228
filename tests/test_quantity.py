"""Kubernetes quantity parsing (numa_pin.base.quantity).

Oracles: values documented by Kubernetes (``129e6 == 129M``, ``123Mi == 128974848``),
and :class:`fractions.Fraction`, which parses the numeric part independently.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.base.quantity import MAX_VALUE, format_bytes, parse_bytes, parse_count, parse_cpu_millis
from numa_pin.errors import RequestError

KI, MI, GI = 1024, 1024**2, 1024**3

BYTES_CASES = [
    ("512Mi", 512 * MI),
    ("2Gi", 2 * GI),
    ("1G", 10**9),
    ("1500", 1500),
    ("1.5Gi", 3 * GI // 2),
    ("1e3", 1000),
    ("1E3", 1000),  # exponent, not exa
    ("1E", 10**18),  # exa
    ("129e6", 129_000_000),  # k8s docs: 129e6 == 129M
    ("129M", 129_000_000),
    ("123Mi", 128_974_848),  # k8s docs
    ("1.5", 2),  # Value() rounds up
    ("500m", 1),
    ("0.1", 1),
    ("1e-30", 1),
    (".5Ki", 512),
    ("5.", 5),
    ("+3k", 3000),
    (" 7 ", 7),
    ("0", 0),
    ("0e999999999", 0),
    ("7Ei", 7 * 1024**6),
    ("9223372036854775807", MAX_VALUE),
    (1024, 1024),
    (0, 0),
]


@pytest.mark.parametrize(("text", "expected"), BYTES_CASES, ids=[repr(c[0]) for c in BYTES_CASES])
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text, "memory") == expected


BAD = [
    ("", "empty"),
    ("   ", "empty"),
    ("-1", "negative"),
    ("-1Gi", "negative"),
    ("NaN", "not a valid quantity"),
    ("nan", "not a valid quantity"),
    ("inf", "not a valid quantity"),
    ("Infinity", "not a valid quantity"),
    ("1.5.2", "not a valid quantity"),
    ("1 Gi", "not a valid quantity"),
    ("1Gb", "not a valid quantity"),
    ("1KI", "not a valid quantity"),
    ("Gi", "not a valid quantity"),
    (".", "not a valid quantity"),
    ("1e", "not a valid quantity"),
    ("1e1.5", "not a valid quantity"),
    ("0x10", "not a valid quantity"),
    ("\u0663", "not a valid quantity"),  # ARABIC-INDIC DIGIT THREE
    ("9223372036854775808", "larger than"),
    ("8Ei", "larger than"),
    ("1e19", "larger than"),
    ("1e99999999999999", "larger than"),
    ("1" * 200, "longer than"),
    (-5, "negative"),
    (2**63, "larger than"),
    (10**5000, "larger than"),
    (True, "not a quantity"),
    (1.5, "not a quantity"),
    (None, "not a quantity"),
]


def _id(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 64:
        return f"int-{value.bit_length()}-bits"
    return repr(value)[:20]


@pytest.mark.parametrize(("text", "why"), BAD, ids=[_id(c[0]) for c in BAD])
def test_parse_bytes_rejects(text: object, why: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_bytes(text, "numa-pin.io/memory")  # type: ignore[arg-type]
    message = str(info.value)
    assert info.value.annotation == "numa-pin.io/memory"
    assert message.startswith("numa-pin.io/memory: ")
    assert why in message
    if isinstance(text, str) and text.strip() and len(text) < 100:
        assert repr(text) in message  # the bad value is quoted


COUNT_CASES = [("2", 2), ("0", 0), ("1k", 1000), ("1Ki", 1024), ("2000m", 2), ("1e2", 100), (3, 3)]


@pytest.mark.parametrize(("text", "expected"), COUNT_CASES, ids=[repr(c[0]) for c in COUNT_CASES])
def test_parse_count(text: str | int, expected: int) -> None:
    assert parse_count(text, "gpus") == expected


@pytest.mark.parametrize("text", ["1.5", "500m", "1e-3", "-2", "two", "1e-40"], ids=str)
def test_parse_count_rejects(text: str) -> None:
    with pytest.raises(RequestError, match="gpus"):
        parse_count(text, "gpus")


CPU_CASES = [("2", 2000), ("500m", 500), ("1.5", 1500), ("0.0001", 1), ("100m", 100), ("0", 0), (4, 4000)]


@pytest.mark.parametrize(("text", "expected"), CPU_CASES, ids=[repr(c[0]) for c in CPU_CASES])
def test_parse_cpu_millis(text: str | int, expected: int) -> None:
    assert parse_cpu_millis(text, "cpu") == expected


def test_parse_cpu_millis_overflow_counts_millis() -> None:
    # 1E CPUs is 1e21 millicores: beyond int64 even though 1E bytes is not
    assert parse_bytes("1E", "x") == 10**18
    with pytest.raises(RequestError, match="larger than"):
        parse_cpu_millis("1E", "cpu")


FORMAT_CASES = [(0, "0"), (1, "1"), (1000, "1000"), (KI, "1Ki"), (1536 * MI, "1536Mi"), (2 * GI, "2Gi"),
                (1024**6, "1Ei"), (KI + 1, "1025")]


@pytest.mark.parametrize(("n", "text"), FORMAT_CASES, ids=[c[1] for c in FORMAT_CASES])
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_format_bytes_negative() -> None:
    with pytest.raises(ValueError):
        format_bytes(-1)


@given(st.integers(min_value=0, max_value=MAX_VALUE))
def test_format_parse_roundtrip(n: int) -> None:
    assert parse_bytes(format_bytes(n), "x") == n


_SUFFIX_FACTOR = {
    "": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


@given(
    st.integers(min_value=0, max_value=10**12),
    st.text(alphabet="0123456789", max_size=6),
    st.sampled_from(sorted(_SUFFIX_FACTOR)),
)
def test_parse_bytes_matches_fraction_oracle(whole: int, frac: str, suffix: str) -> None:
    text = f"{whole}.{frac}{suffix}" if frac else f"{whole}{suffix}"
    exact = Fraction(f"{whole}.{frac or '0'}") * _SUFFIX_FACTOR[suffix]
    for parse, oracle in ((parse_bytes, math.ceil(exact)), (parse_cpu_millis, math.ceil(exact * 1000))):
        if oracle > MAX_VALUE:
            with pytest.raises(RequestError, match="larger than"):
                parse(text, "x")
        else:
            assert parse(text, "x") == oracle


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=-30, max_value=30))
def test_exponent_matches_fraction_oracle(mantissa: int, exponent: int) -> None:
    expected = math.ceil(Fraction(mantissa) * Fraction(10) ** exponent)
    text = f"{mantissa}e{exponent}"
    if expected > MAX_VALUE:
        with pytest.raises(RequestError):
            parse_bytes(text, "x")
    else:
        assert parse_bytes(text, "x") == expected


@given(st.one_of(st.text(max_size=40), st.text(alphabet="0123456789.eEkKMGTPimn+- ", max_size=30)))
def test_arbitrary_text_raises_only_request_error(text: str) -> None:
    for parse in (parse_bytes, parse_count, parse_cpu_millis):
        try:
            value = parse(text, "fuzz")
        except RequestError as exc:
            assert exc.annotation == "fuzz"
        else:
            assert isinstance(value, int) and 0 <= value <= MAX_VALUE


@pytest.mark.parametrize("text", ["2\u00a0", "\u20032", "1Gi\u2003", "\u30002", "2\u200b"],
                         ids=["nbsp-after", "em-space-before", "em-space-after-suffix", "ideographic-space",
                              "zero-width-space"])
def test_unicode_whitespace_and_digits_are_refused(text: str) -> None:
    """Kubernetes' ParseQuantity trims nothing; only ASCII blanks are forgiven here."""
    with pytest.raises(RequestError, match=r"holds the character U\+[0-9A-F]{4}; quantities are plain ASCII"):
        parse_bytes(text, "memory")


def test_count_errors_suggest_counts() -> None:
    with pytest.raises(RequestError) as err:
        parse_count("abc", "--cpus")
    assert str(err.value) == "--cpus: 'abc' is not a valid quantity (a whole number, e.g. 2, 16)"


#: every Unicode whitespace character outside ASCII, by the oracle str.isspace()
UNICODE_SPACES = [chr(c) for c in range(0x80, 0x10000) if chr(c).isspace()]


@pytest.mark.parametrize("space", UNICODE_SPACES, ids=[f"U+{ord(c):04X}" for c in UNICODE_SPACES])
def test_unicode_whitespace_is_refused(space: str) -> None:
    """Before: "\\u00a02Gi" parsed as 2Gi (str.strip() removes any Unicode space)."""
    for text in (space + "2Gi", "2Gi" + space, "1" + space):
        for parse in (parse_bytes, parse_count, parse_cpu_millis):
            with pytest.raises(RequestError):
                parse(text, "numa-pin.io/memory")


@pytest.mark.parametrize("text", [" 2Gi", "2Gi\n", "\t2Gi\r\n", "\x0b2Gi\x0c"],
                         ids=["space", "nl", "tab-crlf", "vt-ff"])
def test_ascii_whitespace_around_a_quantity_is_ignored(text: str) -> None:
    assert parse_bytes(text, "x") == 2 << 30
