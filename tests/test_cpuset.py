"""``cpuset.parse_list`` is bounded in total work and takes ASCII digits only (issue 10, §2)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.base.cpuset import format_list, parse_list


@given(st.frozensets(st.integers(0, 5000), max_size=300))
def test_format_then_parse_is_identity(ids):
    assert parse_list(format_list(ids)) == ids


@pytest.mark.parametrize(
    "text",
    [
        ",".join(["0-1048576"] * 5000),  # each element within bounds, the total is not
        ",".join(["0-65535"] * 2),
        ",".join(["7"] * 70_000),
    ],
    ids=["thousands-of-huge-ranges", "two-full-ranges", "seventy-thousand-singles"],
)
def test_total_work_is_bounded(text):
    """Before: the first case built 5000 sets of a million ids (minutes)."""
    started = time.process_time()
    with pytest.raises(ValueError, match="more than 65536 ids"):
        parse_list(text)
    assert time.process_time() - started < 5  # generous: the check runs before any set is built


@pytest.mark.parametrize(
    "text",
    ["1_0", "\u0663", "\u00a03", "3\u3000", "0-\u0665", "+3", "0x3", "1-0", "-1", "0-1048577", "123456789"],
    ids=["underscore", "arabic-digit", "nbsp", "ideographic-space", "arabic-range", "plus", "hex", "backwards",
         "negative", "over-max-id", "long-number"],
)
def test_malformed_elements_are_refused(text):
    with pytest.raises(ValueError):
        parse_list(text)


def test_ascii_whitespace_is_ignored():
    assert parse_list(" 0-2, 5 \n") == {0, 1, 2, 5}
    assert parse_list("0-65535") == frozenset(range(65536))


def test_config_reports_a_huge_reserved_cpus_in_one_short_line():
    from numa_pin.config.load import config_from_yaml
    from numa_pin.errors import ConfigError

    value = ",".join(["0-1048576"] * 50_000)
    started = time.process_time()
    with pytest.raises(ConfigError, match="cpu_manager.reserved_cpus: bad cpulist") as info:
        config_from_yaml(f"cpu_manager:\n  reserved_cpus: '{value}'\n")
    assert time.process_time() - started < 10
    assert len(str(info.value)) < 400
