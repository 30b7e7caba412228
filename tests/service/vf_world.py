"""A node with an SR-IOV PF whose VFs have PF-side state, for the service's VF tests.

The machine is the kit's ``gpu8-sriov`` (PF ``ens2f0`` at 0000:32:00.0, VFs 0000:32:01.0-3 as
``ens2f0v0``-``3``); netlink is the enforcer tests' fake (``tests/enforcer/netlink_fakes.py``:
its requests go through pyroute2's encoder and decoder), given this machine's links. Crashes are
injected at the fake's writes: :class:`Crash` is a SIGKILL of the hook (nothing after it runs,
no rollback, no commit), :func:`crash_at` arms one.
"""

from __future__ import annotations

import errno
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer.saved import Saved
from numa_pin.requests.request import request_from_oci
from numa_pin.testing.node import FakeNode

_spec = importlib.util.spec_from_file_location(
    "service_netlink_fakes", Path(__file__).resolve().parents[1] / "enforcer" / "netlink_fakes.py")
assert _spec is not None and _spec.loader is not None
fakes: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

HOST = fakes.HOST
PF = "0000:32:00.0"
VFS = tuple(f"0000:32:01.{i}" for i in range(4))
VF_RES = "example.com/vf"
SETTINGS = "vlan=100,vlanQoS=3,trust=on,spoofchk=off,mac=02:00:5e:00:00:07,max_tx_rate=1000,link_state=enable"


class Crash(BaseException):
    """The hook killed at this instant: no handler, no rollback, no commit runs after it."""


class VfNode(FakeNode):
    """gpu8-sriov with a VF resource (scope container) and the fake netlink world."""

    def __init__(self, root: Path, machines: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(root, "gpu8-sriov", machines=machines, cpus="0-127", mems="0-3")
        extra: dict[str, Any] = {"policy": "best-effort",
                                 "devices": {VF_RES: [{"is_vf": True, "has_netdev": True, "pf_names": ["ens2f0"]}]}}
        self.config = config_from_dict(self.config_dict(**extra))
        self.config_file = self.write_config(**extra)  # for the commands (numa-pin recover)
        world = fakes.World(self.proc_root)
        world.ns[HOST] = {2: fakes.Link("ens2f0", "0c:42:a1:00:00:01", PF, up=True)}
        for i, bdf in enumerate(VFS):
            world.ns[HOST][10 + i] = fakes.Link(f"ens2f0v{i}", f"0e:00:00:00:00:1{i}", bdf, up=True)
        world.pf_index = 2
        world.vfs = {i: fakes.vf_state(vlan=5 * i, qos=i % 2, rate=(0, 0)) for i in range(4)}
        world.install(monkeypatch)
        self.world = world
        self.monkeypatch = monkeypatch
        self.original = self.snapshot()
        self.armed: tuple[int, type[BaseException]] | None = None  # (writes left before it, what is raised)
        self.writes = 0
        real = fakes.FakeIPRoute.link

        def link(ipr: Any, command: str, index: int, ext_mask: int = 0, **kw: Any) -> list[Any]:
            if command != "set":
                return real(ipr, command, index, ext_mask, **kw)
            if self.armed is not None and self.armed[0] == 0:
                self._fire()  # before this write (a kill right after the journal, or a refusal)
            out = real(ipr, command, index, ext_mask, **kw)
            self.writes += 1
            if self.armed is not None:
                self.armed = (self.armed[0] - 1, self.armed[1])
                if self.armed == (0, Crash):
                    self._fire()  # killed after this write
            return out

        monkeypatch.setattr(fakes.FakeIPRoute, "link", link)
        from numa_pin.service.base import ServiceBase

        roll_back = ServiceBase._roll_back

        def killed_or_rolled_back(svc: ServiceBase, undo: Any, exc: BaseException, cid: str) -> None:
            if not isinstance(exc, Crash):  # a killed hook undoes nothing
                roll_back(svc, undo, exc, cid)

        monkeypatch.setattr(ServiceBase, "_roll_back", killed_or_rolled_back)

    def _fire(self) -> None:
        assert self.armed is not None
        kind, self.armed = self.armed[1], None
        if kind is Crash:
            raise Crash()
        raise fakes.NetlinkError(errno.EIO, os.strerror(errno.EIO))

    def crash_at(self, writes: int, kind: type[BaseException] = Crash) -> None:
        """Kill the hook (:class:`Crash`) after the ``writes``-th netlink write from now (0: before
        the first, once the journal holds the move), or have the next write after those refused
        (any other ``kind``: a netlink error, the write not made); the service rolls back anything
        but a :class:`Crash`."""
        self.armed = (writes, kind)

    def snapshot(self) -> tuple[dict[int, dict[str, Any]], dict[str, tuple[str, str, str]]]:
        """(every VF's PF-side state, ``{vf: (netns, name, mac)}`` of every VF netdev)."""
        where = {bdf: (*self.world.where(bdf), self.world.link_of(bdf).mac) for bdf in VFS}
        return {n: dict(vf) for n, vf in self.world.vfs.items()}, where

    def start(self, cid: str, pid: int, pod: str | None = None) -> int:
        """Container ``cid``'s init ``pid``, in a network namespace of its own (for the fake
        netlink) that is also the fake proc's netns ``pod`` when given (a pod's namespace)."""
        self.add_container(cid, pid, netns=pod)
        self.world.add_netns(pid)
        return pid

    def die(self, cid: str, pid: int, *, renamed: bool = False) -> None:
        """The container ends: its netns goes, and the kernel gives its physical VFs back to the
        host under the names they have there; ``renamed``: under their names in the kit's sysfs,
        which the fake cannot change (as a udev rule names a NIC that arrives)."""
        self.stop_container(cid, pid)
        gone = self.world.ns.pop(self.world.netns_path(pid), {})
        if renamed:
            for link in gone.values():
                link.name = f"ens2f0v{VFS.index(link.bdf)}"
        self.world.ns[HOST].update(gone)

    def journaled(self) -> dict[str, dict[str, Any]]:
        return Saved(str(self.state_dir)).of_knob("sriov-vf")


def vf_request(cid: str, settings: str | None = SETTINGS, count: int = 1, pod: str | None = None):
    """A container asking ``count`` VFs with ``settings``; in pod ``pod`` at pod scope when given."""
    annotations = {"numa-pin.io/devices": f"{VF_RES}={count}"}
    if pod is not None:
        annotations.update({"io.kubernetes.cri.sandbox-id": pod, "numa-pin.io/scope": "pod"})
    if settings:
        annotations["numa-pin.io/vf-config"] = settings
    return request_from_oci(cid, annotations)
