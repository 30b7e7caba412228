"""The tests' bounded wait (tests/waitfor.py): returns what the condition found, fails naming the event."""

import time

import pytest

from waitfor import wait_for


def test_returns_the_first_true_value_without_waiting_longer():
    calls = iter([None, [], ["found"]])
    started = time.monotonic()
    assert wait_for(lambda: next(calls), "a value", timeout=5, interval=0.001) == ["found"]
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("what", ["the socket", lambda: "the socket"], ids=["text", "described-late"])
def test_a_condition_that_never_holds_fails_naming_the_event(what):
    with pytest.raises(AssertionError, match=r"^waited 0.05 s in vain for the socket$"):
        wait_for(lambda: False, what, timeout=0.05, interval=0.001)


def test_the_description_is_asked_only_on_failure():
    def describe() -> str:
        raise AssertionError("described though the condition held")

    assert wait_for(lambda: 1, describe) == 1


def test_a_condition_may_fail_early():
    def condition() -> bool:
        raise AssertionError("the child exited")

    with pytest.raises(AssertionError, match="the child exited"):
        wait_for(condition, "the child to listen")
