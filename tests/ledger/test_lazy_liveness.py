"""Liveness only for what an admission needs (issue 21 part 2): every grant that holds something
is checked, the grants that hold nothing (shared containers) a few at a time, each in its turn."""

from __future__ import annotations

import math

import pytest
from ledger_factories import grant

from numa_pin.base.record import replace
from numa_pin.ledger.derived import holds_nothing
from numa_pin.ledger.liveness import SHARED_CHECKS, collect_needed, prepare
from numa_pin.ledger.model import Grant, LedgerState, PodRecord


def shared(cid: str, pod: str = "pod-s") -> Grant:
    return grant(cid, pod_id=pod, kind="shared", cpus=frozenset(), mems=frozenset(), devices={}, memory={},
                 affinity=None, netdevs=(), policy="none")


def state(n_shared: int, *extra: Grant, pods: tuple[str, ...] = ()) -> LedgerState:
    grants = {g.container_id: g for g in [shared(f"s{i:04d}") for i in range(n_shared)] + list(extra)}
    return LedgerState(grants, {p: PodRecord(p, frozenset({0}), "restricted", "pod", 1.0) for p in pods})


HOLDERS = [
    pytest.param(grant("x-cpus", devices={}, memory={}, netdevs=(), affinity=None), id="exclusive-cpus"),
    pytest.param(grant("x-devices", kind="shared", cpus=frozenset(), memory={}, netdevs=(), affinity=None),
                 id="shared-with-devices"),
    pytest.param(grant("x-memory", kind="shared", cpus=frozenset(), devices={}, netdevs=(), affinity=None),
                 id="shared-with-memory"),
    pytest.param(shared("x-pod", pod="pod-recorded"), id="shared-in-a-recorded-pod"),
]


def asking(asked: list[str], dead: str | None = None):
    """An ``alive_fn`` that notes every grant it is asked about (all alive but ``dead``)."""
    return lambda g: asked.append(g.container_id) or g.container_id != dead


@pytest.mark.parametrize("holder", HOLDERS)
def test_a_grant_that_holds_something_is_checked_every_time(holder: Grant) -> None:
    s = state(10 * SHARED_CHECKS, holder, pods=("pod-recorded",))
    for start in range(0, 10 * SHARED_CHECKS, 7):
        asked: list[str] = []
        _, dropped = collect_needed(s, asking(asked, holder.container_id), "boot", start=start)
        assert holder.container_id in asked
        assert [g.container_id for g in dropped] == [holder.container_id]


@pytest.mark.parametrize("n", [SHARED_CHECKS + 1, 3 * SHARED_CHECKS, 2048], ids=lambda n: f"{n}-shared")
def test_shared_grants_are_checked_a_few_at_a_time_each_in_its_turn(n: int) -> None:
    s = state(n)
    seen: set[str] = set()
    rounds = math.ceil(n / SHARED_CHECKS)
    for r in range(rounds):
        asked: list[str] = []
        assert collect_needed(s, asking(asked), "boot", start=r * SHARED_CHECKS) == (s, ())
        assert len(asked) == SHARED_CHECKS
        seen.update(asked)
    assert seen == set(s.grants)  # in ceil(n / SHARED_CHECKS) windows every one had its turn


def test_the_rest_answer_the_boot_check_and_dead_ones_are_dropped_in_their_turn() -> None:
    s = state(4 * SHARED_CHECKS)
    dead = "s0005"
    old = LedgerState({**s.grants, dead: replace(s.grants[dead], boot_id="earlier")}, s.pods)
    # outside its window: the boot check decides (no /proc read); another boot's grant goes
    asked: list[str] = []
    _, dropped = collect_needed(old, asking(asked), "now", start=100)
    assert [g.container_id for g in dropped] == [dead] and dead not in asked
    prepare(old, "earlier")  # worked out for another boot first: asked again for this one
    assert collect_needed(old, asking([]), "earlier", start=100) == (old, ())
    assert [g.container_id for g in collect_needed(old, asking([]), "now", start=100)[1]] == [dead]
    # in its window: the full check decides
    _, dropped = collect_needed(s, asking([], dead), "now", start=0)
    assert [g.container_id for g in dropped] == [dead]
    _, dropped = collect_needed(s, asking([], dead), "now", start=100)
    assert dropped == ()


def test_a_dead_grant_goes_with_its_pod_record() -> None:
    holder = shared("x-pod", pod="pod-recorded")
    s = state(4 * SHARED_CHECKS, holder, pods=("pod-recorded",))
    after, dropped = collect_needed(s, asking([], "x-pod"), None, start=0)
    assert dropped == (holder,) and "x-pod" not in after.grants and "pod-recorded" not in after.pods


def test_few_shared_grants_are_all_checked() -> None:
    s = state(SHARED_CHECKS)
    asked: list[str] = []
    collect_needed(s, asking(asked), "boot")
    assert sorted(asked) == sorted(s.grants)


@pytest.mark.parametrize(("g", "nothing"), [
    pytest.param(shared("a"), True, id="shared"),
    pytest.param(grant("b"), False, id="exclusive"),
    pytest.param(grant("c").as_shared(), True, id="released-to-shared"),
])
def test_holds_nothing(g: Grant, nothing: bool) -> None:
    assert holds_nothing(g) is nothing
