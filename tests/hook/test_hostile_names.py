"""Ids, names and paths a runtime hands the hook: a NUL, another control character or an
over-long value is refused where it comes in, in one line, and nothing is kept (issue 34 item 7).

Before, a container id or ``cgroupsPath`` holding a NUL was admitted as a shared grant, and from
then on every exclusive admission, ``status``, ``reconcile`` and ``release`` of it failed. The
oracle is the ledger (no grant kept) and a normal exclusive admission after it.
"""

from __future__ import annotations

import io
import json

import pytest

from numa_pin.entry import hook as hook_main
from numa_pin.ledger.store import Ledger


def run_hook(fake, config, cid: str, cgroups_path: str = "/c", bundle_name: str = "bundle") -> int:
    bundle = fake.root / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({"annotations": {}, "linux": {"cgroupsPath": cgroups_path}}))
    where = str(bundle) if bundle_name == "bundle" else str(fake.root / bundle_name)
    state = json.dumps({"id": cid, "bundle": where, "pid": 77}).encode()
    return hook_main.run(["--config", str(config), "prestart"], io.BytesIO(state))


@pytest.mark.parametrize(
    ("cid", "cgroups_path", "bundle", "says"),
    [("c\0x", "/c", "bundle", "holds a NUL"),
     ("c\x1bx", "/c", "bundle", "holds a control character"),
     ("c" * 5000, "/c", "bundle", "characters long"),
     ("ok", "/c\0/../../x", "bundle", "linux.cgroupsPath"),
     ("ok", "/" + "c" * 5000, "bundle", "linux.cgroupsPath"),
     ("ok", "/c", "bund\0le", "the bundle")],
    ids=["id-nul", "id-control", "id-long", "cgroups-path-nul", "cgroups-path-long", "bundle-nul"],
)
def test_a_hostile_name_is_refused_in_one_line_and_kept_nowhere(node, capsys, cid, cgroups_path, bundle, says):
    fake, config = node
    assert run_hook(fake, config, cid, cgroups_path, bundle) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HookInputError" in err and says in err and "\0" not in err
    assert Ledger(str(fake.state_dir)).read().grants == {}
    annotated = {"numa-pin.io/cpus": "1"}
    state = fake.oci_state("next", fake.add_container("next", 78), annotated)
    assert hook_main.run(["--config", str(config), "prestart"], io.BytesIO(state)) == 0
    assert Ledger(str(fake.state_dir)).read().grants["next"].cpus


@pytest.mark.parametrize(
    ("cid", "cgroup", "pid"),
    [("p\0x", "/c\0/../x", None), ("poisoned", "/c\0/../x", None), ("poisoned", "/../../etc", 77),
     ("poisoned", "/evil/x", None)],
    ids=["nul-id", "nul-cgroup", "escaping-cgroup", "symlinked-cgroup"],
)
def test_a_poisoned_grant_is_set_aside_reported_and_released_and_blocks_nothing(node, capsys, cid, cgroup, pid):
    """A grant written straight into the ledger whose data makes liveness or a path check raise:
    an exclusive admission, ``status`` and ``reconcile`` go on and report it; ``release`` removes it."""
    import os
    import time

    from numa_pin.cli.main import main as cli_main
    from numa_pin.ledger.model import Grant

    fake, config = node
    os.symlink(fake.root, fake.cgroup_root / "cpuset" / "evil")  # a cgroup path that resolves elsewhere
    ledger = Ledger(str(fake.state_dir))
    with ledger.transaction() as txn:
        txn.state = txn.state.with_grant(Grant(cid, "pod", "p", "shared", pid=pid, cgroup=cgroup, created=time.time()))
    state = fake.oci_state("next", fake.add_container("next", 78), {"numa-pin.io/cpus": "1"})
    assert hook_main.run(["--config", str(config), "prestart"], io.BytesIO(state)) == 0
    assert ledger.read().grants["next"].cpus
    capsys.readouterr()
    for command in ("status", "reconcile"):
        assert cli_main([command, "--config", str(config)]) == 0, command
        out = capsys.readouterr().out
        assert "set aside: numa-pin: set aside the grant of " in out and "\0" not in out
    assert cid not in ledger.read().grants
    assert cli_main(["release", cid[:2], "--config", str(config)]) == 0
    assert "set aside is removed" in capsys.readouterr().out
    assert cli_main(["status", "--config", str(config)]) == 0
    assert "set aside" not in capsys.readouterr().out
    assert cli_main(["release", cid[:2], "--config", str(config)]) == 1


def test_each_grant_is_checked_once_not_once_per_transaction(node, monkeypatch):
    """The check that sets poisoned grants aside costs a busy node's admissions nothing per grant
    already checked: a grant is never changed in place, only replaced."""
    from numa_pin.config.schema import config_from_dict
    from numa_pin.requests.request import request_from_oci
    from numa_pin.service import base as servicebase
    from numa_pin.service.node import NodeService

    fake, _ = node
    svc = NodeService(config_from_dict(fake.config_dict(policy="restricted")))
    for i in range(10):
        svc.admit(request_from_oci(f"s{i}", {}), fake.add_container(f"s{i}", 3000 + i))
    checked = []
    real = servicebase.unusable
    monkeypatch.setattr(servicebase, "unusable", lambda grant: checked.append(grant.container_id) or real(grant))
    svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "1"}), fake.add_container("x", 3100))
    svc.release("x")
    assert len(checked) <= 2, "the new grants at most, once each"
