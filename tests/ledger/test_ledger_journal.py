"""The ledger's journal (issue 34, item 6): a commit appends one record beside the snapshot.

Every state read back is checked against what was committed and against an independent replay
of the two files written here (hashlib and json, not the package's codec): many commits, a torn
last record, damaged or inconsistent records, a failure at each step of an append and of a
compaction, a reader that a compaction overtakes, and the bound that keeps the journal small.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ledger_factories import grant

from numa_pin.base import safefs
from numa_pin.errors import LedgerCorrupt, LedgerError
from numa_pin.ledger import journal, reader, store
from numa_pin.ledger.migrate import SNAPSHOT_ONLY_VERSION
from numa_pin.ledger.model import Grant, LedgerState, PodRecord
from numa_pin.ledger.store import JOURNAL_FILE, LEDGER_FILE, Ledger


@pytest.fixture
def journaled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits append to the journal whatever the snapshot's size (a test's ledger is small)."""
    monkeypatch.setattr(store, "JOURNAL_FROM_BYTES", 0)


def _grant(n: int, **kw: Any) -> Grant:
    return grant(f"g{n:04d}", cpus=frozenset({n % 64}), pid=1000 + n, **kw)


def _seeded(tmp_path: Path, n: int = 48) -> Ledger:
    ledger = Ledger(tmp_path)
    with ledger.transaction() as txn:
        txn.state = LedgerState({g.container_id: g for g in map(_grant, range(n))})
    return ledger


def _forget(ledger: Ledger) -> None:
    """What ``ledger`` kept of the files it read or wrote, dropped: its next read is a cold one."""
    ledger.cache.let_go()


def by_hand(state_dir: Path) -> LedgerState:
    """The state the two files hold, replayed here from the documented format."""
    doc = json.loads((state_dir / LEDGER_FILE).read_bytes())
    data = doc["data"]
    log = state_dir / JOURNAL_FILE
    complete = log.read_bytes().split(b"\n")[:-1] if log.exists() else []  # after the last newline: torn
    for seq, line in enumerate(complete, 1):
        digest, _, body = line.partition(b" ")
        if hashlib.sha256(body).hexdigest() != digest.decode("ascii", "replace"):
            assert seq == len(complete) and b"\0" in line, "only the last record may be torn, by a page of zeros"
            break
        record = json.loads(body)
        if record["base"] != doc["checksum"]:
            assert seq == 1
            break  # a journal the snapshot already holds
        assert record["seq"] == seq
        for key, kind in (("grants", "grants"), ("pods", "pods")):
            for ident, value in record[key].items():
                if value is None:
                    del data[kind][ident]
                else:
                    data[kind][ident] = value
    return LedgerState.from_dict(data)


def _change(txn: Any, rng: random.Random, n: int) -> None:
    """One random commit: a grant added, changed or removed, or a pod record set or removed."""
    what = rng.randrange(5)
    held = sorted(txn.state.grants)
    if what == 0 or not held:
        txn.put(_grant(n))
    elif what == 1:
        txn.remove(rng.choice(held))
    elif what == 2:
        txn.put(txn.state.grants[rng.choice(held)].as_shared())
    elif what == 3:
        txn.put_pod(PodRecord(f"pod-{n % 5}", frozenset({n % 2})))
    else:
        pods = sorted(txn.state.pods)
        if pods:
            txn.remove_pod(rng.choice(pods))
        else:
            txn.put(_grant(n))


def test_many_commits_read_back_as_committed_cold_and_warm(tmp_path: Path, journaled: None) -> None:
    ledger = _seeded(tmp_path)
    rng = random.Random(34)
    appended = compacted = 0
    for n in range(100, 400):
        size = (tmp_path / LEDGER_FILE).stat().st_size
        with ledger.transaction() as txn:
            _change(txn, rng, n)
            state = txn.state
        if (tmp_path / LEDGER_FILE).stat().st_size != size or not (tmp_path / JOURNAL_FILE).stat().st_size:
            compacted += 1
        else:
            appended += 1
        assert ledger.read() == state
        if n % 7 == 0:
            _forget(ledger)
            assert ledger.read() == state
        assert by_hand(tmp_path) == state
    assert appended > 200 and compacted > 5  # both paths were taken, appends the most


def test_the_journal_stays_within_its_share_of_the_snapshot(tmp_path: Path, journaled: None) -> None:
    ledger = _seeded(tmp_path, 40)
    for n in range(40, 240):
        with ledger.transaction() as txn:
            txn.put(_grant(n % 60, notes=(f"commit {n}",)))
        assert (tmp_path / JOURNAL_FILE).stat().st_size <= (tmp_path / LEDGER_FILE).stat().st_size // store.JOURNAL_SHARE


def test_a_small_ledger_is_one_file(tmp_path: Path) -> None:
    ledger = _seeded(tmp_path, 3)
    with ledger.transaction() as txn:
        txn.put(_grant(3))
    assert sorted(os.listdir(tmp_path)) == [LEDGER_FILE, "ledger.lock"]


def _states(tmp_path: Path, commits: int) -> tuple[Ledger, list[LedgerState]]:
    """A seeded ledger and ``commits`` more that append (the states after each, the first the seed's)."""
    ledger = _seeded(tmp_path)
    states = [ledger.read()]
    for n in range(100, 100 + commits):
        with ledger.transaction() as txn:
            txn.put(_grant(n))
        states.append(txn.state)
    assert len((tmp_path / JOURNAL_FILE).read_bytes().splitlines()) == commits
    return ledger, states


#: (id, what is done to the journal's last record)
TORN = [
    ("half-a-record", lambda raw, last: raw[: len(raw) - len(last) // 2]),
    ("no-newline", lambda raw, last: raw[:-1]),
    ("only-the-digest", lambda raw, last: raw[: len(raw) - len(last) + 64]),
    ("a-page-unwritten", lambda raw, last: raw[: len(raw) - len(last)] + b"\0" * 20 + last[20:]),
    ("zeros", lambda raw, last: raw[: len(raw) - len(last)] + b"\0" * len(last)),
]


@pytest.mark.parametrize("cut", [t[1] for t in TORN], ids=[t[0] for t in TORN])
def test_a_torn_last_record_is_ignored_and_cut_off_by_the_next_commit(tmp_path: Path, journaled: None, cut) -> None:
    ledger, states = _states(tmp_path, 3)
    log = tmp_path / JOURNAL_FILE
    raw = log.read_bytes()
    last = raw.splitlines(keepends=True)[-1]
    log.write_bytes(cut(raw, last))
    assert ledger.read() == states[-2]
    _forget(ledger)
    assert ledger.read() == states[-2]
    with ledger.transaction() as txn:
        txn.put(_grant(900))
    assert ledger.read() == by_hand(tmp_path) == states[-2].with_grant(_grant(900))


def _line(body: dict[str, Any]) -> bytes:
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(text).hexdigest().encode() + b" " + text + b"\n"


def _bodies(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line.split(b" ", 1)[1]) for line in log.read_bytes().splitlines()]


#: (id, the journal's lines made from its three records' bodies, a word of the error)
BAD_JOURNALS = [
    ("damaged-first", lambda b: [_line(b[0])[:-12] + b"0" * 11 + b"\n", _line(b[1]), _line(b[2])], "damaged"),
    ("bit-flipped-last", lambda b: [_line(b[0]), _line(b[1]), _line(b[2]).replace(b"g0102", b"g0103")], "record 3"),
    ("records-swapped", lambda b: [_line(b[0]), _line(b[2]), _line(b[1])], "record 3"),
    ("record-dropped", lambda b: [_line(b[0]), _line(b[2])], "record 3"),
    ("other-snapshot-after-this", lambda b: [_line(b[0]), _line({**b[1], "base": "sha256:" + "0" * 64})],
     "names snapshot"),
    ("removes-what-is-not-there", lambda b: [_line(b[0]), _line({**b[1], "grants": {"nobody": None}})],
     "does not hold"),
    ("key-is-not-the-grant", lambda b: [_line({**b[0], "grants": {"x": b[0]["grants"]["g0100"]}})], "holds the grant"),
    ("wrong-shape", lambda b: [_line({**b[0], "extra": 1}), _line(b[1])], "shape"),
    ("not-a-grant", lambda b: [_line({**b[0], "grants": {"g0100": {"cpus": "x"}}}), _line(b[1])], "record 1"),
    ("newer-version", lambda b: [_line({**b[0], "version": 999}), _line(b[1])], "999"),
]


@pytest.mark.parametrize(("make", "word"), [b[1:] for b in BAD_JOURNALS], ids=[b[0] for b in BAD_JOURNALS])
def test_a_damaged_or_inconsistent_journal_is_corrupt_never_skipped(tmp_path: Path, journaled: None, make,
                                                                     word: str) -> None:
    ledger, _ = _states(tmp_path, 3)
    log = tmp_path / JOURNAL_FILE
    log.write_bytes(b"".join(make(_bodies(log))))
    _forget(ledger)
    with pytest.raises(LedgerCorrupt, match=word) as info:
        ledger.read()
    assert "numa-pin recover" in str(info.value)
    with pytest.raises(LedgerCorrupt), ledger.transaction():
        pass


def test_a_record_of_an_older_format_is_migrated_as_a_snapshot_of_that_format_is(tmp_path: Path,
                                                                                  journaled: None) -> None:
    ledger, states = _states(tmp_path, 1)
    old = json.loads((Path(__file__).parent / "data" / "ledger-v3.json").read_text())["data"]
    log = tmp_path / JOURNAL_FILE
    body = _bodies(log)[0]
    log.write_bytes(log.read_bytes() + _line({**body, "seq": 2, "version": old["version"],
                                              "grants": old["grants"], "pods": old["pods"]}))
    _forget(ledger)
    migrated = LedgerState.from_dict(old)
    assert ledger.read() == LedgerState({**states[-1].grants, **migrated.grants}, migrated.pods)


def test_a_journal_without_its_snapshot_is_corrupt(tmp_path: Path, journaled: None) -> None:
    ledger, _ = _states(tmp_path, 2)
    (tmp_path / LEDGER_FILE).unlink()
    _forget(ledger)
    with pytest.raises(LedgerCorrupt, match="names snapshot"):
        ledger.read()


def test_a_journal_of_an_older_snapshot_is_ignored_and_cut_off(tmp_path: Path, journaled: None) -> None:
    """What a crash between a compaction's new snapshot and its emptying of the journal leaves."""
    ledger, states = _states(tmp_path, 3)
    stale = (tmp_path / JOURNAL_FILE).read_bytes()
    with ledger.transaction() as txn:
        txn.state = LedgerState({g.container_id: g for g in map(_grant, range(200, 260))})  # compacts
    (tmp_path / JOURNAL_FILE).write_bytes(stale)
    _forget(ledger)
    assert ledger.read() == txn.state
    with ledger.transaction() as txn:
        txn.remove("g0200")
    assert _bodies(tmp_path / JOURNAL_FILE)[0]["seq"] == 1
    assert ledger.read() == by_hand(tmp_path) == txn.state


def test_recover_keeps_a_damaged_journal_aside_and_removes_it(tmp_path: Path, journaled: None) -> None:
    ledger, states = _states(tmp_path, 3)
    log = tmp_path / JOURNAL_FILE
    damaged = b"garbage\n" + log.read_bytes()
    log.write_bytes(damaged)
    _forget(ledger)
    state, aside, rebuilt = ledger.rebuild(lambda raw: LedgerState())
    assert rebuilt and aside is not None and not log.exists()
    assert [p.read_bytes() for p in tmp_path.glob(JOURNAL_FILE + ".corrupt-*")] == [damaged]
    assert ledger.read() == LedgerState()


def test_recover_rebuilds_a_deleted_snapshot_and_removes_its_journal(tmp_path: Path, journaled: None) -> None:
    ledger, _ = _states(tmp_path, 2)
    (tmp_path / LEDGER_FILE).unlink()
    log = tmp_path / JOURNAL_FILE
    log.write_bytes(log.read_bytes().splitlines(keepends=True)[0][:-5])  # one torn record: reads as empty
    _forget(ledger)
    rebuilt = LedgerState({"g0001": _grant(1)})
    assert ledger.rebuild(lambda raw: rebuilt) == (rebuilt, None, True)
    assert not log.exists()
    assert ledger.read() == rebuilt


def _raise(code: int):
    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(code, os.strerror(code))
    return fail


def _raise_on_journal(code: int, real: Any):
    """``real`` failing with ``code`` on the journal's descriptor only (the lock file is cut too)."""
    def fail(fd: int, *args: Any) -> Any:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(JOURNAL_FILE):
            raise OSError(code, os.strerror(code))
        return real(fd, *args)
    return fail


#: (id, the module, the function made to fail, errno): each step of an append
APPEND_FAULTS = [
    ("open", safefs, "open_private", errno.EMFILE),
    ("cut", os, "ftruncate", -errno.EIO),
    ("seek", os, "lseek", errno.EIO),
    ("write", safefs, "write_all", errno.ENOSPC),
    ("fdatasync", os, "fdatasync", errno.EIO),
]


@pytest.mark.parametrize(("owner", "name", "code"), [f[1:] for f in APPEND_FAULTS], ids=[f[0] for f in APPEND_FAULTS])
def test_a_failed_append_is_undone_and_reads_as_before(tmp_path: Path, journaled: None, monkeypatch, owner, name,
                                                      code: int) -> None:
    ledger, states = _states(tmp_path, 2)
    (tmp_path / JOURNAL_FILE).write_bytes((tmp_path / JOURNAL_FILE).read_bytes() + b"torn")  # so the cut runs
    undone: list[LedgerError] = []
    with monkeypatch.context() as m:
        m.setattr(owner, name, _raise(code) if code > 0 else _raise_on_journal(-code, getattr(owner, name)))
        with pytest.raises(LedgerError, match=errno.errorcode[abs(code)]), ledger.transaction() as txn:
            txn.on_commit_failure(undone.append)
            txn.put(_grant(900))
    assert len(undone) == 1
    assert ledger.read() == states[-1]
    _forget(ledger)
    assert ledger.read() == states[-1]


def test_an_append_that_cannot_be_taken_back_says_so(tmp_path: Path, journaled: None, monkeypatch) -> None:
    ledger, _ = _states(tmp_path, 2)
    monkeypatch.setattr(os, "fdatasync", _raise(errno.EIO))
    monkeypatch.setattr(os, "ftruncate", _raise_on_journal(errno.EROFS, os.ftruncate))
    undone: list[LedgerError] = []
    with pytest.raises(LedgerError, match="EIO.*taking the record back failed too.*EROFS"), ledger.transaction() as txn:
        txn.on_commit_failure(undone.append)
        txn.put(_grant(900))
    assert len(undone) == 1


def test_a_new_journal_whose_directory_cannot_be_synced_is_undone(tmp_path: Path, journaled: None,
                                                                 monkeypatch) -> None:
    ledger = _seeded(tmp_path)
    before = ledger.read()
    monkeypatch.setattr(safefs, "fsync_dir", _raise(errno.EIO))
    with pytest.raises(LedgerError, match="EIO"), ledger.transaction() as txn:
        txn.put(_grant(900))
    monkeypatch.undo()
    _forget(ledger)
    assert ledger.read() == before
    assert (tmp_path / JOURNAL_FILE).stat().st_size == 0
    assert (tmp_path / JOURNAL_FILE).stat().st_mode & 0o777 == 0o600


def test_a_compaction_whose_journal_cannot_be_emptied_still_reads_as_committed(tmp_path: Path, journaled: None,
                                                                              monkeypatch) -> None:
    ledger, _ = _states(tmp_path, 3)
    monkeypatch.setattr(journal.os, "ftruncate", _raise_on_journal(errno.EIO, os.ftruncate))
    monkeypatch.setattr(store, "JOURNAL_FROM_BYTES", 1 << 30)  # this commit compacts
    with ledger.transaction() as txn:
        txn.put(_grant(900))
    monkeypatch.undo()
    assert len(_bodies(tmp_path / JOURNAL_FILE)) == 3  # left, naming the old snapshot
    _forget(ledger)
    assert ledger.read() == by_hand(tmp_path) == txn.state


def test_a_reader_overtaken_by_a_compaction_reads_again(tmp_path: Path, journaled: None, monkeypatch) -> None:
    """Between the reader's snapshot and its journal, another writer compacts and appends: the
    journal then names a snapshot the reader did not read, and the records it held are in that
    snapshot only. The reader must not return its old snapshot without them."""
    ledger, _ = _states(tmp_path, 3)
    writer = Ledger(tmp_path)
    real_open = reader._open
    raced: list[LedgerState] = []
    racing: list[bool] = []

    def open_racing(path: str):
        if path.endswith(JOURNAL_FILE) and not racing:
            racing.append(True)
            with monkeypatch.context() as m:
                m.setattr(store, "JOURNAL_FROM_BYTES", 1 << 30)
                with writer.transaction() as txn:
                    txn.put(_grant(900))  # compacts: the snapshot now holds the three records
            with writer.transaction() as txn:
                txn.put(_grant(901))  # appends, naming the new snapshot
            raced.append(txn.state)
        return real_open(path)

    _forget(ledger)
    monkeypatch.setattr(reader, "_open", open_racing)
    assert ledger.read() == raced[0]


def test_the_journal_this_process_appended_is_not_read_again(tmp_path: Path, journaled: None, monkeypatch) -> None:
    ledger, _ = _states(tmp_path, 2)
    reads: list[int] = []
    real = reader.read_fd
    monkeypatch.setattr(reader, "read_fd", lambda fd, limit: reads.append(fd) or real(fd, limit))
    seen = ledger.identity()
    with ledger.transaction() as txn:
        txn.put(_grant(900))
    assert ledger.identity() != seen  # the agent's spare sees the commit
    assert ledger.read() == txn.state
    assert reads == []
    # a record another process appended is read, and only the journal is
    line = journal.encode_record(by_hand_checksum(tmp_path), 4, txn.state, txn.state.without("g0900"))
    with open(tmp_path / JOURNAL_FILE, "ab") as f:
        f.write(line)
    assert ledger.read() == txn.state.without("g0900")
    assert len(reads) == 1


def by_hand_checksum(state_dir: Path) -> str:
    return str(json.loads((state_dir / LEDGER_FILE).read_bytes())["checksum"])


def test_a_journal_that_is_a_symlink_is_refused(tmp_path: Path, journaled: None) -> None:
    ledger, _ = _states(tmp_path, 1)
    log = tmp_path / JOURNAL_FILE
    os.replace(log, tmp_path / "elsewhere")
    log.symlink_to(tmp_path / "elsewhere")
    _forget(ledger)
    with pytest.raises(LedgerError):
        ledger.read()


# A writer that adds grant g<n> and SIGKILLs itself at POINT of the append or of the compaction.
_CRASHING_WRITER = r"""
import os, signal, sys
from numa_pin.base import safefs
from numa_pin.ledger import store
from numa_pin.ledger.model import Grant

state_dir, point = sys.argv[1], sys.argv[2]
store.JOURNAL_FROM_BYTES = 1 << 30 if point.startswith("compact") else 0

def die(*_args):
    os.kill(os.getpid(), signal.SIGKILL)

def on_journal(fd):
    return os.readlink(f"/proc/self/fd/{fd}").endswith("ledger.log")

def at(owner, name, when, before=True, half=False):
    real = getattr(owner, name)
    def call(*args):
        if when(*args) and before:
            if half:
                os.write(args[0], args[1][: len(args[1]) // 2])
            die()
        out = real(*args)
        if when(*args):
            die()
        return out
    setattr(owner, name, call)

journal_fd = lambda fd, *_: on_journal(fd)
always = lambda *_: True
{
    "append-before-write": lambda: at(safefs, "write_all", journal_fd),
    "append-mid-write": lambda: at(safefs, "write_all", journal_fd, half=True),
    "append-before-sync": lambda: at(os, "fdatasync", always),
    "append-after-sync": lambda: at(os, "fdatasync", always, before=False),
    "compact-before-replace": lambda: at(os, "replace", always),
    "compact-after-replace": lambda: at(os, "replace", always, before=False),
    "compact-before-empty": lambda: at(os, "ftruncate", journal_fd),
    "compact-after-empty": lambda: at(os, "ftruncate", journal_fd, before=False),
}[point]()

with store.Ledger(state_dir).transaction() as txn:
    txn.put(Grant(f"g{9000 + len(txn.state.grants):04d}", "pod", "app", "shared"))
print("survived", point)
"""

#: (point, whether the new grant must be there after the crash)
CRASH_POINTS = [
    ("append-before-write", False),
    ("append-mid-write", False),
    ("append-before-sync", True),  # whole in the page cache: a process's death loses nothing
    ("append-after-sync", True),
    ("compact-before-replace", False),
    ("compact-after-replace", True),
    ("compact-before-empty", True),
    ("compact-after-empty", True),
]


@pytest.mark.parametrize(("point", "committed"), CRASH_POINTS, ids=[p for p, _ in CRASH_POINTS])
def test_sigkill_at_each_step_of_an_append_or_a_compaction_leaves_the_state_before_or_after(
        tmp_path: Path, journaled: None, point: str, committed: bool) -> None:
    ledger, states = _states(tmp_path, 2)
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run([sys.executable, "-c", _CRASHING_WRITER, str(tmp_path), point],
                          env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    after = states[-1].with_grant(Grant(f"g{9000 + len(states[-1].grants):04d}", "pod", "app", "shared"))
    _forget(ledger)
    assert ledger.read() == by_hand(tmp_path) == (after if committed else states[-1])
    with ledger.transaction() as txn:  # the next writer cuts what the dead one left
        txn.put(_grant(901))
    _forget(ledger)
    assert ledger.read() == by_hand(tmp_path) == txn.state


# A writer that adds grants g<n> forever, each in its own transaction, appending and compacting.
_LOOPING_WRITER = r"""
import sys
from numa_pin.ledger import store
from numa_pin.ledger.model import Grant

store.JOURNAL_FROM_BYTES = 0
ledger = store.Ledger(sys.argv[1], lock_timeout=60)
print("ready", flush=True)
while True:
    with ledger.transaction() as txn:
        n = len(txn.state.grants)
        txn.put(Grant(f"g{n:06d}", "pod", "app", "shared"))
"""


def test_readers_racing_a_writer_never_go_back(tmp_path: Path) -> None:
    """Cold reads while another process appends and compacts: each sees every commit the one
    before it saw (a reader a compaction overtook would see fewer)."""
    ledger = Ledger(tmp_path)
    with ledger.transaction() as txn:
        txn.state = LedgerState({f"g{n:06d}": Grant(f"g{n:06d}", "pod", "app", "shared") for n in range(30)})
    src = str(Path(__file__).resolve().parents[2] / "src")
    writer = subprocess.Popen([sys.executable, "-c", _LOOPING_WRITER, str(tmp_path)], env={**os.environ, "PYTHONPATH": src},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        seen, reads, deadline = 30, 0, time.monotonic() + 1.5
        while time.monotonic() < deadline:
            _forget(ledger)
            grants = ledger.read().grants
            assert set(grants) == {f"g{n:06d}" for n in range(len(grants))}
            assert len(grants) >= seen
            seen, reads = len(grants), reads + 1
    finally:
        writer.kill()
        writer.communicate(timeout=60)
    assert seen > 30 + 20  # the writer appended and compacted meanwhile
    print(f"{reads} reads, {seen - 30} commits")


def test_a_small_ledgers_reader_never_opens_the_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records follow only a snapshot stamped with the journal's format: beside a small ledger's
    (version 4) a reader, the hook's included, leaves ``ledger.log`` alone, whatever it holds."""
    ledger = _seeded(tmp_path)
    state = ledger.read()
    assert json.loads((tmp_path / LEDGER_FILE).read_bytes())["version"] == SNAPSHOT_ONLY_VERSION
    (tmp_path / JOURNAL_FILE).write_bytes(b"what a crash left of an older snapshot's journal\n")
    opened: list[str] = []
    real = reader._open
    monkeypatch.setattr(reader, "_open", lambda path: (opened.append(path), real(path))[1])
    _forget(ledger)
    assert ledger.read() == state
    with ledger.transaction() as txn:
        txn.put(_grant(900))
    assert ledger.read() == state.with_grant(_grant(900))
    assert opened and JOURNAL_FILE not in {os.path.basename(p) for p in opened}


def test_a_reader_overtaken_every_time_reads_under_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that compacts faster than a cold reader reads (a loaded machine) would starve a
    lock-free reader; after :data:`~numa_pin.ledger.reader.READ_TRIES` overtakes it reads
    between two commits, under the lock, instead of failing."""
    ledger = _seeded(tmp_path)
    state = ledger.read()
    real, calls = reader._read_once, []

    def overtaken_unless_locked(*args):
        calls.append(fcntl_held(tmp_path / "ledger.lock"))
        return real(*args) if calls[-1] else None

    monkeypatch.setattr(reader, "_read_once", overtaken_unless_locked)
    _forget(ledger)
    assert ledger.read() == state
    assert calls == [False] * reader.READ_TRIES + [True]


def fcntl_held(lock: Path) -> bool:
    """Whether some descriptor holds ``lock``'s flock (another open file cannot take it)."""
    import fcntl

    with open(lock, "rb") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False
