"""``flock_within``: the one wait for a lock file with a deadline (the ledger's and the counters')."""

from __future__ import annotations

import errno
import fcntl
import os
import time

import pytest

from numa_pin.base.safefs import flock_within
from numa_pin.errors import LedgerError, LedgerLockTimeout
from numa_pin.ledger import store
from numa_pin.ledger.store import Ledger
from numa_pin.reporting import tally


@pytest.fixture
def lock(tmp_path):
    """Two open file descriptions of one lock file: flock(2) treats them as two holders."""
    path = tmp_path / "x.lock"
    path.write_bytes(b"")
    a, b = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    yield a, b
    os.close(a)
    os.close(b)


# (id, held by the other, timeout, poll, notice after: None for no notice, held at the end, notices)
WAITS = [
    ("free_at_once", False, 0.0, (0.001, 0.05), None, True, 0),
    ("free_no_wait_noticed", False, 1.0, (0.001, 0.05), 0.0, True, 0),
    ("held_times_out", True, 0.1, (0.001, 0.05), None, False, 0),
    ("held_noticed_once", True, 0.15, (0.001, 0.01), 0.02, False, 1),
    ("held_fixed_poll", True, 0.05, (0.002, 0.002), None, False, 0),
    ("held_notice_after_deadline", True, 0.05, (0.001, 0.05), 10.0, False, 0),
]


@pytest.mark.parametrize(("held", "timeout", "poll", "after", "got", "notices"), [w[1:] for w in WAITS],
                         ids=[w[0] for w in WAITS])
def test_flock_within(lock, held, timeout, poll, after, got, notices):
    mine, other = lock
    if held:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    calls: list[float] = []
    start = time.monotonic()
    notice = None if after is None else (after, lambda: calls.append(time.monotonic() - start))
    assert flock_within(mine, timeout, poll=poll, notice=notice) is got
    spent = time.monotonic() - start
    assert len(calls) == notices and all(at >= after for at in calls)
    if held:
        assert timeout <= spent < timeout + 1.0  # never sleeps past the deadline by a poll step
        with pytest.raises(BlockingIOError):  # still the other's
            fcntl.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        with pytest.raises(BlockingIOError):  # now ours
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_flock_errors_other_than_busy_are_raised(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)  # a closed descriptor
    with pytest.raises(OSError) as info:
        flock_within(fd, 1.0, poll=(0.001, 0.001))
    assert info.value.errno == errno.EBADF


def test_the_ledger_notices_then_names_the_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "WAIT_NOTICE_S", 0.01)
    holders: list[int | None] = []
    with Ledger(str(tmp_path)).transaction():
        with pytest.raises(LedgerLockTimeout, match=f"held by pid {os.getpid()}"):
            with Ledger(str(tmp_path), lock_timeout=0.1).transaction(on_wait=holders.append):
                pass
    assert holders == [os.getpid()]


def test_the_counters_give_up_quietly(tmp_path):
    KEY = sorted(tally.KEYS)[0]  # noqa: N806
    state = str(tmp_path / "state")
    assert tally.add(state, {KEY: 1}, wait_s=0.05) is True
    fd = os.open(os.path.join(state, tally.LOCK), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert tally.add(state, {KEY: 1}, wait_s=0.05) is False
    finally:
        os.close(fd)
    assert tally.read(state)[KEY] == 1


def test_a_lock_the_kernel_refuses_is_a_ledger_error(tmp_path, monkeypatch):
    def refuse(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.raises(LedgerError, match="cannot lock.*ENOLCK"):
        with Ledger(str(tmp_path / "state"), lock_timeout=0.05).transaction():
            pass
