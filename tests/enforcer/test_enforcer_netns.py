"""Network namespace identity and membership (enforcer/netns.py): fake proc trees, and real
namespaces (root) with ``unshare -n`` and ``nsenter`` as the processes and ``/proc`` as the oracle."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from enforcer_fakes import requires_ip

from numa_pin.enforcer.netns import find_netns_member, netns_id
from numa_pin.errors import EnforcementError
from waitfor import wait_for


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """Fake proc: pids 10 and 30 share netns "pod", 20 is alone in "other"; 40 has no ns/net."""
    root = tmp_path / "proc"
    for pid, ns in ((10, "pod"), (20, "other"), (30, "pod")):
        (tmp_path / "ns").mkdir(exist_ok=True)
        (tmp_path / "ns" / ns).touch()
        (root / str(pid) / "ns").mkdir(parents=True)
        (root / str(pid) / "ns" / "net").symlink_to(tmp_path / "ns" / ns)
    (root / "40").mkdir()
    (root / "self").mkdir()
    return root


def test_processes_of_one_namespace_share_its_identity(proc: Path) -> None:
    assert netns_id(10, proc) == netns_id(30, proc) != netns_id(20, proc)


def test_a_gone_process_is_an_error_naming_the_file(proc: Path) -> None:
    with pytest.raises(EnforcementError, match="cannot read the network namespace of pid 99") as info:
        netns_id(99, proc)
    assert info.value.path == str(proc / "99" / "ns" / "net")


@pytest.mark.parametrize(("prefer", "expected"), [((), 10), ((30,), 30), ((20, 99, 30), 30)],
                         ids=["lowest-pid", "preferred", "preferred-in-order"])
def test_find_member(proc: Path, prefer: tuple[int, ...], expected: int) -> None:
    assert find_netns_member(netns_id(10, proc), proc, prefer) == expected


def test_no_member_left(proc: Path) -> None:
    ident = netns_id(20, proc)
    (proc / "20" / "ns" / "net").unlink()
    assert find_netns_member(ident, proc) is None
    assert find_netns_member(ident, proc / "absent") is None


@pytest.fixture
def sandbox() -> Iterator[tuple[int, int]]:
    """``(pause, member)``: ``unshare -n sleep`` and a ``sleep`` that joined its netns."""
    pause = subprocess.Popen(["unshare", "-n", "sleep", "60"])
    procs = [pause]
    try:
        own = os.stat("/proc/self/ns/net").st_ino

        def left(proc: subprocess.Popen[bytes]) -> bool:
            return os.stat(f"/proc/{proc.pid}/ns/net").st_ino != own

        wait_for(lambda: pause.poll() is not None or left(pause), "unshare -n to enter a netns of its own")
        if pause.poll() is not None:
            pytest.skip("unshare -n failed")
        member = subprocess.Popen(["nsenter", f"--net=/proc/{pause.pid}/ns/net", "sleep", "60"])
        procs.append(member)
        wait_for(lambda: left(member), "nsenter to join the pause's netns")
        yield pause.pid, member.pid
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.root
@requires_ip
def test_real_namespaces(sandbox: tuple[int, int]) -> None:
    pause, member = sandbox
    ident = netns_id(pause, "/proc")
    assert netns_id(member, "/proc") == ident != netns_id(os.getpid(), "/proc")
    st = os.stat(f"/proc/{pause}/ns/net")
    assert ident == f"{st.st_dev}:{st.st_ino}"
    assert find_netns_member(ident, "/proc", (member,)) == member
    assert find_netns_member(ident, "/proc") in (pause, member)
