"""A netlink fake for SR-IOV VFs: host and container network namespaces, a PF whose VFs have
PF-side state, and the pyroute2 calls :mod:`numa_pin.enforcer.netdev` makes.

The PF-side state goes through pyroute2 itself both ways: a ``link('set', vf=...)`` request is
encoded by pyroute2's request filter into netlink bytes and decoded again before the fake
applies it attribute by attribute, the way the kernel's ``do_setvfinfo`` does (a refused one
stops there, leaving the earlier ones applied); the PF's ``IFLA_VFINFO_LIST`` is encoded the
same way. A request pyroute2 cannot encode fails as it would on a real system.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.requests.link import LinkIPRouteFilter

PF = "0000:3b:00.0"
VF0 = "0000:3b:02.0"
VF1 = "0000:3b:02.1"
HOST = "host"
_NLA = {"IFLA_VF_MAC": "mac", "IFLA_VF_VLAN": "vlan", "IFLA_VF_SPOOFCHK": "spoofchk", "IFLA_VF_TRUST": "trust",
        "IFLA_VF_LINK_STATE": "link_state", "IFLA_VF_RATE": "rate"}


def fake_sysfs(tmp_path: Path) -> Path:
    """A /sys with PF ens1f0 (PCI PF) and its VFs ens1f0v0 (VF0) and ens1f0v1 (VF1)."""
    root = tmp_path / "sys"
    devs = root / "bus" / "pci" / "devices"
    real = root / "devices" / "pci0000:3a" / "0000:3a:00.0"
    devs.mkdir(parents=True)
    for bdf, net in ((PF, "ens1f0"), (VF0, "ens1f0v0"), (VF1, "ens1f0v1")):
        (real / bdf / "net" / net).mkdir(parents=True)
        (devs / bdf).symlink_to(os.path.relpath(real / bdf, devs))
    for i, vf in enumerate((VF0, VF1)):
        (real / PF / f"virtfn{i}").symlink_to(f"../{vf}")
        (real / vf / "physfn").symlink_to(f"../{PF}")
    return root


def vf_state(mac: str = "00:00:00:00:00:00", vlan: int = 0, qos: int = 0, spoofchk: int = 1, trust: int = 0,
             link_state: int = 0, rate: tuple[int, int] | None = (0, 0)) -> dict[str, Any]:
    """One VF's PF-side state as the fake keeps it (``rate``: (min, max), None: not reported)."""
    return {"mac": mac, "vlan": vlan, "qos": qos, "spoofchk": spoofchk, "trust": trust, "link_state": link_state,
            "rate": rate}


class Link:
    def __init__(self, name: str, mac: str, bdf: str | None = None, mtu: int = 1500, up: bool = False) -> None:
        self.name, self.mac, self.bdf, self.mtu, self.up = name, mac, bdf, mtu, up

    def get_attr(self, name: str) -> Any:
        return {"IFLA_IFNAME": self.name, "IFLA_ADDRESS": self.mac, "IFLA_MTU": self.mtu,
                "IFLA_PARENT_DEV_NAME": self.bdf}.get(name)

    def __getitem__(self, key: str) -> Any:
        assert key == "flags"
        return 1 if self.up else 0


class World:
    """Every namespace's links (by ifindex), the PF's VFs, and which calls the "driver" refuses."""

    def __init__(self, proc_root: Path) -> None:
        self.proc_root = str(proc_root)
        self.ns: dict[str, dict[int, Link]] = {HOST: {
            2: Link("ens1f0", "0c:42:a1:00:00:01", PF, up=True),
            3: Link("ens1f0v0", "0e:00:00:00:00:03", VF0, up=True),
            4: Link("ens1f0v1", "0e:00:00:00:00:04", VF1),
        }}
        self.pf_index = 2
        self.vfs: dict[int, dict[str, Any]] = {0: vf_state(vlan=5, qos=1), 1: vf_state()}
        self.fds: dict[int, str] = {}
        #: (index, attribute) -> errno: the driver refuses that change. ``(None, key)``: changing a
        #: VF setting (``mac``, ``vlan``, ``rate``, ``spoofchk``, ``trust``, ``link_state``; setting
        #: the value it has is accepted); ``(ifindex, key)``: a link attribute (``state=up``,
        #: ``state=down``, ``address``, ``mtu``, ``ifname``, ``net_ns_fd``)
        self.refuse: dict[tuple[int | None, str], int] = {}
        self.calls: list[tuple[str, int, dict[str, Any]]] = []

    def netns_path(self, pid: int | str) -> str:
        return os.path.join(self.proc_root, str(pid), "ns", "net")

    def add_netns(self, pid: int) -> str:
        path = self.netns_path(pid)
        self.ns[path] = {}
        return path

    def open_netns(self, path: str) -> int:
        from numa_pin.errors import EnforcementError

        key = HOST if path == os.path.join(self.proc_root, "self", "ns", "net") else path
        if key not in self.ns:
            raise EnforcementError("cannot open the network namespace: No such file or directory", path=path)
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.fds[fd] = key
        return fd

    def where(self, bdf: str) -> tuple[str, str] | None:
        """(namespace, name) of the netdev of ``bdf``."""
        for ns, links in self.ns.items():
            for link in links.values():
                if link.bdf == bdf:
                    return ns, link.name
        return None

    def link_of(self, bdf: str) -> Link:
        for links in self.ns.values():
            for link in links.values():
                if link.bdf == bdf:
                    return link
        raise KeyError(bdf)

    def install(self, monkeypatch: Any) -> None:
        from numa_pin.enforcer import netlink
        from numa_pin.errors import EnforcementError

        @contextmanager
        def iproute(netns: str | None = None) -> Iterator[FakeIPRoute]:
            key = HOST if netns is None else netns
            if key not in self.ns:
                raise EnforcementError("cannot open a netlink socket: No such file", path=netns)
            yield FakeIPRoute(self, key)

        monkeypatch.setattr(netlink, "iproute", iproute)
        monkeypatch.setattr(netlink, "open_netns", self.open_netns)


def _refused(code: int) -> NetlinkError:
    return NetlinkError(code, os.strerror(code))


class FakeIPRoute:
    def __init__(self, world: World, ns: str) -> None:
        self.world, self.ns = world, ns

    @property
    def links(self) -> dict[int, Link]:
        return self.world.ns[self.ns]

    def link_lookup(self, ifname: str) -> list[int]:
        return [i for i, link in self.links.items() if link.name == ifname]

    def link(self, command: str, index: int, ext_mask: int = 0, **kw: Any) -> list[Any]:
        if index not in self.links:
            raise _refused(errno.ENODEV)
        if command == "get":
            if ext_mask and index == self.world.pf_index and self.ns == HOST:
                return [self._pf_message()]
            return [self.links[index]]
        assert command == "set", command
        self.world.calls.append((self.ns, index, dict(kw)))
        link = self.links[index]
        if "vf" in kw:
            self._set_vf(index, kw["vf"])
            return []
        for key in kw:
            code = self.world.refuse.get((index, f"state={kw['state']}" if key == "state" else key))
            if code:
                raise _refused(code)
        if "net_ns_fd" in kw:
            target = self.world.ns[self.world.fds[kw["net_ns_fd"]]]
            new_name = kw.get("ifname", link.name)
            del self.links[index]
            target[index] = link  # moved first, renamed second, as the kernel does
            if any(other.name == new_name for i, other in target.items() if i != index):
                raise _refused(errno.EEXIST)
            link.name = new_name
            return []
        if "ifname" in kw:
            link.name = kw["ifname"]
        if "state" in kw:
            link.up = kw["state"] == "up"
        if "address" in kw:
            link.mac = kw["address"].lower()
        if "mtu" in kw:
            link.mtu = kw["mtu"]
        return []

    def _set_vf(self, index: int, request: dict[str, Any]) -> None:
        assert index == self.world.pf_index and self.ns == HOST, "VF settings go to the PF in the host netns"
        msg = ifinfmsg()
        msg["attrs"] = [("IFLA_VFINFO_LIST", LinkIPRouteFilter("set").get_vf(dict(request)))]
        msg.encode()
        decoded = ifinfmsg(msg.data)
        decoded.decode()
        for info in decoded.get_attr("IFLA_VFINFO_LIST").get_attrs("IFLA_VF_INFO"):
            for name, value in info["attrs"]:
                key = _NLA[name]
                vf = self.world.vfs[value["vf"]]
                code = self.world.refuse.get((None, key))
                if code and self._changes(vf, key, value):
                    raise _refused(code)
                if key == "vlan":
                    vf["vlan"], vf["qos"] = value["vlan"], value["qos"]
                elif key == "rate":
                    if vf["rate"] is None:
                        raise _refused(errno.EOPNOTSUPP)
                    vf["rate"] = (value["min_tx_rate"], value["max_tx_rate"])
                else:
                    vf[key] = value[key]

    @staticmethod
    def _changes(vf: dict[str, Any], key: str, value: dict[str, Any]) -> bool:
        if key == "vlan":
            return (vf["vlan"], vf["qos"]) != (value["vlan"], value["qos"])
        if key == "rate":
            return vf["rate"] != (value["min_tx_rate"], value["max_tx_rate"])
        return bool(vf[key] != value[key])

    def _pf_message(self) -> Any:
        specs = []
        for n, vf in sorted(self.world.vfs.items()):
            spec: dict[str, Any] = {"vf": n, "mac": vf["mac"], "vlan": {"vlan": vf["vlan"], "qos": vf["qos"]},
                                    "spoofchk": vf["spoofchk"], "trust": vf["trust"], "link_state": vf["link_state"]}
            if vf["rate"] is not None:
                spec["rate"] = {"min_tx_rate": vf["rate"][0], "max_tx_rate": vf["rate"][1]}
            specs.append(spec)
        msg = ifinfmsg()
        msg["attrs"] = [("IFLA_IFNAME", "ens1f0"), ("IFLA_VFINFO_LIST", LinkIPRouteFilter("set").get_vf(specs))]
        msg.encode()
        decoded = ifinfmsg(msg.data)
        decoded.decode()
        return decoded

