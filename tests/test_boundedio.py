"""Bounded reading: regular files only, no blocking on FIFOs, size and depth limits (issue 10, §2)."""

from __future__ import annotations

import json
import os
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.base.boundedio import UnsafeInput, json_depth_exceeds, json_loads_bounded, read_regular_file

NESTED = st.recursive(st.integers(), lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                              st.dictionaries(st.text(max_size=3), inner, max_size=3)))


def finishes(fn, seconds: float = 10.0):
    """Run ``fn`` in a thread; fail instead of hanging the suite when it blocks."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed back to the test below
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"blocked for more than {seconds}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def depth(doc) -> int:
    """Recursive oracle: levels of lists and objects."""
    if isinstance(doc, dict):
        return 1 + max((depth(v) for v in doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max((depth(v) for v in doc), default=0)
    return 0


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeInput, match="a FIFO, not a regular file"):
        finishes(lambda: read_regular_file(fifo, 100))


@pytest.mark.parametrize("make, what", [(lambda p: p.mkdir(), "a directory"),
                                        (lambda p: os.symlink("/dev/null", p), "a character device")],
                         ids=["directory", "device"])
def test_other_file_types_are_refused(tmp_path, make, what):
    target = tmp_path / "x"
    make(target)
    with pytest.raises(UnsafeInput, match=what):
        read_regular_file(target, 100)


def test_size_limit_and_symlink_refusal(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x" * 101)
    with pytest.raises(UnsafeInput, match="larger than 100 bytes"):
        read_regular_file(f, 100)
    assert read_regular_file(f, 101) == b"x" * 101
    link = tmp_path / "link"
    link.symlink_to(f)
    assert read_regular_file(link, 200) == b"x" * 101
    with pytest.raises(OSError):
        read_regular_file(link, 200, follow=False)


@given(NESTED, st.integers(1, 6))
def test_depth_check_matches_a_recursive_oracle(doc, limit):
    assert json_depth_exceeds(doc, limit) == (depth(doc) > limit)
    text = json.dumps(doc)
    if depth(doc) > limit:
        with pytest.raises(UnsafeInput):
            json_loads_bounded(text, limit)
    else:
        assert json_loads_bounded(text, limit) == doc


@pytest.mark.parametrize("opener", ["[", '{"a":'], ids=["lists", "objects"])
def test_nesting_past_the_interpreter_stack_is_unsafe_input(opener):
    """Before: json.loads raised RecursionError, an "internal error" at the hook's boundary."""
    with pytest.raises(UnsafeInput, match="nested more than 64"):
        json_loads_bounded(opener * 200_000)
    with pytest.raises(UnsafeInput, match="nested more than 64"):
        json_loads_bounded("[" * 65 + "]" * 65)
    assert json_loads_bounded("[" * 64 + "]" * 64) is not None
