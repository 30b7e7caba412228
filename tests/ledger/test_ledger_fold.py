"""A downgrade past the ledger's journal (issue 34, "every path"): a release from before the
journal reads ``ledger.json`` alone and would miss the records of ``ledger.log``.

So a snapshot that records may follow is stamped version 5, which such a release refuses in one
line, and ``Ledger.fold`` (``numa-pin recover --fold``, the package's prerm on a downgrade) writes
the ledger as one version-4 snapshot and removes the journal, crash-safe at every step. The
oracle for the older release is :func:`older_release`: the snapshot alone, its checksum checked
with hashlib, its data brought to version 4 by ``migrate(current=4)`` with the steps up to 4 only.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ledger_factories import grant

from numa_pin.cli.main import main
from numa_pin.errors import LedgerCorrupt
from numa_pin.ledger import store
from numa_pin.ledger.migrate import MIGRATIONS, SNAPSHOT_ONLY_VERSION, migrate
from numa_pin.ledger.model import Grant, LedgerState, PodRecord
from numa_pin.ledger.store import JOURNAL_FILE, LEDGER_FILE, Ledger, encode

#: the migration steps a release from before the journal has (it reads formats up to 4)
_UP_TO_4 = {version: step for version, step in MIGRATIONS.items() if version < 4}


def older_release(state_dir: Path) -> LedgerState:
    """What a release from before the journal reads: ``ledger.json`` alone, checked by hand.

    Raises LedgerCorrupt as that release does for a newer version (``migrate(current=4)``)."""
    doc = json.loads((state_dir / LEDGER_FILE).read_bytes())
    data = doc["data"]
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    assert doc["checksum"] == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert doc["version"] == data["version"]
    return LedgerState.from_dict(migrate(data, migrations=_UP_TO_4, current=4))


def _grant(n: int) -> Grant:
    return grant(f"g{n:04d}", cpus=frozenset({n % 64}), pid=1000 + n)


def _forget(ledger: Ledger) -> None:
    """What ``ledger`` kept of the files it read or wrote, dropped: its next read is a cold one."""
    ledger.cache.let_go()


def _commits(ledger: Ledger, seed: int, count: int, first: int = 0) -> LedgerState:
    """``count`` random commits (grants added, changed, removed; pod records set); the last state."""
    rng = random.Random(seed)
    for n in range(first, first + count):
        with ledger.transaction() as txn:
            held = sorted(txn.state.grants)
            what = rng.randrange(4)
            if what == 0 or len(held) < 2:
                txn.put(_grant(n))
            elif what == 1:
                txn.remove(rng.choice(held))
            elif what == 2:
                txn.put(txn.state.grants[rng.choice(held)].as_shared())
            else:
                txn.put_pod(PodRecord(f"pod-{n % 5}", frozenset({n % 2})))
    return txn.state


def _journal_records(state_dir: Path) -> int:
    log = state_dir / JOURNAL_FILE
    return len(log.read_bytes().splitlines()) if log.exists() else 0


#: (id, JOURNAL_FROM_BYTES for the test (None: the real 64 KiB), grants, whether an older release reads it)
MARKS = [
    ("small-ledger", None, 4, True),
    ("past-the-journal-threshold", 0, 4, False),
    ("64-kib-snapshot", None, 120, False),
]


@pytest.mark.parametrize(("from_bytes", "grants", "readable"), [m[1:] for m in MARKS], ids=[m[0] for m in MARKS])
def test_a_snapshot_that_records_may_follow_is_refused_by_an_older_release(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, from_bytes: int | None, grants: int, readable: bool) -> None:
    if from_bytes is not None:
        monkeypatch.setattr(store, "JOURNAL_FROM_BYTES", from_bytes)
    ledger = Ledger(tmp_path)
    with ledger.transaction() as txn:
        txn.state = LedgerState({g.container_id: g for g in map(_grant, range(grants))})
    committed = _commits(ledger, 1, 6, first=500)
    _forget(ledger)
    assert ledger.read() == committed
    if readable:
        assert _journal_records(tmp_path) == 0 and older_release(tmp_path) == committed
    else:
        assert (tmp_path / LEDGER_FILE).stat().st_size >= store.JOURNAL_FROM_BYTES
        with pytest.raises(LedgerCorrupt, match="format version 5 was written by numa-pin"):
            older_release(tmp_path)


def test_a_big_version_4_snapshot_is_never_followed_by_records(tmp_path: Path) -> None:
    """An upgrade from a release from before the journal: its big snapshot is compacted, not appended to."""
    state = LedgerState({g.container_id: g for g in map(_grant, range(120))})
    (tmp_path / LEDGER_FILE).write_bytes(encode(state, SNAPSHOT_ONLY_VERSION))
    (tmp_path / LEDGER_FILE).chmod(0o600)
    tmp_path.chmod(0o700)
    ledger = Ledger(tmp_path)
    assert older_release(tmp_path) == ledger.read() == state
    with ledger.transaction() as txn:
        txn.put(_grant(900))
    assert _journal_records(tmp_path) == 0
    with pytest.raises(LedgerCorrupt, match="format version 5"):
        older_release(tmp_path)
    with ledger.transaction() as txn:
        txn.put(_grant(901))
    assert _journal_records(tmp_path) == 1  # now the journal follows a version-5 snapshot


def _journaled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Ledger, LedgerState]:
    """A ledger of 48 grants and 40 random commits, the last of them in the journal."""
    monkeypatch.setattr(store, "JOURNAL_FROM_BYTES", 0)
    ledger = Ledger(tmp_path)
    with ledger.transaction() as txn:
        txn.state = LedgerState({g.container_id: g for g in map(_grant, range(48))})
    committed = _commits(ledger, 7, 40, first=100)
    assert _journal_records(tmp_path) > 1
    return ledger, committed


def test_a_fold_is_what_an_older_release_reads_and_the_next_commit_journals_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger, committed = _journaled(tmp_path, monkeypatch)
    assert ledger.fold() == (committed, True)
    assert not (tmp_path / JOURNAL_FILE).exists()
    assert older_release(tmp_path) == committed
    _forget(ledger)
    assert ledger.read() == committed
    assert ledger.fold() == (committed, False)  # nothing left to fold
    for n in range(300, 303):
        with ledger.transaction() as txn:
            txn.put(_grant(n))
    with pytest.raises(LedgerCorrupt, match="format version 5"):
        older_release(tmp_path)  # stamped again: the first commit wrote a snapshot, the next appended
    assert _journal_records(tmp_path) == 2
    _forget(ledger)
    assert ledger.read() == txn.state


#: (id, what the state directory holds before the fold, whether there is something to fold)
NOTHING = [
    ("no-state-directory", lambda d: None, False),
    ("empty-state-directory", lambda d: d.mkdir(mode=0o700), False),
    ("small-ledger", lambda d: _commits(Ledger(d), 3, 2), False),
    ("journal-of-an-older-snapshot", lambda d: _stale_journal(d), True),
]


def _stale_journal(state_dir: Path) -> None:
    """A compaction that died before it emptied the journal: records of the snapshot before."""
    _commits(Ledger(state_dir), 3, 2)
    body = json.dumps({"base": "sha256:00", "grants": {}, "pods": {}, "seq": 1, "version": 5},
                      sort_keys=True, separators=(",", ":")).encode("ascii")
    (state_dir / JOURNAL_FILE).write_bytes(hashlib.sha256(body).hexdigest().encode("ascii") + b" " + body + b"\n")
    (state_dir / JOURNAL_FILE).chmod(0o600)


@pytest.mark.parametrize(("make", "something"), [n[1:] for n in NOTHING], ids=[n[0] for n in NOTHING])
def test_a_fold_with_nothing_to_fold_changes_nothing(tmp_path: Path, make: Any, something: bool) -> None:
    state_dir = tmp_path / "state"
    make(state_dir)
    snapshot = state_dir / LEDGER_FILE
    before = snapshot.read_bytes() if snapshot.exists() else None
    state, folded = Ledger(state_dir).fold()
    assert folded is something and state == Ledger(state_dir).read()
    assert not (state_dir / JOURNAL_FILE).exists()
    assert state_dir.exists() is (make is not NOTHING[0][1])  # no ledger: nothing made either
    if before is not None:
        assert older_release(state_dir) == state
        if not something:
            assert snapshot.read_bytes() == before


# A fold that SIGKILLs itself at POINT.
_CRASHING_FOLD = r"""
import os, signal, sys
from numa_pin.ledger import store

state_dir, point = sys.argv[1], sys.argv[2]

def at(owner, name, when, before):
    real = getattr(owner, name)
    def call(*args, **kwargs):
        if when(*args) and before:
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(*args, **kwargs)
        if when(*args):
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    setattr(owner, name, call)

journal = lambda path, *_: str(path).endswith("ledger.log")
always = lambda *_: True
{
    "before-replace": lambda: at(os, "replace", always, True),
    "after-replace": lambda: at(os, "replace", always, False),
    "before-unlink": lambda: at(os, "unlink", journal, True),
    "after-unlink": lambda: at(os, "unlink", journal, False),
    "after-directory-sync": lambda: at(store, "fsync_dir", always, False),
}[point]()
store.Ledger(state_dir).fold()
print("survived", point)
"""

#: (point, whether the older release reads the ledger after the crash)
CRASH_POINTS = [
    ("before-replace", False),
    ("after-replace", True),
    ("before-unlink", True),
    ("after-unlink", True),
    ("after-directory-sync", True),
]


@pytest.mark.parametrize(("point", "folded"), CRASH_POINTS, ids=[p for p, _ in CRASH_POINTS])
def test_sigkill_at_each_step_of_a_fold_leaves_the_ledger_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, folded: bool) -> None:
    ledger, committed = _journaled(tmp_path, monkeypatch)
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run([sys.executable, "-c", _CRASHING_FOLD, str(tmp_path), point],
                          env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    _forget(ledger)
    assert ledger.read() == committed
    if folded:
        assert older_release(tmp_path) == committed
    else:
        with pytest.raises(LedgerCorrupt, match="format version 5"):
            older_release(tmp_path)
    assert ledger.fold()[0] == committed  # the fold run again completes it
    assert not (tmp_path / JOURNAL_FILE).exists() and older_release(tmp_path) == committed
    with ledger.transaction() as txn:
        txn.put(_grant(990))
    _forget(ledger)
    assert ledger.read() == txn.state


def test_recover_fold_prints_and_folds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    state_dir = tmp_path / "state"
    ledger, committed = _journaled(state_dir, monkeypatch)
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {state_dir}\n")
    assert main(["recover", "--config", str(config), "--fold", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["folded"] is True
    assert [g["container_id"] for g in out["grants"]] == sorted(committed.grants)
    assert older_release(state_dir) == committed and not (state_dir / JOURNAL_FILE).exists()
    assert main(["recover", "--config", str(config), "--fold"]) == 0
    assert capsys.readouterr().out.startswith("nothing to fold")
