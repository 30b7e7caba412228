"""The admission deadline each thread sees: its own admission's, never another thread's, and none
once its admission has ended, however admissions in two threads overlap."""

from __future__ import annotations

import threading

import pytest

from numa_pin.base import deadline
from numa_pin.base.deadline import Deadline


@pytest.mark.parametrize("first_ends_first", [True, False], ids=["first-ends-first", "last-ends-first"])
def test_overlapping_admissions_in_two_threads_leave_no_deadline_behind(first_ends_first):
    both_active, first_done = threading.Barrier(2), threading.Event()
    seen: dict[str, object] = {}

    def admission(name: str, ends_first: bool) -> None:
        with Deadline(30, name).active() as mine:
            both_active.wait(timeout=10)
            if not ends_first:
                first_done.wait(timeout=10)
            seen[name] = deadline.current() is mine
        if ends_first:
            first_done.set()

    threads = [threading.Thread(target=admission, args=("a", first_ends_first)),
               threading.Thread(target=admission, args=("b", not first_ends_first))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert seen == {"a": True, "b": True}, "each admission sees its own deadline"
    assert deadline.current() is None


def test_the_main_threads_deadline_is_current_only_inside_its_admission():
    assert deadline.current() is None
    with Deadline(30, "main").active() as mine:
        assert deadline.current() is mine
        with Deadline(30, "nested").active() as inner:
            assert deadline.current() is inner
        assert deadline.current() is mine
    assert deadline.current() is None
