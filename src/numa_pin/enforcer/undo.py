"""An ordered log of reversible actions, undone newest first.

Every mutation the enforcer makes (a cgroup file write, a ``+cpuset`` in
``cgroup.subtree_control``, a ``devices.allow`` rule, a netdev move) records how to
reverse itself here *right after* it succeeds. When an admission fails halfway, the hook
calls :meth:`UndoLog.rollback` and the system is back where it started; when it succeeds,
the hook calls :meth:`UndoLog.commit` and the log forgets the actions.

:meth:`UndoLog.rollback` never stops at the first failure: it runs every undo action,
collects what went wrong as :class:`UndoFailure` values and returns them, so one stuck
cgroup does not leave the rest of the admission applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from numa_pin.base.record import record
from numa_pin.errors import EnforcementError, NumaPinError

#: an undo step: a function of no arguments that reverses one action
UndoFn = Callable[[], None]


@record
class UndoAction:
    """One reversible action: what was done (for messages) and how to reverse it."""

    description: str
    undo: UndoFn


@record
class UndoFailure:
    """An undo step that failed during :meth:`UndoLog.rollback`."""

    description: str
    error: str

    def __str__(self) -> str:
        return f"undo {self.description!r} failed: {self.error}"


class UndoLog:
    """Reversible actions in the order they were applied."""

    def __init__(self) -> None:
        # (description, undo) pairs: a resize of a busy node's shared pool records thousands
        self._actions: list[tuple[str, UndoFn]] = []

    def __repr__(self) -> str:
        return f"UndoLog({len(self._actions)} actions)"

    def __len__(self) -> int:
        return len(self._actions)

    def __iter__(self) -> Iterator[UndoAction]:
        return iter(self.actions)

    @property
    def actions(self) -> tuple[UndoAction, ...]:
        """The recorded actions, oldest first."""
        return tuple(UndoAction(description, undo) for description, undo in self._actions)

    def descriptions(self) -> list[str]:
        """The description of every recorded action, oldest first."""
        return [description for description, _ in self._actions]

    def record(self, description: str, undo: UndoFn) -> None:
        """Append an action that has just been applied; ``undo`` reverses it."""
        self._actions.append((description, undo))

    def absorb(self, other: UndoLog) -> None:
        """Move every action of ``other`` to the end of this log (``other`` is emptied).

        Enforcement functions collect their own steps in a private log, roll that back
        themselves when they fail, and hand it to the caller's log only on success.
        """
        self._actions.extend(other._actions)
        other._actions.clear()

    def commit(self) -> None:
        """Forget every action: the changes are now meant to stay."""
        self._actions.clear()

    def rollback(self) -> tuple[UndoFailure, ...]:
        """Undo every action, newest first, and empty the log.

        Keeps going when a step fails (a :class:`~numa_pin.errors.NumaPinError` or an
        ``OSError``) and returns the failures in the order they happened; an empty tuple
        means everything was undone. Never raises for a failing step.
        """
        failures: list[UndoFailure] = []
        while self._actions:
            description, undo = self._actions.pop()
            try:
                undo()
            except (NumaPinError, OSError) as exc:
                failures.append(UndoFailure(description, str(exc)))
        return tuple(failures)

    def rollback_or_raise(self, context: str, *, path: str | None = None) -> None:
        """:meth:`rollback`, then raise EnforcementError listing the failures, if any."""
        failures = self.rollback()
        if failures:
            raise EnforcementError(f"{context}: {describe_failures(failures)}", path=path)


def describe_failures(failures: tuple[UndoFailure, ...]) -> str:
    """One line summarising rollback failures (for error messages)."""
    if not failures:
        return "rollback complete"
    return "rollback incomplete: " + "; ".join(str(f) for f in failures)


__all__ = ["UndoAction", "UndoFailure", "UndoFn", "UndoLog", "describe_failures"]
