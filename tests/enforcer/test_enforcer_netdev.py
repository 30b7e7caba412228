"""Netdev moves: sysfs resolution (fake trees) and real moves into a netns (root).

The privileged tests need no SR-IOV hardware: a virtual interface (dummy where the
kernel has it, else ifb) stands in for the VF, and the target netns is held by
``unshare -n sleep``. ``ip``/``nsenter`` are the independent oracle for where the
device ended up.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from enforcer_fakes import requires_ip, run

from numa_pin.enforcer.netdev import NetdevRecord, move_netdev_to_netns, restore_netdev
from numa_pin.enforcer.netdev_record import (
    VfConfig,
    is_bdf,
    resolve_netdev,
    sriov_identity,
    validate_ifname,
    vf_config_from_dicts,
)
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError
from waitfor import wait_for

PF = "0000:3b:00.0"
VF0 = "0000:3b:02.0"
VF1 = "0000:3b:02.1"


# ---- pure / fake sysfs ---------------------------------------------------------------
@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A fake /sys: a PF with two VFs (VF1 bound to vfio: no netdev) and a plain NIC."""
    root = tmp_path / "sys"
    devs = root / "bus" / "pci" / "devices"
    real = root / "devices" / "pci0000:3a" / "0000:3a:00.0"
    for bdf, nets in ((PF, ["ens1f0"]), (VF0, ["ens1f0v0"]), (VF1, []),
                      ("0000:5e:00.0", ["eno1", "eno1d1"])):
        (real / bdf / "net").mkdir(parents=True)
        for n in nets:
            (real / bdf / "net" / n).mkdir()
        devs.mkdir(parents=True, exist_ok=True)
        (devs / bdf).symlink_to(os.path.relpath(real / bdf, devs))
    for i, vf in enumerate((VF0, VF1)):
        (real / PF / f"virtfn{i}").symlink_to(f"../{vf}")
        (real / vf / "physfn").symlink_to(f"../{PF}")
    net = root / "class" / "net"
    net.mkdir(parents=True)
    (net / "ens1f0v0").mkdir()
    (net / "ens1f0v0" / "device").symlink_to(real / VF0)
    (net / "veth0").mkdir()
    return root


@pytest.mark.parametrize(
    "arg, expected",
    [
        (VF0, ("ens1f0v0", VF0)),
        (VF0.upper(), ("ens1f0v0", VF0)),
        ("ens1f0v0", ("ens1f0v0", VF0)),
        ("veth0", ("veth0", None)),
        ("not-in-sysfs", ("not-in-sysfs", None)),
    ],
    ids=["by-bdf", "bdf-upper-case", "by-name", "virtual-device", "unknown-name-left-to-netlink"],
)
def test_resolve_netdev(sysfs: Path, arg: str, expected) -> None:
    assert resolve_netdev(arg, sysfs) == expected


@pytest.mark.parametrize(
    "arg, match",
    [
        (VF1, "no network interface in this netns"),
        ("0000:5e:00.0", "several network interfaces"),
        ("0000:99:00.0", "no PCI device"),
        ("bad/name", "not valid"),
    ],
    ids=["vfio-bound-vf", "multi-port-function", "absent-bdf", "bad-name"],
)
def test_resolve_netdev_refuses(sysfs: Path, arg: str, match: str) -> None:
    with pytest.raises(EnforcementError, match=match):
        resolve_netdev(arg, sysfs)


@pytest.mark.parametrize(
    "bdf, expected",
    [(VF0, (PF, "ens1f0", 0)), (VF1, (PF, "ens1f0", 1)), (PF, (None, None, None))],
    ids=["vf0", "vf1", "pf-is-not-a-vf"],
)
def test_sriov_identity(sysfs: Path, bdf: str, expected) -> None:
    assert sriov_identity(bdf, sysfs) == expected


@pytest.mark.parametrize(
    "name, ok",
    [("net1", True), ("a" * 15, True), ("a" * 16, False), ("", False), ("a b", False),
     ("a/b", False), ("..", False), ("eth0:1", False)],
    ids=["short", "fifteen", "sixteen", "empty", "space", "slash", "dotdot", "colon"],
)
def test_validate_ifname(name: str, ok: bool) -> None:
    if ok:
        assert validate_ifname(name) == name
    else:
        with pytest.raises(EnforcementError):
            validate_ifname(name)


@pytest.mark.parametrize("text, ok", [(VF0, True), ("0000:3b:02.8", False), ("3b:02.0", False),
                                      ("eth0", False)],
                         ids=["bdf", "bad-function", "no-domain", "ifname"])
def test_is_bdf(text: str, ok: bool) -> None:
    assert is_bdf(text) is ok


@pytest.mark.parametrize(
    "entries, index, expected",
    [
        ([{"vf": 0, "mac": "00:11:22:33:44:55", "vlan": 100, "qos": 0, "spoofchk": 1,
           "trust": 0, "link_state": 0}], 0,
         VfConfig("00:11:22:33:44:55", 100, 0, True, False, 0)),
        ([{"vf": 0, "mac": "aa:aa:aa:aa:aa:aa"}, {"vf": 1, "mac": "bb:bb:bb:bb:bb:bb",
                                                  "spoofchk": 0xFFFFFFFF}], 1,
         VfConfig(mac="bb:bb:bb:bb:bb:bb")),
        ([{"vf": 0, "mac": "aa:aa:aa:aa:aa:aa"}], 3, None),
    ],
    ids=["full", "unsupported-setting-dropped", "absent-vf"],
)
def test_vf_config_from_dicts(entries, index: int, expected) -> None:
    assert vf_config_from_dicts(entries, index) == expected


def test_vf_config_request_only_sets_known_values() -> None:
    cfg = VfConfig(mac="00:11:22:33:44:55", vlan=10, qos=None, spoofchk=False, trust=None)
    assert cfg.request(2) == {"vf": 2, "mac": "00:11:22:33:44:55",
                              "vlan": {"vlan": 10, "qos": 0}, "spoofchk": 0}


@pytest.mark.parametrize(
    "config",
    [
        VfConfig("00:11:22:33:44:55", 100, 2, True, False, 2),
        VfConfig(mac="02:00:00:00:00:09"),
        VfConfig(mac="02:00:00:00:00:09", vlan=7, spoofchk=False, trust=True),
    ],
    ids=["everything", "mac-only", "vlan-without-qos"],
)
def test_vf_config_round_trips_through_pyroute2_messages(config: VfConfig) -> None:
    """request() -> pyroute2's VF request encoder -> netlink bytes -> decode -> the reader
    used on the PF's IFLA_VFINFO_LIST gives the same config back (no SR-IOV needed)."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
    from pyroute2.requests.link import LinkIPRouteFilter

    from numa_pin.enforcer import vfsettings

    vflist = LinkIPRouteFilter("set").get_vf(config.request(3))
    msg = ifinfmsg()
    msg["attrs"] = [("IFLA_IFNAME", "pf0"), ("IFLA_VFINFO_LIST", vflist)]
    msg.encode()
    decoded = ifinfmsg(msg.data)
    decoded.decode()

    class OnePf:
        def link_lookup(self, ifname: str) -> list[int]:
            return [5] if ifname == "pf0" else []

        def link(self, command: str, index: int, ext_mask: int = 0) -> list:
            return [decoded]

    expected = config if config.vlan is None or config.qos is not None else VfConfig(
        config.mac, config.vlan, 0, config.spoofchk, config.trust, config.link_state)
    assert vfsettings.read_vf_config(OnePf(), "pf0", 3) == expected
    assert vfsettings.read_vf_config(OnePf(), "pf0", 4) is None
    assert vfsettings.read_vf_config(OnePf(), "absent", 3) is None


def test_record_round_trips_through_json() -> None:
    rec = NetdevRecord(host_name="ens1f0v0", container_name="net1", netns="/proc/9/ns/net",
                       bdf=VF0, pf=PF, pf_name="ens1f0", vf_index=0, mac="02:00:00:00:00:01",
                       mtu=9000, was_up=True, ifindex=7,
                       vf_config=VfConfig("02:00:00:00:00:01", 0, 0, True, False, 0))
    assert NetdevRecord.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec
    with pytest.raises(EnforcementError, match="malformed"):
        NetdevRecord.from_dict({"host_name": "x", "bogus": 1})


def test_import_does_not_load_pyroute2() -> None:
    code = ("import sys, numa_pin.enforcer.netdev, numa_pin.enforcer; "
            "print('pyroute2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- privileged: real moves -----------------------------------------------------------
def _netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def wait_for_new_netns(proc: subprocess.Popen[bytes]) -> bool:
    """Wait until ``proc`` (``unshare -n ...``) has left our netns; False if it died."""
    own = os.readlink("/proc/self/ns/net")

    def left_or_died() -> str | None:
        if proc.poll() is not None:
            return "died"
        try:
            return "left" if _netns_of(proc.pid) != own else None
        except OSError:  # not exec'd yet
            return None

    return wait_for(left_or_died, f"unshare -n (pid {proc.pid}) to enter a netns of its own") == "left"


@pytest.fixture
def netns_pid() -> Iterator[int]:
    """The pid of ``unshare -n sleep``, once it is in its own netns."""
    proc = subprocess.Popen(["unshare", "-n", "sleep", "120"])
    try:
        if not wait_for_new_netns(proc):
            pytest.skip("unshare -n failed (no permission for network namespaces)")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def host_link() -> Iterator[str]:
    """A fresh virtual interface in the host netns, deleted afterwards: dummy where the
    kernel has it, else one end of a veth pair (its peer stays home), else ifb."""
    name = "npt" + secrets.token_hex(4)
    for kind in (["dummy"], ["veth", "peer", "name", name + "p"], ["ifb"]):
        if run("ip", "link", "add", name, "type", *kind, check=False).returncode == 0:
            break
    else:
        pytest.skip("neither dummy nor ifb links can be created here")
    try:
        yield name
    finally:
        run("ip", "link", "del", name, check=False)


def host_names() -> set[str]:
    return {ln["ifname"] for ln in json.loads(run("ip", "-j", "link", "show").stdout)}


def ns_links(pid: int) -> dict[str, dict]:
    out = run("nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-j", "link", "show").stdout
    return {ln["ifname"]: ln for ln in json.loads(out)}


def host_link_info(name: str) -> dict:
    return json.loads(run("ip", "-j", "link", "show", "dev", name).stdout)[0]


@pytest.mark.root
@requires_ip
@pytest.mark.parametrize("bring_up", [False, True], ids=["down", "brought-up"])
def test_move_and_restore(netns_pid: int, host_link: str, bring_up: bool) -> None:
    before = host_link_info(host_link)
    rec = move_netdev_to_netns(host_link, netns_pid, "net1", "/sys", "/proc", bring_up=bring_up)
    assert rec.host_name == host_link and rec.container_name == "net1"
    assert rec.mac == before["address"] and rec.mtu == before["mtu"]
    assert rec.netns == f"/proc/{netns_pid}/ns/net"
    assert host_link not in host_names()
    inside = ns_links(netns_pid)
    assert "net1" in inside and host_link not in inside
    assert ("UP" in inside["net1"]["flags"]) is bring_up

    assert restore_netdev(rec, netns_pid, "/sys", "/proc") == host_link
    assert host_link in host_names()
    assert "net1" not in ns_links(netns_pid)
    after = host_link_info(host_link)
    assert (after["address"], after["mtu"]) == (before["address"], before["mtu"])


@pytest.mark.root
@requires_ip
def test_restore_puts_back_mac_and_mtu_changed_inside(netns_pid: int, host_link: str) -> None:
    before = host_link_info(host_link)
    rec = move_netdev_to_netns(host_link, netns_pid, "eth7", "/sys", "/proc")
    ns = f"--net=/proc/{netns_pid}/ns/net"
    run("nsenter", ns, "ip", "link", "set", "dev", "eth7", "mtu", "1280")
    mac_changed = run("nsenter", ns, "ip", "link", "set", "dev", "eth7", "address",
                      "02:aa:bb:cc:dd:ee", check=False).returncode == 0  # ifb cannot
    inside = ns_links(netns_pid)["eth7"]
    assert inside["mtu"] == 1280
    assert (inside["address"] == "02:aa:bb:cc:dd:ee") is mac_changed
    restore_netdev(rec, netns_pid, "/sys", "/proc")
    after = host_link_info(host_link)
    assert (after["address"], after["mtu"]) == (before["address"], before["mtu"])


@pytest.mark.root
@requires_ip
@pytest.mark.parametrize("second_pid", ["same", None], ids=["pid-again", "pid-gone"])
def test_restore_is_idempotent(netns_pid: int, host_link: str, second_pid) -> None:
    rec = move_netdev_to_netns(host_link, netns_pid, "net1", "/sys", "/proc")
    restore_netdev(rec, netns_pid, "/sys", "/proc")
    pid = netns_pid if second_pid == "same" else None
    assert restore_netdev(rec, pid, "/sys", "/proc") == host_link
    assert host_link in host_names()


@pytest.mark.root
@requires_ip
def test_restore_when_host_name_was_taken_meanwhile(netns_pid: int, host_link: str) -> None:
    rec = move_netdev_to_netns(host_link, netns_pid, "net1", "/sys", "/proc")
    squatter = run("ip", "link", "add", host_link, "type", "ifb", check=False)
    if squatter.returncode != 0:
        pytest.skip("cannot create an ifb link")
    try:
        with pytest.raises(EnforcementError, match=f"rename to {host_link}: File exists"):
            restore_netdev(rec, netns_pid, "/sys", "/proc")
        # it is home (out of the container) under its container name, not lost
        assert "net1" in host_names() and "net1" not in ns_links(netns_pid)
    finally:
        run("ip", "link", "del", "net1", check=False)


@pytest.mark.root
@requires_ip
def test_undo_log_moves_it_back(netns_pid: int, host_link: str) -> None:
    undo = UndoLog()
    move_netdev_to_netns(host_link, netns_pid, "net1", "/sys", "/proc", undo=undo)
    assert len(undo) == 1 and host_link not in host_names()
    assert undo.rollback() == ()
    assert host_link in host_names() and "net1" not in ns_links(netns_pid)


@pytest.mark.root
@requires_ip
def test_name_clash_in_container_leaves_device_home(netns_pid: int, host_link: str) -> None:
    kind = host_link_info(host_link).get("linkinfo", {}).get("info_kind", "ifb")
    clash = run("nsenter", f"--net=/proc/{netns_pid}/ns/net", "ip", "link", "add", "net1",
                "type", kind, check=False)
    if clash.returncode != 0:
        pytest.skip(f"cannot create a {kind} link inside the netns")
    with pytest.raises(EnforcementError, match="File exists.*already taken") as err:
        move_netdev_to_netns(host_link, netns_pid, "net1", "/sys", "/proc")
    assert err.value.path == f"/proc/{netns_pid}/ns/net"
    # the kernel moved it before the rename failed; numa-pin brought it straight back
    assert "moved back to the host" in str(err.value)
    assert host_link in host_names()
    assert host_link not in ns_links(netns_pid)


@pytest.mark.root
@requires_ip
def test_move_into_dead_process_fails_cleanly(host_link: str) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(EnforcementError, match="cannot open the network namespace"):
        move_netdev_to_netns(host_link, proc.pid, "net1", "/sys", "/proc")
    assert host_link in host_names()


@pytest.mark.root
@requires_ip
def test_move_unknown_device() -> None:
    with pytest.raises(EnforcementError, match="no network interface 'npt-absent0'"):
        move_netdev_to_netns("npt-absent0", os.getpid(), "net1", "/sys", "/proc")


@pytest.mark.root
@requires_ip
def test_restore_after_netns_died_reports_virtual_device_gone(host_link: str) -> None:
    proc = subprocess.Popen(["unshare", "-n", "sleep", "120"])
    try:
        if not wait_for_new_netns(proc):
            pytest.skip("unshare -n failed")
        rec = move_netdev_to_netns(host_link, proc.pid, "net1", "/sys", "/proc")
    finally:
        proc.kill()
        proc.wait()
    # a virtual device dies with its netns; a VF would come back by BDF instead
    with pytest.raises(EnforcementError, match=f"cannot find network interface {host_link}"):
        restore_netdev(rec, proc.pid, "/sys", "/proc")
