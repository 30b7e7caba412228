"""The view of the ledger inside :meth:`numa_pin.ledger.store.Ledger.transaction` (pure): the
state as read under the lock, the state to be written, and what to run when the write fails or
is done."""

from __future__ import annotations

from collections.abc import Callable

from numa_pin.errors import LedgerError
from numa_pin.ledger.model import Grant, LedgerState, PodRecord


class Transaction:
    """The view of the ledger inside :meth:`Ledger.transaction`.

    Read ``txn.state``; assign a new :class:`LedgerState` to ``txn.state`` (or use the
    helpers) to have it written when the ``with`` block exits normally.
    """

    def __init__(self, state: LedgerState) -> None:
        self._initial = state
        self._state = state
        self._on_failure: list[Callable[[LedgerError], None]] = []
        self._after: list[Callable[[], None]] = []

    def on_commit_failure(self, undo: Callable[[LedgerError], None]) -> None:
        """Have ``undo(error)`` called when writing this transaction's state fails, before the
        error is raised (newest registration first): the caller's machine changes are
        undone and the rollback's failures can ride on ``error``."""
        self._on_failure.append(undo)

    def after_commit(self, action: Callable[[], None]) -> None:
        """Have ``action()`` called once the state is written (or when nothing changed),
        still under the lock; not called when the block or the write fails."""
        self._after.append(action)

    def _failed(self, error: LedgerError) -> None:
        while self._on_failure:
            self._on_failure.pop()(error)

    def _committed(self) -> None:
        for action in self._after:
            action()

    @property
    def state(self) -> LedgerState:
        return self._state

    @state.setter
    def state(self, value: LedgerState) -> None:
        if not isinstance(value, LedgerState):
            raise TypeError(f"txn.state must be a LedgerState, got {type(value).__name__}")
        self._state = value

    @property
    def changed(self) -> bool:
        """True when the state differs from what was read at the start."""
        return self._state != self._initial

    def put(self, grant: Grant) -> None:
        """Add ``grant``, replacing any grant of the same container."""
        self._state = self._state.with_grant(grant)

    def remove(self, container_id: str) -> None:
        """Drop the grant of ``container_id`` (no-op if absent)."""
        self._state = self._state.without(container_id)

    def put_pod(self, record: PodRecord) -> None:
        """Add ``record``, replacing any record of the same pod."""
        self._state = self._state.with_pod(record)

    def remove_pod(self, pod_id: str) -> None:
        """Drop the record of ``pod_id`` (no-op if absent)."""
        self._state = self._state.without_pod(pod_id)


__all__ = ["Transaction"]
