"""The precreate grace period runs on the boot clock (issue 22, item 14).

A grant made before its container exists (podman precreate) lives without its cgroup for
``PENDING_GRACE_S``. Wall-clock steps must not move that: a backward step kept a never-started
container's CPUs for the size of the step, a forward one dropped a starting container's grant.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from numa_pin.config.schema import config_from_dict
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.ledger.store import decode, encode
from numa_pin.requests.request import request_from_oci
from numa_pin.service.node import PENDING_GRACE_S, NodeService
from numa_pin.testing.node import FakeNode


@pytest.fixture
def node(tmp_path: Path, tmp_path_factory) -> FakeNode:
    return FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")


# (wall-clock step in seconds, seconds that really pass, is the pending grant still alive)
CASES = [
    (0, 10, True),
    (0, PENDING_GRACE_S + 10, False),
    (-3600, PENDING_GRACE_S + 10, False),
    (-60, PENDING_GRACE_S - 50, True),
    (3600, 10, True),
]


@pytest.mark.parametrize("step, elapsed, alive", CASES,
                         ids=["young", "old", "old-after-backward-step", "young-after-small-backward-step",
                              "young-after-forward-step"])
def test_the_grace_period_ignores_wall_clock_steps(node, monkeypatch, step, elapsed, alive):
    svc = NodeService(config_from_dict(node.config_dict(policy="restricted")))
    svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "4"}), None, expected_cgroup="/ctr/x")
    wall, boot, clock = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME), time.clock_gettime
    monkeypatch.setattr(time, "time", lambda: wall + elapsed + step)
    monkeypatch.setattr(time, "clock_gettime",
                        lambda which: boot + elapsed if which == time.CLOCK_BOOTTIME else clock(which))
    assert (svc.live_grant("x") is not None) is alive
    removed, _ = svc.reconcile()
    assert [g.container_id for g in removed] == ([] if alive else ["x"])


def test_the_boot_stamp_goes_with_the_start_and_round_trips(node):
    svc = NodeService(config_from_dict(node.config_dict(policy="restricted")))
    svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), None, expected_cgroup="/ctr/x")
    pending = svc.ledger.read().grants["x"]
    assert pending.pending_since is not None
    assert decode(encode(svc.ledger.read()), "ledger.json") == svc.ledger.read()
    svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.add_container("x", 45000))
    assert svc.ledger.read().grants["x"].pending_since is None
    assert "pending_since" not in encode(svc.ledger.read()).decode()  # a started grant keeps the old format
    older = LedgerState({"y": Grant("y", "p", "y", "exclusive", cgroup="/ctr/y", cpus=frozenset({3}))})
    assert decode(encode(older), "ledger.json") == older
