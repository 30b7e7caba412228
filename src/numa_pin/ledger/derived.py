"""What a :class:`~numa_pin.ledger.model.LedgerState` works out from its grants, once per state,
and what of it one change carries over to the next state (pure).

A busy node's state holds thousands of grants, and an admission asks the same questions of the
state it read (the agent's spare asked them already, as it rehearsed) and of the state it
commits, which differs from it by one grant. So each answer is kept on the state that gave it,
and :func:`carry` hands it to the state one grant later where that grant leaves it valid (or
mends it in place of the grant), instead of working it out again over every grant:

* :func:`exclusive_cpus`: every CPU a grant holds exclusively (the shared pool is the rest);
* :func:`shared_grants`: the grants of ``kind="shared"``, by container id (the containers whose
  cpuset follows the shared pool), and :func:`limited_shared`, those of them with a cpuset of
  their own (a few, if any: each exclusive admission checks they keep a CPU);
* :func:`changed_from`: which container's grant differs from a given earlier mapping of grants,
  where the state is that mapping's one change later (what the ledger's commit checks and
  encodes: one grant of thousands).

A carried answer is the same object where the change leaves it as it was, so a caller may keep
what it worked out from it by identity (:mod:`numa_pin.resources.node.cpu` keeps the shared
containers' cgroups that way).
"""

from __future__ import annotations

from bisect import bisect_left

from numa_pin.ledger import shape
from numa_pin.ledger.records import KIND_SHARED

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:  # what of a grant and a state this reads (the model imports this module)
    from collections.abc import Mapping
    from typing import Protocol, TypeVar

    class GrantLike(Protocol):
        @property
        def container_id(self) -> str: ...
        @property
        def kind(self) -> str: ...
        @property
        def cpus(self) -> frozenset[int]: ...
        @property
        def cpuset_limit(self) -> frozenset[int] | None: ...

    Grant = TypeVar("Grant", bound=GrantLike, covariant=True)

    class LedgerState(Protocol[Grant]):
        @property
        def grants(self) -> Mapping[str, Grant]: ...

_EXCLUSIVE = "_exclusive"
_SHARED = "_shared"
_LIMITED = "_limited"
#: ``(the grants mapping of the state it was made from, the one container whose grant changed)``
_CHANGE = "_change"


def exclusive_cpus(state: LedgerState[GrantLike]) -> frozenset[int]:
    """Every CPU some grant of ``state`` holds exclusively."""
    known: frozenset[int] | None = getattr(state, _EXCLUSIVE, None)
    if known is None:
        out: set[int] = set()
        for grant in state.grants.values():
            out |= grant.cpus
        known = frozenset(out)
        shape.set_field(state, _EXCLUSIVE, known)
    return known


def shared_grants(state: LedgerState[Grant]) -> tuple[Grant, ...]:
    """The grants of ``kind="shared"`` in ``state``, by container id."""
    known: tuple[Grant, ...] | None = getattr(state, _SHARED, None)
    if known is None:
        known = tuple(g for _, g in sorted(state.grants.items()) if g.kind == KIND_SHARED)
        shape.set_field(state, _SHARED, known)
    return known


def limited_shared(state: LedgerState[Grant]) -> tuple[Grant, ...]:
    """The shared grants of ``state`` with a cpuset of their own (``cpuset_limit``), by container id."""
    known: tuple[Grant, ...] | None = getattr(state, _LIMITED, None)
    if known is None:
        known = tuple(g for g in shared_grants(state) if g.cpuset_limit)
        shape.set_field(state, _LIMITED, known)
    return known


def changed_from(state: LedgerState[Grant], grants: Mapping[str, Grant]) -> list[str] | None:
    """The ids of the containers whose grant in ``state`` is not the very one in ``grants`` (one
    came, went or was replaced), when ``state`` was made from a state of ``grants`` by one
    change; None when that is not known (the caller compares them all)."""
    change: tuple[Mapping[str, Grant], str] | None = getattr(state, _CHANGE, None)
    if change is None or change[0] is not grants:
        return None
    return [change[1]]


def carry(before: LedgerState[Grant], after: LedgerState[Grant], old: Grant | None, new: Grant | None) -> None:
    """Give ``after`` (``before`` with ``old``, its grant of one container or None, replaced by
    ``new``, or removed where None) what ``before`` worked out and the change leaves valid, and
    what the change was (:func:`changed_from`; only that one change, never a chain of states)."""
    one = new if new is not None else old
    if one is not None:
        shape.set_field(after, _CHANGE, (before.grants, one.container_id))
    exclusive: frozenset[int] | None = getattr(before, _EXCLUSIVE, None)
    if exclusive is not None and (old is None or not old.cpus):  # a CPU going could still be another's
        shape.set_field(after, _EXCLUSIVE, exclusive | new.cpus if new is not None and new.cpus else exclusive)
    shared: tuple[Grant, ...] | None = getattr(before, _SHARED, None)
    if shared is not None:
        going = old if old is not None and old.kind == KIND_SHARED else None
        coming: tuple[Grant, ...] = (new,) if new is not None and new.kind == KIND_SHARED else ()
        changed = going or (coming[0] if coming else None)
        if changed is not None:
            at = bisect_left(shared, changed.container_id, key=_container_id)
            if going is not None and (at == len(shared) or shared[at] is not going):
                return  # not where it should be: left to be worked out again
            shared = shared[:at] + coming + shared[at + (going is not None):]
        shape.set_field(after, _SHARED, shared)
        limited: tuple[Grant, ...] | None = getattr(before, _LIMITED, None)
        if limited is not None and not (going is not None and going.cpuset_limit) and not (
                coming and coming[0].cpuset_limit):
            shape.set_field(after, _LIMITED, limited)


def _container_id(grant: GrantLike) -> str:
    return grant.container_id


__all__ = ["carry", "changed_from", "exclusive_cpus", "limited_shared", "shared_grants"]
