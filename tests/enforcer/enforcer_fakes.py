"""Fakes shared by the enforcer tests: fake cgroup/proc trees and a small fake kernel.

The fake kernel replaces :func:`numa_pin.enforcer.cgroups.write_cgroup_file` and models
the rules the enforcer relies on, independently of the code under test:

* v1: a child's ``cpuset.cpus``/``cpuset.mems`` must be a subset of the parent's
  (the kernel answers EACCES); effective = configured.
* v2: effective = configured ∩ parent's effective (empty configured = inherit).
* ``cgroup.subtree_control`` takes ``+ctrl`` / ``-ctrl`` tokens.
* ``devices.allow`` / ``devices.deny`` maintain ``devices.list`` (``a`` = allow all).

Every write is recorded in order, and writes to chosen files can be made to fail.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from numa_pin.base import cpuset as cpulist
from numa_pin.errors import EnforcementError

MOUNTINFO_V2 = (
    "22 27 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"
)
_V1_LINES = (
    "25 18 0:21 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,mode=755\n"
    "26 25 0:22 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:9 - cgroup "
    "cgroup rw,xattr,name=systemd\n"
    "29 25 0:25 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:10 - cgroup "
    "cgroup rw,cpuset\n"
    "30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:11 - "
    "cgroup cgroup rw,cpu,cpuacct\n"
    "31 25 0:27 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime shared:12 - cgroup "
    "cgroup rw,devices\n"
)
MOUNTINFO_V1 = _V1_LINES
MOUNTINFO_HYBRID = _V1_LINES + (
    "27 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:13 - cgroup2 "
    "cgroup2 rw,nsdelegate\n"
)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def snapshot(root: Path) -> dict[str, str]:
    """Every regular file below ``root`` with its (stripped) content."""
    return {
        str(p.relative_to(root)): p.read_text().strip()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


# ---- fake trees ----------------------------------------------------------------------
@dataclass
class FakeProc:
    root: Path

    def add_pid(self, pid: int | str, cgroup: str, mountinfo: str = MOUNTINFO_V2) -> None:
        write(self.root / str(pid) / "cgroup", cgroup)
        write(self.root / str(pid) / "mountinfo", mountinfo)

    def set_devices(self, text: str) -> None:
        write(self.root / "devices", text)


@dataclass
class FakeCgroupTree:
    """A cgroup mount below ``root``: v1 (``root/cpuset``) or v2 (``root``)."""

    root: Path
    version: int
    online_cpus: str = "0-7"
    online_mems: str = "0-1"

    def __post_init__(self) -> None:
        h = self.hierarchy
        h.mkdir(parents=True, exist_ok=True)
        if self.version == 1:
            for name, val in (("cpuset.cpus", self.online_cpus), ("cpuset.mems", self.online_mems),
                              ("cpuset.effective_cpus", self.online_cpus),
                              ("cpuset.effective_mems", self.online_mems)):
                write(h / name, val + "\n")
        else:
            write(h / "cgroup.controllers", "cpuset cpu io memory pids\n")
            write(h / "cgroup.subtree_control", "cpu memory\n")
            write(h / "cpuset.cpus.effective", self.online_cpus + "\n")
            write(h / "cpuset.mems.effective", self.online_mems + "\n")

    @property
    def hierarchy(self) -> Path:
        return self.root / "cpuset" if self.version == 1 else self.root

    def mkcg(self, rel: str, cpus: str | None = None, mems: str | None = None,
             subtree: str = "") -> Path:
        """Create the cgroup ``rel`` (and missing ancestors) like the kernel would."""
        d = self.hierarchy
        for part in [p for p in rel.split("/") if p]:
            parent, d = d, d / part
            if d.is_dir():
                continue
            d.mkdir()
            if self.version == 1:
                write(d / "cpuset.cpus", "\n")
                write(d / "cpuset.mems", "\n")
                write(d / "cpuset.effective_cpus", "\n")
                write(d / "cpuset.effective_mems", "\n")
            else:
                write(d / "cgroup.subtree_control", "\n")
                write(d / "cpuset.cpus", "\n")
                write(d / "cpuset.mems", "\n")
                write(d / "cpuset.cpus.effective",
                      (parent / "cpuset.cpus.effective").read_text())
                write(d / "cpuset.mems.effective",
                      (parent / "cpuset.mems.effective").read_text())
        if cpus is not None:
            for name in (("cpuset.cpus", "cpuset.effective_cpus") if self.version == 1
                         else ("cpuset.cpus", "cpuset.cpus.effective")):
                write(d / name, cpus + "\n")
        if mems is not None:
            for name in (("cpuset.mems", "cpuset.effective_mems") if self.version == 1
                         else ("cpuset.mems", "cpuset.mems.effective")):
                write(d / name, mems + "\n")
        if subtree and self.version == 2:
            write(d / "cgroup.subtree_control", subtree + "\n")
        return d

    def devices_cg(self, rel: str, listing: str = "a *:* rwm") -> Path:
        d = self.root / "devices" / rel.strip("/")
        d.mkdir(parents=True, exist_ok=True)
        write(d / "devices.allow", "")
        write(d / "devices.deny", "")
        write(d / "devices.list", listing + "\n")
        return d


@dataclass
class FakeKernel:
    """Models kernel reactions to cgroup writes in a fake tree (see module doc)."""

    tree: FakeCgroupTree
    writes: list[tuple[str, str]] = field(default_factory=list)
    fail: dict[str, str] = field(default_factory=dict)  # path -> strerror
    #: cgroup directories with tasks: on v2 the kernel refuses them an empty cpuset (ENOSPC)
    populated: set[str] = field(default_factory=set)

    def __call__(self, path: str, text: str) -> None:
        self.writes.append((path, text))
        if path in self.fail:
            raise EnforcementError(f"writing {text!r} failed: {self.fail[path]}", path=path)
        if not os.path.exists(path):
            raise EnforcementError("cannot open for writing: No such file or directory",
                                   path=path)
        p = Path(path)
        name = p.name
        if name == "cgroup.subtree_control":
            have = p.read_text().split()
            for tok in text.split():
                ctrl = tok[1:]
                if tok.startswith("+") and ctrl not in have:
                    have.append(ctrl)
                elif tok.startswith("-") and ctrl in have:
                    have.remove(ctrl)
            p.write_text(" ".join(have) + "\n")
        elif name in ("cpuset.cpus", "cpuset.mems"):
            self._cpuset(p, name, cpulist.parse_list(text))
        elif name in ("devices.allow", "devices.deny"):
            self._devices(p.parent, name, text.strip())
        else:
            p.write_text(text + "\n")

    def _cpuset(self, p: Path, name: str, want: frozenset[int]) -> None:
        d = p.parent
        at_root = d == self.tree.hierarchy
        kind = "cpus" if name == "cpuset.cpus" else "mems"
        if self.tree.version == 1:
            if not at_root:
                parent_cfg = cpulist.parse_list((d.parent / name).read_text())
                if not want <= parent_cfg:
                    raise EnforcementError(f"writing {cpulist.format_list(want)!r} failed: "
                                           "Permission denied", path=str(p))
            for child in (c for c in d.iterdir() if c.is_dir()):  # a child must stay inside it
                if not cpulist.parse_list((child / name).read_text()) <= want:
                    raise EnforcementError(f"writing {cpulist.format_list(want)!r} failed: "
                                           "Device or resource busy", path=str(p))
            p.write_text(cpulist.format_list(want) + "\n")
            (d / f"cpuset.effective_{kind}").write_text(cpulist.format_list(want) + "\n")
            return
        if not want and str(d) in self.populated:
            raise EnforcementError("writing '' failed: No space left on device", path=str(p)) from OSError(
                errno.ENOSPC, os.strerror(errno.ENOSPC))
        parent_eff = cpulist.parse_list((d.parent / f"cpuset.{kind}.effective").read_text())
        eff = (want & parent_eff) if want else parent_eff
        p.write_text(cpulist.format_list(want) + "\n")
        (d / f"cpuset.{kind}.effective").write_text(cpulist.format_list(eff) + "\n")

    def _devices(self, d: Path, name: str, rule: str) -> None:
        listing = [ln for ln in (d / "devices.list").read_text().splitlines() if ln.strip()]
        if name == "devices.allow":
            if rule == "a":
                listing = ["a *:* rwm"]
            elif "a *:* rwm" not in listing and rule not in listing:
                listing.append(rule)
        else:
            if rule == "a":
                listing = []
            elif rule in listing:
                listing.remove(rule)
        (d / "devices.list").write_text("".join(f"{ln}\n" for ln in listing))


# ---- privileged helpers --------------------------------------------------------------
requires_ip = pytest.mark.skipif(
    shutil.which("ip") is None or shutil.which("unshare") is None
    or shutil.which("nsenter") is None,
    reason="needs ip, unshare and nsenter (iproute2, util-linux)",
)


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


class FakeLibbpf:
    """Stands in for :class:`numa_pin.enforcer.bpfdev.Libbpf`: device programs attached to
    cgroup directories (found from the fd, as the kernel does), kept as instruction bytes.

    ``protected`` program ids answer EPERM when opened (an LSM label); ``fail`` maps an
    operation (``load``, ``replace``) to the errno its next call answers, and ``fail_after``
    lets that many calls succeed first.
    """

    def __init__(self) -> None:
        self.attached: dict[str, list[int]] = {}
        self.flags: dict[str, int] = {}
        self.programs: dict[int, bytes] = {}
        self.protected: set[int] = set()
        self.fail: dict[str, int] = {}
        self.fail_after: dict[str, int] = {}
        self.calls: list[str] = []
        self._fds: dict[int, int] = {}
        self._next = 100

    def attach(self, directory: str | os.PathLike[str], insns: bytes, flags: int = 2) -> int:
        prog_id = self._new(insns)
        path = os.path.realpath(directory)
        self.attached.setdefault(path, []).append(prog_id)
        self.flags[path] = flags
        return prog_id

    def on(self, directory: str | os.PathLike[str]) -> list[bytes]:
        return [self.programs[i] for i in self.attached.get(os.path.realpath(directory), [])]

    def _new(self, insns: bytes) -> int:
        self._next += 1
        self.programs[self._next] = insns
        return self._next

    def _fd(self, prog_id: int) -> int:
        fd = os.open(os.devnull, os.O_RDONLY)
        self._fds[fd] = prog_id
        return fd

    def _maybe_fail(self, op: str) -> None:
        self.calls.append(op)
        if op in self.fail:
            if self.fail_after.get(op, 0) > 0:
                self.fail_after[op] -= 1
                return
            err = self.fail.pop(op)
            raise OSError(err, f"{op}: {os.strerror(err)}")

    @staticmethod
    def _path(cg_fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{cg_fd}")

    def query(self, cg_fd: int) -> tuple[int, tuple[int, ...]]:
        path = self._path(cg_fd)
        return self.flags.get(path, 0), tuple(self.attached.get(path, ()))

    def prog_fd(self, prog_id: int) -> int:
        if prog_id in self.protected:
            raise OSError(1, "BPF_PROG_GET_FD_BY_ID: Operation not permitted")
        return self._fd(prog_id)

    def read(self, prog_fd: int, prog_id: int):
        from numa_pin.enforcer.bpfdev import Program

        return Program(prog_id, "fake", True, self.programs[self._fds[prog_fd]])

    def load(self, insns: bytes, name: str, gpl: bool) -> int:
        self._maybe_fail("load")
        return self._fd(self._new(insns))

    def replace(self, cg_fd: int, new_fd: int, old_fd: int, attach_flags: int) -> None:
        self._maybe_fail("replace")
        ids = self.attached[self._path(cg_fd)]
        ids[ids.index(self._fds[old_fd])] = self._fds[new_fd]
