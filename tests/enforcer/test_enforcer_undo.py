"""UndoLog: reverse order, keeps going on failure, absorb/commit semantics."""

from __future__ import annotations

import pytest

from numa_pin.enforcer.undo import UndoLog, describe_failures
from numa_pin.errors import EnforcementError, LedgerError


def test_rollback_runs_newest_first() -> None:
    log = UndoLog()
    seen: list[str] = []
    for name in ("a", "b", "c"):
        log.record(f"step {name}", lambda name=name: seen.append(name))
    assert log.descriptions() == ["step a", "step b", "step c"]
    assert log.rollback() == ()
    assert seen == ["c", "b", "a"]
    assert len(log) == 0
    assert log.rollback() == ()  # nothing is undone twice
    assert seen == ["c", "b", "a"]


@pytest.mark.parametrize(
    "error",
    [EnforcementError("refused", path="/x/cpuset.cpus"), OSError(16, "busy"),
     LedgerError("locked", path="/var/lib/ledger")],
    ids=["enforcement-error", "os-error", "other-numa-pin-error"],
)
def test_rollback_keeps_going_and_collects(error: Exception) -> None:
    log = UndoLog()
    seen: list[str] = []
    log.record("first", lambda: seen.append("first"))

    def boom() -> None:
        raise error

    log.record("second", boom)
    log.record("third", lambda: seen.append("third"))
    failures = log.rollback()
    assert seen == ["third", "first"]
    assert [f.description for f in failures] == ["second"]
    assert failures[0].error == str(error)
    assert "second" in describe_failures(failures)


def test_unexpected_exception_types_are_not_swallowed() -> None:
    log = UndoLog()

    def bug() -> None:
        raise KeyError("programming error")

    log.record("buggy", bug)
    with pytest.raises(KeyError):
        log.rollback()


def test_absorb_moves_actions_in_order() -> None:
    outer, inner = UndoLog(), UndoLog()
    outer.record("outer", lambda: None)
    inner.record("inner 1", lambda: None)
    inner.record("inner 2", lambda: None)
    outer.absorb(inner)
    assert outer.descriptions() == ["outer", "inner 1", "inner 2"]
    assert len(inner) == 0


def test_commit_forgets_without_undoing() -> None:
    log = UndoLog()
    seen: list[str] = []
    log.record("x", lambda: seen.append("x"))
    log.commit()
    assert log.rollback() == () and seen == []


def test_rollback_or_raise() -> None:
    log = UndoLog()
    log.record("ok", lambda: None)
    log.rollback_or_raise("admission of c1")  # nothing failed: no error

    def fail() -> None:
        raise OSError(13, "Permission denied")

    log.record("write cpuset.cpus", fail)
    with pytest.raises(EnforcementError, match="admission of c1: rollback incomplete.*cpuset"):
        log.rollback_or_raise("admission of c1")
