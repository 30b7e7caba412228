"""Waiting on an event in tests: poll a condition until it holds, never a fixed sleep.

A test that must let something happen (a socket appearing, a child reaching a state, a log line
being written) waits for exactly that with :func:`wait_for`: it returns as soon as the condition
holds and fails with one line naming what did not happen once the deadline passes. A fixed
``time.sleep`` is either too short on a busy machine (a flaky failure) or too long everywhere (a
slow suite); sleeps that remain in tests are the behaviour under test (a client that stays silent,
a timeout being exceeded) and say so.

``tests/`` is on ``sys.path`` (the root conftest's directory), so any test imports it as
``from waitfor import wait_for``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: generous: a bound for a loaded CI machine, never a speed check
WAIT_S = 60.0


def wait_for(condition: Callable[[], T], what: str | Callable[[], str], timeout: float = WAIT_S,
             interval: float = 0.01) -> T:
    """Call ``condition`` until it returns something true and return that.

    ``what`` names the awaited event for the failure (a callable is asked only then, so it can
    add what it finds at that moment, such as a child's stderr). ``condition`` may itself raise
    to fail early (a child that exited instead of listening).
    """
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"waited {timeout:g} s in vain for {said}")
        time.sleep(interval)
