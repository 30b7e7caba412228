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
  encodes: one grant of thousands);
* :func:`idle_split`: the ids of the grants that hold nothing (:func:`holds_nothing`) and belong
  to no pod record, sorted, and the other grants (what liveness asks of every admission's
  state), and :func:`of_other_boots`, those idle ids recorded under a boot other than a given one.

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

        @property
        def pod_id(self) -> str: ...
        @property
        def boot_id(self) -> str | None: ...
        @property
        def devices(self) -> Mapping[str, object]: ...
        @property
        def memory(self) -> Mapping[str, object]: ...
        @property
        def affinity(self) -> frozenset[int] | None: ...
        @property
        def netdevs(self) -> object: ...
        @property
        def gpus(self) -> object: ...

    Grant = TypeVar("Grant", bound=GrantLike, covariant=True)

    class LedgerState(Protocol[Grant]):
        @property
        def grants(self) -> Mapping[str, Grant]: ...
        @property
        def pods(self) -> Mapping[str, object]: ...

_EXCLUSIVE = "_exclusive"
_SHARED = "_shared"
_LIMITED = "_limited"
#: ``(the grants mapping of the state it was made from, the one container whose grant changed)``
_CHANGE = "_change"
_IDLE = "_idle"
_OTHER_BOOTS = "_other_boots"


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


def holds_nothing(grant: GrantLike) -> bool:
    """True for a shared container's grant: nothing on the node is held for it alone."""
    return (grant.kind == KIND_SHARED and not grant.cpus and not grant.devices and not grant.memory
            and grant.affinity is None and not grant.netdevs and grant.gpus is None)


def of_earlier_boot(grant: GrantLike, boot_id: str | None) -> bool:
    """True when ``grant`` records a boot and it is not ``boot_id`` (unknown either way: False)."""
    return grant.boot_id is not None and boot_id is not None and grant.boot_id != boot_id


def idle_split(state: LedgerState[Grant]) -> tuple[list[str], tuple[Grant, ...]]:
    """(the ids of the grants that hold nothing and belong to no pod with a record, sorted; the
    other grants). Callers must not change the list."""
    known: tuple[list[str], tuple[Grant, ...]] | None = getattr(state, _IDLE, None)
    if known is None:
        idle: list[str] = []
        busy: list[Grant] = []
        for cid, grant in state.grants.items():
            if _idle(grant, state):
                idle.append(cid)
            else:
                busy.append(grant)
        known = (sorted(idle), tuple(busy))
        shape.set_field(state, _IDLE, known)
    return known


def of_other_boots(state: LedgerState[Grant], boot_id: str | None) -> list[str]:
    """The ids of :func:`idle_split` recorded under a boot other than ``boot_id``, sorted (kept
    for the last boot id asked). Callers must not change the list."""
    known: tuple[str | None, list[str]] | None = getattr(state, _OTHER_BOOTS, None)
    if known is None or known[0] != boot_id:
        grants = state.grants
        known = (boot_id, [cid for cid in idle_split(state)[0] if of_earlier_boot(grants[cid], boot_id)])
        shape.set_field(state, _OTHER_BOOTS, known)
    return known[1]


def _idle(grant: GrantLike, state: LedgerState[GrantLike]) -> bool:
    return holds_nothing(grant) and grant.pod_id not in state.pods


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
    _carry_idle(before, after, old, new)
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


def _carry_idle(before: LedgerState[Grant], after: LedgerState[Grant], old: Grant | None, new: Grant | None) -> None:
    """:func:`idle_split` and :func:`of_other_boots` of ``after`` from ``before``'s, where known:
    the one container taken out of each and put back where its new grant belongs (the pods are
    ``before``'s: a change of one grant keeps them)."""
    split: tuple[list[str], tuple[Grant, ...]] | None = getattr(before, _IDLE, None)
    if split is None:
        return
    idle, busy = split
    others: tuple[str | None, list[str]] | None = getattr(before, _OTHER_BOOTS, None)
    other_ids = others[1] if others is not None else None
    if old is not None:
        idle = _without(idle, old.container_id)
        busy = tuple(g for g in busy if g is not old) if not _idle(old, before) else busy
        other_ids = _without(other_ids, old.container_id) if other_ids is not None else None
    if new is not None:
        if _idle(new, before):
            idle = _with(idle, new.container_id)
            if others is not None and other_ids is not None and of_earlier_boot(new, others[0]):
                other_ids = _with(other_ids, new.container_id)
        else:
            busy = (*busy, new)
    shape.set_field(after, _IDLE, (idle, busy))
    if others is not None and other_ids is not None:
        shape.set_field(after, _OTHER_BOOTS, (others[0], other_ids))


def _without(ids: list[str], cid: str) -> list[str]:
    """``ids`` (sorted) without ``cid``: the same list where it is absent, else a copy."""
    at = bisect_left(ids, cid)
    return ids[:at] + ids[at + 1:] if at < len(ids) and ids[at] == cid else ids


def _with(ids: list[str], cid: str) -> list[str]:
    """``ids`` (sorted) with ``cid`` in its place, as a copy."""
    at = bisect_left(ids, cid)
    return ids[:at] + [cid] + ids[at:]


def _container_id(grant: GrantLike) -> str:
    return grant.container_id


__all__ = ["carry", "changed_from", "exclusive_cpus", "holds_nothing", "idle_split", "limited_shared",
           "of_earlier_boot", "of_other_boots", "shared_grants"]
