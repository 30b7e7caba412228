"""A lost or corrupt ledger (issue 22, item 3).

Containers that ask for nothing still start; anything else is refused with the way out,
``numa-pin recover``, which keeps the damaged file aside and rebuilds the grants from what runs
before any new grant is made. The oracle is the fake node's cgroups: after recovery no CPU a
running exclusive container's cpuset holds is handed out again, and the shared containers are
still shrunk around new exclusive grants.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.cli.main import main
from numa_pin.config.schema import config_from_dict
from numa_pin.entry.hook import run as hook_run
from numa_pin.errors import EXIT_ERROR
from numa_pin.ledger.model import LEDGER_VERSION
from numa_pin.ledger.store import Ledger
from numa_pin.requests.request import request_from_oci
from numa_pin.service.node import PENDING_GRACE_S, NodeService
from numa_pin.testing.node import FakeNode


@pytest.fixture
def node(hook_node: FakeNode) -> FakeNode:
    return hook_node


def hook(node: FakeNode, name: str, pid: int, annotations: dict[str, str], capfd) -> tuple[int, str]:
    node.add_container(name, pid)
    rc = hook_run(["--config", str(node.config), "prestart"], io.BytesIO(node.oci_state(name, pid, annotations)))
    return rc, capfd.readouterr().err


def cpus(node: FakeNode, name: str) -> frozenset[int]:
    return parse_list(node.cpuset(name)[0])


def _flip(raw: bytes) -> bytes:
    """One bit of a CPU list in the data flipped: the checksum no longer matches."""
    at = raw.index(b'"cpus": "') + len(b'"cpus": "')
    return raw[:at] + bytes([raw[at] ^ 0x01]) + raw[at + 1:]


def _newer(raw: bytes) -> bytes:
    doc = json.loads(raw)
    doc["version"] = LEDGER_VERSION + 1
    return json.dumps(doc).encode()


#: (id, what happens to ledger.json)
DAMAGE = [
    ("empty", lambda raw: b""),
    ("half-written", lambda raw: raw[: len(raw) // 2]),
    ("zeroed", lambda raw: b"\0" * len(raw)),
    ("bit-flipped", _flip),
    ("newer-version", _newer),
]


@pytest.mark.parametrize("damage", [d[1] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_a_damaged_ledger_is_recovered_from_what_runs(node, capfd, damage):
    assert hook(node, "x", 47000, {"numa-pin.io/cpus": "4"}, capfd)[0] == 0
    assert hook(node, "y", 47001, {"numa-pin.io/cpus": "2"}, capfd)[0] == 0
    assert hook(node, "s", 47002, {}, capfd)[0] == 0
    assert hook(node, "d", 47003, {"numa-pin.io/cpus": "2"}, capfd)[0] == 0
    node.stop_container("d", 47003)  # it ended while the ledger was lost
    held = cpus(node, "x") | cpus(node, "y")
    ledger = Path(node.state_dir) / "ledger.json"
    ledger.write_bytes(damage(ledger.read_bytes()))

    rc, err = hook(node, "n", 47004, {}, capfd)
    assert rc == 0, err  # a container that asks for nothing is not stopped
    rc, err = hook(node, "z", 47005, {"numa-pin.io/cpus": "2"}, capfd)
    assert rc == EXIT_ERROR and "numa-pin recover" in err, err  # nothing is granted on a guess

    assert main(["recover", "--json", "--config", str(node.config)]) == 0
    out = json.loads(capfd.readouterr().out)
    assert out["recovered"] and Path(out["aside"]).is_file()  # the damaged file is kept for inspection
    state = Ledger(str(node.state_dir)).read()
    assert "d" not in state.grants
    assert state.exclusive_cpus() >= held
    assert {state.grants[c].kind for c in ("x", "y")} == {"exclusive"}
    assert state.grants["s"].kind == "shared"

    rc, err = hook(node, "z", 47005, {"numa-pin.io/cpus": "2"}, capfd)
    assert rc == 0, err
    z = cpus(node, "z")
    assert z and not z & held  # never a CPU a running exclusive container holds
    assert not cpus(node, "s") & z  # the shared container is still tracked and shrunk


def test_recover_leaves_a_valid_ledger_alone(node, capfd):
    assert hook(node, "x", 47000, {"numa-pin.io/cpus": "4"}, capfd)[0] == 0
    before = (Path(node.state_dir) / "ledger.json").read_bytes()
    assert main(["recover", "--config", str(node.config)]) == 0
    assert "nothing to recover" in capfd.readouterr().out
    assert (Path(node.state_dir) / "ledger.json").read_bytes() == before


def test_a_deleted_ledger_is_rebuilt_by_recover(node, capfd):
    assert hook(node, "x", 47000, {"numa-pin.io/cpus": "4"}, capfd)[0] == 0
    held = cpus(node, "x")
    (Path(node.state_dir) / "ledger.json").unlink()
    assert main(["recover", "--config", str(node.config)]) == 0
    assert "no ledger file: rebuilt" in capfd.readouterr().out
    assert Ledger(str(node.state_dir)).read().exclusive_cpus() >= held


def test_a_recovery_whose_write_fails_leaves_the_damaged_file_in_place(node, capfd, monkeypatch):
    import errno
    import os

    from numa_pin.base import safefs

    assert hook(node, "x", 47000, {"numa-pin.io/cpus": "4"}, capfd)[0] == 0
    ledger = Path(node.state_dir) / "ledger.json"
    ledger.write_bytes(b"\0" * 64)

    def full(*_args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safefs, "write_all", full)
    assert main(["recover", "--config", str(node.config)]) == EXIT_ERROR
    assert "ENOSPC" in capfd.readouterr().err
    assert ledger.read_bytes() == b"\0" * 64  # never no ledger (that reads as empty)


def _bad_checksum(raw: bytes) -> bytes:
    doc = json.loads(raw)
    doc["checksum"] = "sha256:" + "0" * 64
    return json.dumps(doc).encode()


# (seconds since the precreate, is the pending grant kept)
PENDING = [(10, True), (PENDING_GRACE_S + 10, False)]


@pytest.mark.parametrize("damage", [_bad_checksum, _newer], ids=["bad-checksum", "newer-version"])
@pytest.mark.parametrize("elapsed, kept", PENDING, ids=["within-grace", "past-grace"])
def test_recover_keeps_a_pending_grant_within_its_grace(node, capfd, monkeypatch, damage, elapsed, kept):
    """A grant made at precreate has no pid and no cgroup yet: recover counts it alive as the
    service does (issue 36, item 1), so its CPUs, already written into the pending container's
    config, are not granted again; once its grace is over it is dropped."""
    svc = NodeService(config_from_dict(node.config_dict(policy="restricted")))
    svc.admit(request_from_oci("p", {"numa-pin.io/cpus": "4"}), None, expected_cgroup="/ctr/p")
    pending = svc.ledger.read().grants["p"].cpus
    assert len(pending) == 4
    ledger = Path(node.state_dir) / "ledger.json"
    ledger.write_bytes(damage(ledger.read_bytes()))
    boot, clock = time.clock_gettime(time.CLOCK_BOOTTIME), time.clock_gettime
    monkeypatch.setattr(time, "clock_gettime",
                        lambda which: boot + elapsed if which == time.CLOCK_BOOTTIME else clock(which))

    assert main(["recover", "--json", "--config", str(node.config)]) == 0
    out = json.loads(capfd.readouterr().out)
    assert out["recovered"]
    assert (out["salvaged"], out["dropped"]) == ((["p"], []) if kept else ([], ["p"]))
    state = Ledger(str(node.state_dir)).read()
    assert ("p" in state.grants) is kept

    rc, err = hook(node, "z", 47005, {"numa-pin.io/cpus": "4"}, capfd)
    assert rc == 0, err
    z = cpus(node, "z")
    assert bool(z & pending) is not kept  # never on the CPUs the pending container was given
