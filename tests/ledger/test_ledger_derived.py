"""What a state works out once (its exclusive CPUs, its shared grants and those with a cpuset of
their own, the one change it was made by) and carries to the state one grant later: whatever sequence of changes, the carried answer is the one a state built afresh
from the same grants works out (the oracle), and a change that leaves it as it was keeps the
very object (what the CPU resource keeps its shared cgroups by)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from ledger_factories import grant

from numa_pin.ledger import codec, derived
from numa_pin.ledger.model import Grant, LedgerState


def fresh(state: LedgerState) -> LedgerState:
    """The same grants and pods in a state that has worked nothing out yet."""
    return LedgerState(dict(state.grants), dict(state.pods))


def make(cid: str, kind: str, cpus: frozenset[int]) -> Grant:
    if kind in ("shared", "limited"):  # a shared container, with a cpuset of its own or not
        return grant(cid, kind="shared", cpus=frozenset(), mems=frozenset(), devices={}, memory={}, affinity=None,
                     netdevs=(), policy="none", cpuset_limit=cpus if kind == "limited" else None)
    return grant(cid, kind=kind, cpus=cpus, devices={}, memory={}, netdevs=())


changes = st.lists(st.tuples(
    st.sampled_from(["add", "drop"]),
    st.sampled_from([f"c{i:02d}" for i in range(12)]),
    st.sampled_from(["shared", "limited", "exclusive", "process"]),
    st.frozensets(st.integers(0, 15), min_size=1, max_size=3),
    st.booleans(),  # ask the state before the next change (so there is something to carry)
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(changes)
def test_carried_answers_are_the_answers_of_a_fresh_state(steps: list) -> None:
    state = LedgerState()
    for action, cid, kind, cpus, ask in steps:
        if ask:
            state.exclusive_cpus(), state.shared_grants(), state.limited_shared()
        before, before_shared = state, getattr(state, "_shared", None)
        old = state.grants.get(cid)
        new = make(cid, kind, cpus) if action == "add" else None
        state = state.with_grant(new) if new is not None else state.without(cid)
        oracle = fresh(state)
        assert state.exclusive_cpus() == oracle.exclusive_cpus()
        assert state.shared_grants() == oracle.shared_grants()
        assert state.limited_shared() == oracle.limited_shared()
        assert derived.changed_from(oracle, before.grants) is None  # not made from it: compare all
        if state is not before:
            assert derived.changed_from(state, before.grants) == [cid]
        # the commit's encoding, mended for the one change, is the encoding made afresh
        codec.encode(before)
        mended = codec.encode(state)
        codec._LAST = None
        assert mended == codec.encode(oracle)
        untouched = (old is None or old.kind != "shared") and (new is None or new.kind != "shared")
        if before_shared is not None and untouched:
            assert state.shared_grants() is before_shared


def test_an_exclusive_admission_keeps_the_shared_grants_object_and_adds_its_cpus() -> None:
    state = LedgerState({f"s{i}": make(f"s{i}", "shared", frozenset()) for i in range(50)})
    shared = state.shared_grants()
    state.exclusive_cpus()
    after = state.with_grant(make("x1", "exclusive", frozenset({4, 5})))
    assert after.shared_grants() is shared
    assert vars(after).get("_exclusive") == frozenset({4, 5})  # carried, not worked out again
    assert after.without("x1").shared_grants() is shared
    assert "_exclusive" not in vars(after.without("x1"))  # a CPU going: worked out again on asking
