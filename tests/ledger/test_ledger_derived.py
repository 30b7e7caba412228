"""What a state works out once (its exclusive CPUs, its shared grants and those with a cpuset of
their own, the one change it was made by) and carries to the state one grant later: whatever sequence of changes, the carried answer is the one a state built afresh
from the same grants works out (the oracle), and a change that leaves it as it was keeps the
very object (what the CPU resource keeps its shared cgroups by)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from ledger_factories import grant

from numa_pin.base.record import replace
from numa_pin.ledger import codec, derived
from numa_pin.ledger.model import Grant, LedgerState, PodRecord


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
        memo = codec.Memo()
        codec.encode(before, memo=memo)
        mended = codec.encode(state, memo=memo)
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


idle_changes = st.lists(st.tuples(
    st.sampled_from(["add", "drop"]),
    st.sampled_from([f"c{i:02d}" for i in range(12)]),
    st.sampled_from(["shared", "limited", "exclusive", "process"]),
    st.sampled_from([None, "boot-0", "boot-1"]),  # the boot it was admitted in
    st.sampled_from(["pod-a", "pod-b"]),  # pod-a has a pod record: its grants are asked every time
    st.sampled_from([None, "boot-0", "boot-1"]),  # the boot the next question is asked in, or no question
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(idle_changes)
def test_carried_idle_split_is_the_split_of_a_fresh_state(steps: list) -> None:
    """What liveness asks of every admission's state (the grants that hold nothing and have no
    pod record, those of another boot among them, and the rest), carried one change at a time,
    is what a state built afresh works out; the oracle is the definition, grant by grant."""
    state = LedgerState({}, {"pod-a": PodRecord("pod-a", None, "a", "default", 1.0, ())})
    asked: str | None = None
    for action, cid, kind, boot, pod, ask in steps:
        if ask is not None:
            derived.idle_split(state), derived.of_other_boots(state, ask)
            asked = ask
        new = replace(make(cid, kind, frozenset({1})), boot_id=boot, pod_id=pod) if action == "add" else None
        state = state.with_grant(new) if new is not None else state.without(cid)
        idle, busy = derived.idle_split(state)
        want = sorted(c for c, g in state.grants.items() if derived.holds_nothing(g) and g.pod_id != "pod-a")
        assert idle == want == derived.idle_split(fresh(state))[0]
        assert sorted(g.container_id for g in busy) == sorted(set(state.grants) - set(want))
        if asked is not None:
            assert derived.of_other_boots(state, asked) == [
                c for c in want if state.grants[c].boot_id not in (None, asked)]


def test_a_shared_admission_on_a_busy_node_carries_the_split_instead_of_working_it_out() -> None:
    state = LedgerState({f"s{i:04d}": make(f"s{i:04d}", "shared", frozenset()) for i in range(2000)})
    idle, _ = derived.idle_split(state)
    after = state.with_grant(make("s0500x", "shared", frozenset()))
    assert "_idle" in vars(after), "carried with the change, not left to be worked out"
    assert derived.idle_split(after)[0] == sorted([*idle, "s0500x"])
    gone = after.without("s0001")
    assert "_idle" in vars(gone)
    assert derived.idle_split(gone)[0] == [c for c in sorted([*idle, "s0500x"]) if c != "s0001"]
