"""VF settings (``numa-pin.io/vf-config``) set on the PF when a VF is moved into a container, and
its saved PF-side state put back on release and on every rollback (netlink fake: the requests go
through pyroute2's encoder and decoder, :mod:`netlink_fakes`)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from netlink_fakes import HOST, VF0, Link, World, fake_sysfs, vf_state

from numa_pin.enforcer.netdev import NetdevRecord, move_netdev_to_netns, restore_netdev
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError

PID = 4242
MAC = "02:00:5e:00:00:07"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    w = World(tmp_path / "proc")
    w.add_netns(PID)
    w.install(monkeypatch)
    return w


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return fake_sysfs(tmp_path)


def move(world: World, sysfs: Path, settings=None, undo: UndoLog | None = None) -> NetdevRecord:
    return move_netdev_to_netns(VF0, PID, "net1", sysfs, world.proc_root, bring_up=True, undo=undo,
                                vf_settings=settings)


def at_home(world: World) -> bool:
    """VF0's netdev is in the host under its host name, with its MAC and up state."""
    link = world.link_of(VF0)
    return world.where(VF0) == (HOST, "ens1f0v0") and link.mac == "0e:00:00:00:00:03" and link.up


@pytest.mark.parametrize(
    "settings, changed",
    [
        ({"vlan": 100, "vlanQoS": 3, "mac": MAC, "spoofchk": False, "trust": True, "min_tx_rate": 10,
          "max_tx_rate": 1000, "link_state": "enable"},
         {"vlan": 100, "qos": 3, "mac": MAC, "spoofchk": 0, "trust": 1, "rate": (10, 1000), "link_state": 1}),
        ({"vlan": 100}, {"vlan": 100, "qos": 0}),
        ({"vlan": 0}, {"vlan": 0, "qos": 0}),
        ({"max_tx_rate": 500}, {"rate": (0, 500)}),
        ({"spoofchk": False, "trust": True}, {"spoofchk": 0, "trust": 1}),
        ({"link_state": "disable"}, {"link_state": 2}),
    ],
    ids=["everything", "vlan-resets-qos", "untagged", "max-rate-keeps-min", "spoofchk-trust", "link-down"],
)
def test_settings_are_set_on_the_pf_and_restored_on_release(world: World, sysfs: Path, settings, changed) -> None:
    before = {n: dict(vf) for n, vf in world.vfs.items()}
    rec = move(world, sysfs, settings)
    assert world.vfs[0] == {**before[0], **changed}
    assert world.vfs[1] == before[1], "only the granted VF changes"
    assert world.where(VF0) == (world.netns_path(PID), "net1")
    if "mac" in settings:
        assert world.link_of(VF0).mac == MAC, "the VF's netdev carries the MAC too"
    # the ledger keeps the record as JSON; the release reads it back
    back = NetdevRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert set(back.vf_settings) == set(settings)
    restore_netdev(back, PID, sysfs, world.proc_root)
    assert world.vfs == before and at_home(world)


def test_release_after_the_container_is_gone_restores_them(world: World, sysfs: Path) -> None:
    before = dict(world.vfs[0])
    rec = move(world, sysfs, {"vlan": 7, "trust": True})
    # the netns dies: the kernel gives the physical device back under its container name
    link = world.ns.pop(world.netns_path(PID))[rec.ifindex]
    world.ns[HOST][rec.ifindex] = link
    restore_netdev(rec, None, sysfs, world.proc_root)
    assert world.vfs[0] == before and world.where(VF0) == (HOST, "ens1f0v0")


def test_without_settings_nothing_on_the_pf_changes_and_rates_are_never_written(world: World, sysfs: Path) -> None:
    world.refuse[(None, "rate")] = errno.EOPNOTSUPP  # many drivers refuse any rate
    world.vfs[0]["rate"] = (0, 300)
    before = dict(world.vfs[0])
    rec = move(world, sysfs)
    assert rec.vf_settings == () and "vf_settings" not in rec.to_dict()
    assert world.vfs[0] == before
    restore_netdev(rec, PID, sysfs, world.proc_root)
    assert world.vfs[0] == before and at_home(world)
    assert not any("rate" in call[2].get("vf", {}) for call in world.calls)


def test_undo_log_rollback_restores_them(world: World, sysfs: Path) -> None:
    """A later resource fails: the admission's undo log gives the VF and its settings back."""
    before = dict(world.vfs[0])
    undo = UndoLog()
    move(world, sysfs, {"vlan": 100, "max_tx_rate": 1000, "mac": MAC}, undo)
    assert world.vfs[0] != before
    assert undo.rollback() == ()
    assert world.vfs[0] == before and at_home(world)


@pytest.mark.parametrize(
    "break_it, match",
    [
        (lambda w: w.ns[w.netns_path(PID)].update({99: Link("net1", "02:00:00:00:00:99")}),
         "already taken in the container netns"),
        (lambda w: w.refuse.update({(3, "state=up"): errno.EIO}), "bringing net1 up"),
        (lambda w: w.ns.pop(w.netns_path(PID)), "cannot open the network namespace"),
    ],
    ids=["name-taken-in-container", "bring-up-refused", "container-gone"],
)
def test_a_failed_move_puts_the_settings_back(world: World, sysfs: Path, break_it, match: str) -> None:
    before = dict(world.vfs[0])
    break_it(world)
    with pytest.raises(EnforcementError, match=match):
        move(world, sysfs, {"vlan": 100, "trust": True, "max_tx_rate": 1000})
    assert world.vfs[0] == before
    assert world.where(VF0) == (HOST, "ens1f0v0")


@pytest.mark.parametrize("refused", ["trust", "rate", "link_state"])
def test_a_setting_the_driver_refuses_undoes_the_others(world: World, sysfs: Path, refused: str) -> None:
    """The kernel applies a VF request attribute by attribute: those before the refused one are
    set. They are put back, and the VF is not moved."""
    world.refuse[(None, refused)] = errno.EOPNOTSUPP
    before = dict(world.vfs[0])
    with pytest.raises(EnforcementError, match="failed: Operation not supported; VF settings restored"):
        move(world, sysfs, {"mac": MAC, "vlan": 100, "trust": True, "max_tx_rate": 10, "link_state": "disable"})
    assert world.vfs[0] == before and at_home(world)


def test_settings_the_pf_does_not_report_are_refused_before_anything_changes(world: World, sysfs: Path) -> None:
    world.vfs[0]["rate"] = None  # no IFLA_VF_RATE: the original rates cannot be restored
    with pytest.raises(EnforcementError, match="does not report its max_tx_rate"):
        move(world, sysfs, {"vlan": 100, "max_tx_rate": 1000})
    assert world.calls == [] and at_home(world)


def test_settings_on_a_device_that_is_no_vf_are_refused(world: World, sysfs: Path) -> None:
    world.ns[HOST][9] = Link("dummy0", "02:00:00:00:00:09")
    with pytest.raises(EnforcementError, match="not an SR-IOV VF"):
        move_netdev_to_netns("dummy0", PID, "net1", sysfs, world.proc_root, vf_settings={"vlan": 1})
    assert world.calls == [] and world.where(VF0) == (HOST, "ens1f0v0")


def test_records_of_moves_without_settings_keep_their_old_shape(world: World, sysfs: Path) -> None:
    """What an older numa-pin wrote, it reads back; what it never wrote, a move without settings
    on a PF without rates does not write."""
    world.vfs[0] = vf_state(rate=None)
    out = move(world, sysfs).to_dict()
    assert "vf_settings" not in out
    assert set(out["vf_config"]) == {"mac", "vlan", "qos", "spoofchk", "trust", "link_state"}
    assert NetdevRecord.from_dict(out).to_dict() == out


@pytest.mark.parametrize(
    "drift, fields",
    [
        ({"vlan": 1}, ["vlan"]),
        ({"qos": 0}, ["qos"]),
        ({"trust": 0, "rate": (0, 0)}, ["trust", "max_tx_rate"]),
        ({"link_state": 0}, ["link_state"]),
        ({"mac": "02:00:00:00:00:01"}, ["mac"]),
        ({}, []),
    ],
    ids=["vlan", "qos", "trust-and-rate", "link-state", "mac", "none"],
)
def test_reconcile_sets_drifted_settings_again(world: World, sysfs: Path, drift: dict, fields: list) -> None:
    from numa_pin.enforcer.vfsettings import reassert_vf_settings

    settings = {"vlan": 100, "vlanQoS": 3, "mac": MAC, "trust": True, "max_tx_rate": 1000, "link_state": "enable"}
    rec = move(world, sysfs, settings)
    wanted = dict(world.vfs[0])
    world.vfs[0].update(drift)  # a PF reset, a hand-made `ip link set`
    calls = len(world.calls)
    assert sorted(reassert_vf_settings(rec, settings)) == sorted(fields)
    assert world.vfs[0] == wanted
    assert len(world.calls) == calls + (1 if fields else 0), "nothing is written when nothing drifted"
