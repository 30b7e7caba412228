"""The ``key<op>value`` lists of the annotations: one splitter, so ``numa-pin.io/devices``,
``numa-pin.io/vf-config`` and ``numa-pin.io/colocate`` ignore the same blanks and refuse a
malformed item the same way."""

import pytest

from numa_pin.errors import RequestError
from numa_pin.requests.colocate import parse_colocate
from numa_pin.requests.pairs import split_pairs
from numa_pin.requests.request import parse_devices
from numa_pin.requests.vfconfig import parse_vf_config

ANN = "example.com/ann"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a=1,b=2", [("a=1", "a", "1"), ("b=2", "b", "2")]),
        (" a = 1 ,\t,\n b=2 ", [("a = 1", "a", "1"), ("b=2", "b", "2")]),
        ("", []),
        (" , ,", []),
        ("a=", [("a=", "a", "")]),
        ("a=b=c", [("a=b=c", "a", "b=c")]),
        # only ASCII blanks are ignored: a no-break space stays part of the key (the caller refuses it)
        ("\u00a0a=1", [("\u00a0a=1", "\u00a0a", "1")]),
    ],
    ids=["two", "blanks-and-empties", "empty", "only-separators", "empty-value", "op-in-value", "nbsp-kept"],
)
def test_items_keys_and_values(text, expected):
    assert split_pairs(text, ",", "=", "key=value", ANN) == expected


@pytest.mark.parametrize("text, item", [("a=1,b", "b"), ("=1", "=1"), (" \t=1", "=1")],
                         ids=["no-op", "no-key", "blank-key"])
def test_a_malformed_item_is_named_with_the_form(text, item):
    with pytest.raises(RequestError, match=f"expected key=value, got '{item}'") as exc:
        split_pairs(text, ",", "=", "key=value", ANN)
    assert ANN in str(exc.value)


@pytest.mark.parametrize(
    "parse, text, form",
    [
        (parse_devices, "nvidia.com/gpu", "resource=count"),
        (parse_devices, " =2", "resource=count"),
        (parse_vf_config, "trust", "key=value"),
        (parse_vf_config, "=on", "key=value"),
        (parse_colocate, "a.com/x,b.com/y", "<scope>:resource,resource"),
        (parse_colocate, " :a.com/x,b.com/y", "<scope>:resource,resource"),
    ],
    ids=["devices-no-op", "devices-no-key", "vf-no-op", "vf-no-key", "colocate-no-op", "colocate-no-scope"],
)
def test_every_annotation_refuses_an_item_without_a_key_alike(parse, text, form):
    with pytest.raises(RequestError, match=f"expected {form}, got") as exc:
        parse(text, ANN)
    assert ANN in str(exc.value)
