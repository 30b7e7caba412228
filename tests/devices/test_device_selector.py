"""The one selector type: normalisation, refusals, pf_names ranges, and config/direct agreement."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.devices.selector import (
    SELECTOR_KEYS,
    PfName,
    Selector,
    check_resource_name,
    parse_pf_name,
    parse_selector,
)
from numa_pin.errors import ConfigError

# (id, fields as written, the normalised fields)
NORMALISED = [
    ("vendor-short-upper", {"vendors": ["10DE"]}, {"vendors": ("0x10de",)}),
    ("vendor-padded", {"vendors": ["0X1"]}, {"vendors": ("0x0001",)}),
    ("device-and-vendor", {"vendors": ["0x8086"], "devices": ["154C"]}, {"vendors": ("0x8086",), "devices": ("0x154c",)}),
    ("class-2-digits", {"classes": ["02"]}, {"classes": ("0x02",)}),
    ("class-6-digits-upper", {"classes": ["0x0302AB"]}, {"classes": ("0x0302ab",)}),
    ("address-short", {"addresses": ["3B:02.1"]}, {"addresses": ("0000:3b:02.1",)}),
    ("address-other-domain", {"addresses": ["0001:AF:00.0"]}, {"addresses": ("0001:af:00.0",)}),
    ("strings-stripped", {"drivers": [" iavf "], "pf_names": ["\tens1f0#0-3,6 "]},
     {"drivers": ("iavf",), "pf_names": ("ens1f0#0-3,6",)}),
    ("booleans-kept", {"is_vf": False, "has_netdev": True}, {"is_vf": False, "has_netdev": True}),
]


@pytest.mark.parametrize(("case", "written", "expected"), NORMALISED, ids=[c[0] for c in NORMALISED])
def test_selector_values_are_normalised(case: str, written: dict[str, Any], expected: dict[str, Any]) -> None:
    from_config = parse_selector(written, "devices.a.com/x[0]")
    direct = Selector(**{k: tuple(v) if isinstance(v, list) else v for k, v in written.items()})
    for name in SELECTOR_KEYS:
        want = expected.get(name, None if name in ("is_vf", "has_netdev") else ())
        assert getattr(from_config, name) == want, name
    assert direct == from_config


# (id, fields, key named after "devices.a.com/x[0]", a word of the message)
REFUSED = [
    ("not-a-mapping", ["10de"], "", "mapping"),
    ("empty", {}, "", "every PCI device"),
    ("unknown-key", {"vendor": ["10de"]}, ".vendor", "unknown selector key"),
    ("list-is-a-string", {"drivers": "iavf"}, ".drivers", "list of strings"),
    ("empty-list", {"drivers": []}, ".drivers", "non-empty list"),
    ("item-not-a-string", {"devices": [0x1234]}, ".devices[0]", "non-empty string"),
    ("blank-item", {"drivers": ["iavf", " "]}, ".drivers[1]", "non-empty string"),
    ("vendor-not-hex", {"vendors": ["0xgg"]}, ".vendors[0]", "hex id"),
    ("vendor-5-digits", {"vendors": ["10de0"]}, ".vendors[0]", "4 digits"),
    ("vendor-bare-0x", {"vendors": ["0x"]}, ".vendors[0]", "hex id"),
    ("class-odd-length", {"classes": ["0x030"]}, ".classes[0]", "2, 4 or 6"),
    ("class-8-digits", {"classes": ["03020000"]}, ".classes[0]", "2, 4 or 6"),
    ("address-no-function", {"addresses": ["3b:00"]}, ".addresses[0]", "PCI address"),
    ("address-function-8", {"addresses": ["0000:3b:00.8"]}, ".addresses[0]", "PCI address"),
    ("pf-name-bad-range", {"pf_names": ["ens2f0#x-y"]}, ".pf_names[0]", "ranges"),
    ("pf-name-backwards", {"pf_names": ["ens2f0#4-2"]}, ".pf_names[0]", "backwards"),
    ("pf-name-trailing-comma", {"pf_names": ["ens2f0#1,"]}, ".pf_names[0]", "ranges"),
    ("pf-name-two-hashes", {"pf_names": ["ens2f0#1#2"]}, ".pf_names[0]", "ranges"),
    ("is-vf-string", {"is_vf": "true"}, ".is_vf", "true or false"),
    ("has-netdev-int", {"has_netdev": 1}, ".has_netdev", "true or false"),
    ("is-vf-null", {"is_vf": None}, ".is_vf", "true or false"),
]


@pytest.mark.parametrize(("case", "value", "key", "word"), REFUSED, ids=[c[0] for c in REFUSED])
def test_bad_selectors_name_the_key(case: str, value: object, key: str, word: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_selector(value, "devices.a.com/x[0]")
    assert info.value.key == "devices.a.com/x[0]" + key
    assert word in str(info.value)


@pytest.mark.parametrize(
    ("fields", "key"),
    [({"vendors": ("zz",)}, "devices.selectors.vendors[0]"), ({"pf_names": "a#b"}, "devices.selectors.pf_names[0]"),
     ({"is_vf": 1}, "devices.selectors.is_vf"), ({"addresses": 5}, "devices.selectors.addresses"),
     ({}, "devices.selectors")],
    ids=["bad-hex", "bad-pf-name-as-string", "int-for-bool", "not-iterable", "empty"],
)
def test_direct_construction_refuses_the_same_values(fields: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        Selector(**fields)
    assert info.value.key == key


PF_NAMES = [
    ("plain", "ens2f0", PfName("ens2f0"), {}),
    ("one-index", "ens2f0#3", PfName("ens2f0", ((3, 3),)), {3: True, 2: False, 4: False}),
    ("ranges-and-singles", "p1p1#0-1,5,7-9", PfName("p1p1", ((0, 1), (5, 5), (7, 9))),
     {0: True, 1: True, 2: False, 5: True, 6: False, 9: True, 10: False}),
    ("dotted-vlan-style-name", "eth0.100#0", PfName("eth0.100", ((0, 0),)), {0: True}),
]


@pytest.mark.parametrize(("case", "text", "parsed", "takes"), PF_NAMES, ids=[c[0] for c in PF_NAMES])
def test_pf_names(case: str, text: str, parsed: PfName, takes: dict[int, bool]) -> None:
    assert parse_pf_name(text) == parsed
    for index, expected in takes.items():
        assert parsed.takes_vf(index) is expected, index


def test_a_pf_name_without_ranges_takes_no_vf_by_index() -> None:
    assert not PfName("ens2f0").takes_vf(0)


# brute force: the set of indices a pattern takes equals the union of its ranges, written out
_ranges = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8)), min_size=1, max_size=4)


@given(_ranges)
def test_takes_vf_is_the_union_of_the_ranges(ranges: list[tuple[int, int]]) -> None:
    text = "ens1f0#" + ",".join(f"{low}-{low + width}" if width else str(low) for low, width in ranges)
    expected = {i for low, width in ranges for i in range(low, low + width + 1)}
    pattern = parse_pf_name(text)
    assert {i for i in range(60) if pattern.takes_vf(i)} == expected


def test_to_dict_round_trips() -> None:
    sel = parse_selector({"vendors": ["8086"], "pf_names": ["ens1f0#0-3"], "is_vf": True}, "k")
    assert sel.to_dict() == {"vendors": ["0x8086"], "pf_names": ["ens1f0#0-3"], "is_vf": True}
    assert parse_selector(sel.to_dict(), "k") == sel


def test_resource_name_errors_take_the_key_given() -> None:
    with pytest.raises(ConfigError) as info:
        check_resource_name("gpu", "devices.gpu")
    assert info.value.key == "devices.gpu"
