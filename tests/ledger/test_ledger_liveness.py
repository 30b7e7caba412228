"""Liveness of grants (pid + start time, or cgroup) and pure garbage collection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ledger_factories import grant

from numa_pin.errors import CgroupEscapeError, SysfsError
from numa_pin.ledger.liveness import (
    BOOT_TIME_TTL_S,
    START_TIME_TOLERANCE_S,
    BootTimes,
    cgroup_dir,
    collect_garbage,
    detect_cgroup_version,
    is_alive,
    process_alive,
    process_start_time,
)
from numa_pin.ledger.model import LedgerState, PodRecord
from waitfor import wait_for

BTIME = 1_700_000_000
HZ = os.sysconf("SC_CLK_TCK")


def _stat_line(pid: int, comm: str, state: str, starttime: int) -> str:
    # fields after "(comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt
    # cmajflt utime stime cutime cstime priority nice threads itrealvalue starttime ...
    rest = [state, "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(starttime)] + ["0"] * 24
    return f"{pid} ({comm}) {' '.join(rest)}\n"


@pytest.fixture
def fake_proc(tmp_path: Path) -> Path:
    """A proc tree: pid 100 running, 200 zombie, 300 running with a ')' in its name."""
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BTIME}\nprocesses 5\n")
    for pid, comm, state, ticks in ((100, "pause", "S", 5000), (200, "dead", "Z", 6000), (300, "a) (b", "R", 7000)):
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(_stat_line(pid, comm, state, ticks))
    return root


def _created(ticks: int) -> float:
    return ticks / HZ + BTIME  # psutil's formula, spelled out


@pytest.fixture
def cgroups(tmp_path: Path) -> dict[str, Path]:
    v1 = tmp_path / "v1"
    (v1 / "cpuset" / "kubepods" / "alive").mkdir(parents=True)
    (v1 / "memory" / "kubepods" / "only-in-memory").mkdir(parents=True)
    v2 = tmp_path / "v2"
    (v2 / "kubepods" / "alive").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpuset cpu memory\n")
    return {"v1": v1, "v2": v2}


LIVENESS = [
    ("pid_same_start", {"pid": 100, "start_time": _created(5000), "cgroup": None}, "v1", True),
    ("pid_within_tolerance",
     {"pid": 100, "start_time": _created(5000) + START_TIME_TOLERANCE_S / 2, "cgroup": None}, "v1", True),
    ("pid_reused", {"pid": 100, "start_time": _created(5000) - 3600, "cgroup": None}, "v1", False),
    ("pid_no_start_time", {"pid": 100, "start_time": None, "cgroup": None}, "v1", True),
    ("pid_zombie", {"pid": 200, "start_time": _created(6000), "cgroup": None}, "v1", False),
    ("pid_gone", {"pid": 999, "start_time": None, "cgroup": None}, "v1", False),
    ("comm_with_parens", {"pid": 300, "start_time": _created(7000), "cgroup": None}, "v1", True),
    ("v1_cgroup_alive", {"pid": 999, "cgroup": "kubepods/alive"}, "v1", True),
    ("v1_cgroup_leading_slash", {"pid": None, "cgroup": "/kubepods/alive"}, "v1", True),
    ("v1_only_other_hierarchy", {"pid": None, "cgroup": "kubepods/only-in-memory"}, "v1", False),
    ("v1_cgroup_gone", {"pid": 999, "cgroup": "kubepods/gone"}, "v1", False),
    ("v2_cgroup_alive", {"pid": None, "cgroup": "kubepods/alive"}, "v2", True),
    ("v2_cgroup_gone", {"pid": None, "cgroup": "kubepods/gone"}, "v2", False),
    ("pid_alive_cgroup_gone", {"pid": 100, "start_time": None, "cgroup": "kubepods/gone"}, "v2", True),
    ("no_evidence_dropped", {"pid": None, "start_time": None, "cgroup": None}, "v1", False),  # was kept forever
]


@pytest.mark.parametrize(("fields", "layout", "alive"), [c[1:] for c in LIVENESS], ids=[c[0] for c in LIVENESS])
def test_is_alive_with_fake_roots(
    fake_proc: Path, cgroups: dict[str, Path], fields: dict[str, Any], layout: str, alive: bool
) -> None:
    g = grant("c", **{"start_time": None, **fields})
    assert is_alive(g, str(fake_proc), str(cgroups[layout])) is alive


def test_detect_cgroup_version(cgroups: dict[str, Path]) -> None:
    assert detect_cgroup_version(str(cgroups["v1"])) == 1
    assert detect_cgroup_version(str(cgroups["v2"])) == 2
    assert cgroup_dir("a/b", "/cg", 1) == "/cg/cpuset/a/b"
    assert cgroup_dir("/a/b", "/cg", 2) == "/cg/a/b"
    assert cgroup_dir("", "/cg", 2) == "/cg"


@pytest.mark.parametrize("path", ["../etc", "a/../../x", "/../../../etc/passwd"], ids=["dotdot", "nested", "absolute"])
def test_cgroup_escape_is_refused(cgroups: dict[str, Path], path: str) -> None:
    with pytest.raises(CgroupEscapeError):
        is_alive(grant("c", pid=None, cgroup=path), "/nonexistent-proc", str(cgroups["v2"]))


@pytest.mark.parametrize(
    ("content", "word"),
    [("100 (x) S 1 2\n", "starttime"), ("garbage", "starttime")],
    ids=["short", "no-parens"],
)
def test_unparsable_stat_is_sysfs_error(fake_proc: Path, content: str, word: str) -> None:
    (fake_proc / "100" / "stat").write_text(content)
    with pytest.raises(SysfsError, match=word):
        process_alive(100, None, str(fake_proc))


def test_missing_btime_is_sysfs_error(fake_proc: Path) -> None:
    (fake_proc / "stat").write_text("cpu 1 2 3\n")
    with pytest.raises(SysfsError, match="btime"):
        process_alive(100, None, str(fake_proc))


def test_boot_times_are_read_at_most_once_a_second_by_their_owner_only(
        fake_proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: the boot time lives on the owner passed in (a node, or the agent child's warm
    state), not in a module global: read once per :data:`BOOT_TIME_TTL_S` through it; another
    owner, or no owner, reads the file for itself."""
    from numa_pin.ledger import liveness

    now = [1000.0]
    monkeypatch.setattr(liveness.time, "monotonic", lambda: now[0])
    owner = BootTimes()
    assert process_start_time(100, str(fake_proc), owner) == _created(5000)
    (fake_proc / "stat").write_text(f"btime {BTIME + 7}\n")
    now[0] += BOOT_TIME_TTL_S / 2
    assert process_start_time(100, str(fake_proc), owner) == _created(5000)  # kept
    assert process_alive(100, _created(5000), str(fake_proc), owner)
    assert process_start_time(100, str(fake_proc), BootTimes()) == _created(5000) + 7  # another owner's
    assert process_start_time(100, str(fake_proc)) == _created(5000) + 7  # no owner: read
    now[0] += BOOT_TIME_TTL_S
    assert process_start_time(100, str(fake_proc), owner) == _created(5000) + 7  # a second on: read again


# ---- the real /proc: psutil path, and the direct reader as an oracle for each other ---


def test_real_proc_current_process() -> None:
    psutil = pytest.importorskip("psutil")
    created = psutil.Process().create_time()
    assert process_alive(os.getpid(), created, "/proc")
    assert not process_alive(os.getpid(), created - 3600, "/proc")  # "reused pid"


def test_direct_reader_agrees_with_psutil(tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil")
    link = tmp_path / "proc"
    link.symlink_to("/proc")  # not "/proc" by name: forces the direct reader on real data
    created = process_start_time(os.getpid(), str(link))
    assert created is not None
    assert abs(created - psutil.Process().create_time()) < 1e-6
    assert process_alive(os.getpid(), psutil.Process().create_time(), str(link))


@pytest.mark.parametrize("proc_root", ["/proc", "symlink"], ids=["psutil", "direct"])
def test_exited_and_zombie_processes_are_dead(tmp_path: Path, proc_root: str) -> None:
    if proc_root == "symlink":
        (tmp_path / "proc").symlink_to("/proc")
        proc_root = str(tmp_path / "proc")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    pid = child.pid

    def zombie() -> bool:  # exited, not reaped
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] == "Z"

    wait_for(zombie, f"pid {pid} to exit (a zombie until reaped)")
    assert not process_alive(pid, None, proc_root)  # zombie
    child.wait()
    assert not process_alive(pid, None, proc_root)  # reaped (pid reuse this fast is implausible)


# ---- garbage collection ------------------------------------------------------------


def _gc_state() -> LedgerState:
    return LedgerState(
        {
            "a1": grant("a1", pod_id="pa"),
            "a2": grant("a2", pod_id="pa"),
            "b1": grant("b1", pod_id="pb"),
            "p": grant("p", pod_id="", kind="process"),
        },
        {"pa": PodRecord("pa"), "pb": PodRecord("pb"), "orphan": PodRecord("orphan")},
    )


GC = [
    ("all_alive", {"a1", "a2", "b1", "p"}, (), {"pa", "pb"}),
    ("one_of_pod", {"a2", "b1", "p"}, ("a1",), {"pa", "pb"}),
    ("whole_pod", {"a1", "a2", "p"}, ("b1",), {"pa"}),
    ("everything", set(), ("a1", "a2", "b1", "p"), set()),
]


@pytest.mark.parametrize(("alive", "removed", "pods"), [c[1:] for c in GC], ids=[c[0] for c in GC])
def test_collect_garbage(alive: set[str], removed: tuple[str, ...], pods: set[str]) -> None:
    state = _gc_state()
    before = state.to_dict()
    new, dropped = collect_garbage(state, lambda g: g.container_id in alive)
    assert tuple(g.container_id for g in dropped) == removed
    assert set(new.grants) == alive
    assert set(new.pods) == pods  # the orphan pod record always goes
    assert state.to_dict() == before  # pure


def test_collect_garbage_without_changes_returns_same_state() -> None:
    state = LedgerState({"a": grant("a", pod_id="p")}, {"p": PodRecord("p")})
    new, dropped = collect_garbage(state, lambda g: True)
    assert new is state and dropped == ()


@pytest.mark.parametrize(("offset", "alive"), [(0.0, True), (START_TIME_TOLERANCE_S * 5, False)],
                         ids=["recorded-start-time", "a-recycled-pid's-start-time"])
def test_the_real_proc_goes_through_the_same_start_time_reader(offset: float, alive: bool) -> None:
    """One implementation of a process's start time: the real ``/proc`` is read by the same
    reader as any other proc root (no second, psutil-based one), and a hook that checks
    liveness never imports psutil."""
    code = (
        "import os, sys\n"
        "from numa_pin.ledger.liveness import process_alive, process_start_time\n"
        "start = process_start_time(os.getpid(), '/proc')\n"
        f"print(process_alive(os.getpid(), start + {offset!r}, '/proc'), 'psutil' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [str(alive), "False"]


@pytest.mark.parametrize("version", [1, 2])
def test_a_recorded_cgroup_that_symlinks_out_of_the_root_is_refused(tmp_path: Path, version: int) -> None:
    """Liveness finds a grant's cgroup the way enforcement does (one implementation,
    ``enforcer.cgroups.hierarchy_dir``): a symlink in the hierarchy that leads out of the cgroup
    root is an escape, as it is for a cpuset write, never a directory to read ``cgroup.procs`` in."""
    outside = tmp_path / "outside"
    (outside / "x").mkdir(parents=True)
    (outside / "x" / "cgroup.procs").write_text("4242\n")
    root = tmp_path / "cg"
    hierarchy = root / "cpuset" if version == 1 else root
    hierarchy.mkdir(parents=True)
    (hierarchy / "evil").symlink_to(outside)
    with pytest.raises(CgroupEscapeError):
        cgroup_dir("evil/x", str(root), version)
