"""State, cache and socket paths that a non-root user could write are never followed or trusted
(issue 10, §3). Before each fix:

* ``ledger.lock`` was followed through a symlink and its target truncated;
* a symlinked ``reasons/`` was followed;
* the topology cache was trusted whoever owned it and written through a predictable temp name;
* a symlinked ``agent.sock.lock`` made ``numa-pin serve`` create a file elsewhere;
* a state directory others could write was used as it was;
* ``ledger.json`` was 0644.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ledger_factories import grant

from numa_pin.agent import server
from numa_pin.base.safefs import check_dir, create_private
from numa_pin.errors import LedgerError, NumaPinError, UnsafePathError
from numa_pin.ledger.store import Ledger
from numa_pin.reporting.report import reason_path, write_reason
from numa_pin.testing.node import FakeNode
from numa_pin.topology import cache

OTHER_UID = 54321  # a non-root user that is not us (the suite runs as root or as one user)


def write_ledger(state: Path) -> None:
    with Ledger(state).transaction() as txn:
        txn.put(grant("c1"))


@pytest.fixture
def victim(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    return target


def test_ledger_lock_symlink_is_not_followed(tmp_path, victim):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "ledger.lock").symlink_to(victim)
    with pytest.raises(LedgerError, match="ledger.lock"):
        write_ledger(state)
    assert victim.read_text() == "precious\n"


def test_ledger_lock_hard_link_is_refused(tmp_path, victim):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.link(victim, state / "ledger.lock")
    with pytest.raises(UnsafePathError, match="hard links"):
        write_ledger(state)
    assert victim.read_text() == "precious\n"


def test_ledger_and_its_directory_are_private(tmp_path):
    state = tmp_path / "new-state"
    old = os.umask(0)
    try:
        write_ledger(state)
    finally:
        os.umask(old)
    assert (state / "ledger.json").stat().st_mode & 0o777 == 0o600
    assert (state / "ledger.lock").stat().st_mode & 0o777 == 0o600
    assert state.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    "spoil, needle",
    [
        (lambda d: os.chmod(d, 0o777), "writable by others"),
        (lambda d: os.chmod(d, 0o775), "writable by others"),
        (lambda d: os.chmod(d.parent, 0o777), "writable by others"),
        pytest.param(lambda d: os.chown(d, OTHER_UID, -1), f"owned by uid {OTHER_UID}", marks=pytest.mark.root),
    ],
    ids=["world-writable", "group-writable", "parent-world-writable", "other-owner"],
)
def test_unsafe_state_directory_is_refused_with_one_line(tmp_path, spoil, needle):
    state = tmp_path / "parent" / "state"
    state.mkdir(parents=True, mode=0o700)
    spoil(state)
    for use in (write_ledger, lambda s: Ledger(s).read()):
        with pytest.raises(UnsafePathError, match=needle) as info:
            use(state)
        assert "\n" not in str(info.value)


def test_sticky_world_writable_parent_is_accepted(tmp_path):
    parent = tmp_path / "tmp-like"
    parent.mkdir()
    os.chmod(parent, 0o1777)
    write_ledger(parent / "state")
    check_dir(parent / "state")


def test_reasons_symlink_is_not_followed(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (state / "reasons").symlink_to(elsewhere)
    assert write_reason(str(state), "c1", "numa-pin: rejected c1: x") is None
    assert list(elsewhere.iterdir()) == []


def test_reason_file_is_private_and_replaces_a_planted_symlink(tmp_path, victim):
    state = tmp_path / "state"
    (state / "reasons").mkdir(parents=True, mode=0o700)
    os.chmod(state, 0o700)
    Path(reason_path(str(state), "c1")).symlink_to(victim)
    old = os.umask(0)
    try:
        path = write_reason(str(state), "c1", "numa-pin: rejected c1: x")
    finally:
        os.umask(old)
    assert path is not None and not os.path.islink(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert victim.read_text() == "precious\n"


@pytest.fixture
def laptop(tmp_path):
    node = FakeNode(tmp_path / "node", "laptop", parent="")
    return node, tmp_path / "cache"


def _cache_file(cache_dir: Path) -> Path:
    (entry,) = [p for p in cache_dir.iterdir() if p.name.startswith("topology-")]
    return entry


def _forge(entry: Path) -> None:
    doc = json.loads(entry.read_text())
    doc["topology"]["nodes"][0]["cpus"] = [0]  # a planted topology would steer every admission
    entry.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "spoil",
    [pytest.param(lambda e: os.chmod(e, 0o666), id="world-writable-file"),
     pytest.param(lambda e: os.chown(e, OTHER_UID, -1), id="other-owner-file", marks=pytest.mark.root)],
)
def test_untrusted_topology_cache_is_ignored(laptop, spoil):
    node, cache_dir = laptop
    truth = cache.cached_discover(str(node.sysfs_root), str(node.proc_root), str(cache_dir))
    entry = _cache_file(cache_dir)
    _forge(entry)
    spoil(entry)
    again = cache.cached_discover(str(node.sysfs_root), str(node.proc_root), str(cache_dir))
    assert again == truth
    assert entry.stat().st_uid == os.geteuid() and entry.stat().st_mode & 0o777 == 0o600  # rewritten


def test_topology_cache_symlink_is_neither_read_nor_written_through(laptop, victim):
    node, cache_dir = laptop
    truth = cache.cached_discover(str(node.sysfs_root), str(node.proc_root), str(cache_dir))
    entry = _cache_file(cache_dir)
    forged = cache_dir.parent / "forged.json"
    forged.write_text(entry.read_text())
    _forge(forged)
    entry.unlink()
    entry.symlink_to(forged)
    assert cache.cached_discover(str(node.sysfs_root), str(node.proc_root), str(cache_dir)) == truth
    assert not entry.is_symlink()  # replaced by a private regular file
    before = forged.read_text()
    # a planted file at any temp name cannot be written through: names are random and O_EXCL
    for name in os.listdir(cache_dir):
        assert not name.endswith(".tmp")
    assert forged.read_text() == before


def test_topology_cache_in_a_directory_others_write_is_refused(laptop):
    node, cache_dir = laptop
    cache_dir.mkdir(mode=0o700)
    os.chmod(cache_dir, 0o777)
    with pytest.raises(UnsafePathError, match="writable by others"):
        cache.cached_discover(str(node.sysfs_root), str(node.proc_root), str(cache_dir))


def test_private_temp_files_are_exclusive_and_0600(tmp_path):
    old = os.umask(0)
    try:
        fds = [create_private(str(tmp_path), "x.") for _ in range(20)]
    finally:
        os.umask(old)
    assert len({path for _, path in fds}) == 20
    for fd, path in fds:
        os.close(fd)
        assert os.stat(path).st_mode & 0o777 == 0o600


def test_agent_lock_symlink_is_not_followed(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    target = tmp_path / "created-elsewhere"
    (run / "agent.sock.lock").symlink_to(target)
    with pytest.raises(NumaPinError, match="agent.sock.lock"):
        server.open_socket(str(run / "agent.sock"))
    assert not target.exists()
