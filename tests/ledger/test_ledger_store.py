"""The ledger file: format, checksum, transactions, corruption handling (single process)."""

from __future__ import annotations

import gc
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ledger_factories import grant, grants, states

from numa_pin.errors import LedgerCorrupt, LedgerError
from numa_pin.ledger.codec import Memo
from numa_pin.ledger.migrate import SNAPSHOT_ONLY_VERSION
from numa_pin.ledger.model import LEDGER_VERSION, Grant, LedgerState, PodRecord
from numa_pin.ledger.reader import ReadCache
from numa_pin.ledger.store import LEDGER_FILE, LOCK_FILE, REMEDY, Ledger, decode, encode
from waitfor import wait_for


def _sha256_of_data(doc: dict[str, Any]) -> str:
    """Independent checksum: canonical JSON spelled out here, not imported."""
    canonical = json.dumps(doc["data"], sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def test_missing_file_is_empty_and_read_creates_nothing(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    assert Ledger(state_dir).read() == LedgerState()
    assert not state_dir.exists()


def test_transaction_writes_checksummed_file(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    with ledger.transaction() as txn:
        assert txn.state == LedgerState()
        txn.put(grant("c1"))
        txn.put_pod(PodRecord("pod-a", frozenset({0})))
    doc = json.loads((tmp_path / LEDGER_FILE).read_text())
    assert set(doc) == {"version", "checksum", "data"}
    assert doc["version"] == doc["data"]["version"] == SNAPSHOT_ONLY_VERSION  # small: no journal follows
    assert doc["checksum"] == _sha256_of_data(doc)
    assert doc["data"]["grants"]["c1"]["cpus"] == "2-3"
    state = ledger.read()
    assert state.grant("c1") == grant("c1")
    assert state.pods["pod-a"].affinity == frozenset({0})
    assert (tmp_path / LEDGER_FILE).stat().st_mode & 0o777 == 0o600  # private: it names every container


def test_state_assignment_and_helpers(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    with ledger.transaction() as txn:
        txn.state = txn.state.with_grant(grant("a")).with_grant(grant("b", cpus={5}))
    with ledger.transaction() as txn:
        txn.remove("a")
        txn.remove("never-there")
        txn.put_pod(PodRecord("p"))
        txn.remove_pod("p")
    assert set(ledger.read().grants) == {"b"}
    with pytest.raises(TypeError):
        with ledger.transaction() as txn:
            txn.state = {"grants": {}}  # type: ignore[assignment]


def test_exception_in_transaction_writes_nothing(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    with ledger.transaction() as txn:
        txn.put(grant("keep"))
    before = (tmp_path / LEDGER_FILE).read_bytes()
    with pytest.raises(RuntimeError, match="admission failed"):
        with ledger.transaction() as txn:
            txn.put(grant("lost"))
            raise RuntimeError("admission failed")
    assert (tmp_path / LEDGER_FILE).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [LEDGER_FILE, LOCK_FILE]


def test_unchanged_state_is_not_rewritten(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    with ledger.transaction() as txn:
        txn.put(grant("a"))
    ino = (tmp_path / LEDGER_FILE).stat().st_ino
    with ledger.transaction() as txn:
        txn.put(grant("a"))  # equal grant: nothing to write
    assert (tmp_path / LEDGER_FILE).stat().st_ino == ino
    with ledger.transaction() as txn:
        txn.put(grant("b"))
    assert (tmp_path / LEDGER_FILE).stat().st_ino != ino  # replaced, not rewritten in place


def test_lock_file_records_holder_only_while_held(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    with ledger.transaction():
        assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
    assert (tmp_path / LOCK_FILE).read_text() == ""


def test_nested_transaction_is_refused(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    with ledger.transaction():
        with pytest.raises(LedgerError, match="nested"):
            with ledger.transaction():
                pass
    with ledger.transaction():  # the flag was reset
        pass


def test_nested_transaction_on_second_handle_times_out_naming_this_process(tmp_path: Path) -> None:
    from numa_pin.errors import LedgerLockTimeout

    with Ledger(tmp_path).transaction():
        with pytest.raises(LedgerLockTimeout) as info:
            with Ledger(tmp_path, lock_timeout=0).transaction():
                pass
    assert f"pid {os.getpid()}, this process" in str(info.value)


def test_stale_temp_files_are_removed_by_next_writer(tmp_path: Path) -> None:
    stale = tmp_path / ".ledger.json.999.deadbeef.tmp"
    stale.write_text("{half a ledg")
    other = tmp_path / "unrelated.tmp"
    other.write_text("x")
    with Ledger(tmp_path).transaction():
        pass
    assert not stale.exists()
    assert other.exists()


def test_negative_timeout_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Ledger(tmp_path, lock_timeout=-1)


def test_state_dir_is_created_by_first_transaction(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "a" / "b")
    with ledger.transaction() as txn:
        txn.put(grant("x"))
    assert ledger.read().grant("x") is not None


def test_state_dir_unusable_is_ledger_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LedgerError, match="lock"):
        with Ledger(blocker / "state").transaction():
            pass


# ---- corruption --------------------------------------------------------------------


def _valid_doc() -> dict[str, Any]:
    return json.loads(encode(LedgerState({"c1": grant("c1")})))


def _doc_bytes(fn: Any) -> bytes:
    doc = _valid_doc()
    fn(doc)
    return json.dumps(doc).encode()


def _resign(doc: dict[str, Any]) -> None:
    doc["checksum"] = _sha256_of_data(doc)


def _edit_and_resign(fn: Any) -> bytes:
    def go(doc: dict[str, Any]) -> None:
        fn(doc)
        _resign(doc)

    return _doc_bytes(go)


CORRUPT_FILES = [
    ("empty", b"", "not valid JSON"),
    ("truncated", encode(LedgerState({"c1": grant("c1")}))[:-40], "not valid JSON"),
    ("garbage", b"\x00\xff\xfe garbage", "not valid JSON"),
    ("not_utf8", b'{"version": 1, "x": "\xff"}', "not valid JSON"),
    ("list", b"[1, 2]", "expected a JSON object"),
    ("missing_checksum", _doc_bytes(lambda d: d.pop("checksum")), "expected keys"),
    ("extra_key", _doc_bytes(lambda d: d.update(note="hi")), "expected keys"),
    ("version_str", _doc_bytes(lambda d: d.update(version="1")), "version must be an integer"),
    ("data_list", _doc_bytes(lambda d: d.update(data=[])), "data must be a JSON object"),
    ("checksum_tampered", _doc_bytes(lambda d: d["data"]["grants"]["c1"].update(cpus="0-63")), "checksum mismatch"),
    ("checksum_wrong_algo", _doc_bytes(lambda d: d.update(checksum="md5:00")), "checksum mismatch"),
    ("nan", _doc_bytes(lambda d: None).replace(b'"created": 1700000001.5', b'"created": NaN'), "not valid JSON"),
    ("inner_version_mismatch", _edit_and_resign(lambda d: d["data"].update(version=0)), "does not match"),
    ("bad_grant_resigned", _edit_and_resign(lambda d: d["data"]["grants"]["c1"].update(kind="vm")), "kind"),
    ("deep_nesting", b"[" * 100000 + b"]" * 100000, "not valid JSON"),
]


@pytest.mark.parametrize(("raw", "word"), [(r, w) for _, r, w in CORRUPT_FILES], ids=[c[0] for c in CORRUPT_FILES])
def test_corrupt_file_is_refused_never_reset(tmp_path: Path, raw: bytes, word: str) -> None:
    path = tmp_path / LEDGER_FILE
    path.write_bytes(raw)
    ledger = Ledger(tmp_path)
    with pytest.raises(LedgerCorrupt) as info:
        ledger.read()
    message = str(info.value)
    assert word in message
    assert str(path) in message
    assert REMEDY in message
    with pytest.raises(LedgerCorrupt):
        with ledger.transaction() as txn:
            txn.put(grant("new"))
    assert path.read_bytes() == raw  # untouched


def test_newer_version_file_names_the_writer(tmp_path: Path) -> None:
    doc = _valid_doc()
    doc["version"] = LEDGER_VERSION + 1
    doc["data"]["written_by"] = "numa-pin 7.0.0"
    doc["checksum"] = "blake3:whatever-the-future-uses"
    (tmp_path / LEDGER_FILE).write_text(json.dumps(doc))
    with pytest.raises(LedgerCorrupt) as info:
        Ledger(tmp_path).read()
    assert "numa-pin 7.0.0" in str(info.value)
    assert f"version {LEDGER_VERSION + 1}" in str(info.value)


def test_encode_decode_roundtrip() -> None:
    state = LedgerState({"c1": grant("c1"), "c2": grant("c2", cpus={7})}, {"p": PodRecord("p")})
    assert decode(encode(state), "/x") == state


@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_random_bytes_raise_only_ledger_corrupt(raw: bytes) -> None:
    try:
        decode(raw, "/var/lib/numa-pin/ledger.json")
    except LedgerCorrupt as exc:
        assert "/var/lib/numa-pin/ledger.json" in str(exc)


def _plain_encode(state: LedgerState) -> bytes:
    """The file as ``json.dumps`` writes the whole document (indent 1, sorted keys), with the
    checksum spelled out here: the oracle for the encoder's reuse of each grant's text."""
    data = json.loads(json.dumps(state.to_dict()))
    doc = {"version": LEDGER_VERSION, "checksum": _sha256_of_data({"data": data}), "data": state.to_dict()}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("ascii")


@given(states(), grants())
def test_encode_is_the_plain_json_of_the_document_before_and_after_a_change(state: LedgerState, extra) -> None:
    """Each grant's text is encoded once and reused while the grant is the same object (issue 21):
    the bytes stay those of encoding the whole document, when a grant is added, replaced or gone."""
    memo = Memo()
    assert encode(state, memo=memo) == _plain_encode(state)
    assert encode(state, memo=memo) == _plain_encode(state)  # every grant's text now comes from the reuse
    for changed in (state.with_grant(extra), state.without(extra.container_id), state.with_grant(extra)):
        assert encode(changed, memo=memo) == _plain_encode(changed)
        assert decode(encode(changed, memo=memo), "/x/ledger.json", memo) == changed


@given(states(), st.lists(st.tuples(st.booleans(), grants()), max_size=40), st.integers(0, 3))
def test_encode_after_many_changes_is_the_plain_json_of_each_state(state: LedgerState, changes, every) -> None:
    """The encoder mends the member lists of the grants it encoded last (a grant added, replaced
    or removed, many at a time or one) or makes them anew: each state's bytes stay those of
    encoding the whole document, whatever came before."""
    memo = Memo()
    assert encode(state, memo=memo) == _plain_encode(state)
    for i, (remove, extra) in enumerate(changes):
        state = state.without(extra.container_id) if remove else state.with_grant(extra)
        if every and i % every:
            continue  # several changes between two encodings
        assert encode(state, memo=memo) == _plain_encode(state)
    assert encode(state, memo=memo) == _plain_encode(state)
    assert encode(LedgerState(), memo=memo) == _plain_encode(LedgerState())


def _with_grant_field(raw: bytes, cid: str, key: str, value: Any) -> bytes:
    doc = json.loads(raw)
    doc["data"]["grants"][cid][key] = value
    _resign(doc)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("case", "key", "value", "same"),
    [
        ("unchanged", None, None, True),
        ("pid-changed", "pid", 4243, False),
        ("pid-true-is-not-1", "pid", True, None),  # JSON true == 1 in Python; still refused
        ("start-time-int-is-not-float", "start_time", 1700000000, False),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_decoding_again_reuses_only_grants_whose_json_is_the_same(case, key, value, same) -> None:
    """Issue 21: a grant decoded before, with the same JSON text, is the same object (its
    encoded text is reused too); any change, even one Python's == cannot see, decodes it anew."""
    c1 = grant("c1", pid=1, start_time=1700000000.0)
    memo = Memo()
    first = decode(encode(LedgerState({"c1": c1, "c2": grant("c2")})), "/x/ledger.json", memo)
    raw = encode(first) if key is None else _with_grant_field(encode(first), "c1", key, value)
    if same is None:
        with pytest.raises(LedgerCorrupt, match="pid"):
            decode(raw, "/x/ledger.json", memo)
        return
    again = decode(raw, "/x/ledger.json", memo)
    assert again.grants["c2"] is first.grants["c2"]
    assert (again.grants["c1"] is first.grants["c1"]) is same
    assert again.grants["c1"] == Grant.from_dict(json.loads(raw)["data"]["grants"]["c1"])
    fresh = decode(raw, "/x/ledger.json")  # no memo: nothing is lent, every grant decoded anew
    assert fresh == again and not any(fresh.grants[cid] is again.grants[cid] for cid in again.grants)


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the ledger reads that fetch the file's bytes."""
    from numa_pin.base import boundedio
    from numa_pin.ledger import reader

    calls: list[int] = []
    real = boundedio.read_fd

    def counting(fd: int, limit: int) -> bytes:
        calls.append(fd)
        return real(fd, limit)

    monkeypatch.setattr(boundedio, "read_fd", counting)  # read_regular_file's
    monkeypatch.setattr(reader, "read_fd", counting)  # the ledger's reader
    return calls


def test_the_file_last_read_or_written_is_not_read_again_while_it_is_the_same_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: a busy node's ledger is a megabyte, and an admission reads it twice. The file
    this process wrote or read last, still the one at the path, is not read again."""
    ledger = Ledger(tmp_path)
    with ledger.transaction() as txn:
        txn.put(grant("c1"))
    reads = _reads(monkeypatch)
    assert ledger.read().grant("c1") == grant("c1")
    with ledger.transaction() as txn:
        txn.put(grant("c2", cpus={5}))
    assert set(ledger.read().grants) == {"c1", "c2"}
    assert reads == []


def test_a_ledger_replaced_or_written_in_place_by_anyone_else_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(tmp_path)
    path = tmp_path / LEDGER_FILE
    with ledger.transaction() as txn:
        txn.put(grant("c1"))
    reads = _reads(monkeypatch)
    other = tmp_path / "other.json"
    other.write_bytes(encode(LedgerState({"c9": grant("c9")})))
    os.replace(other, path)  # replaced whole, as another numa-pin process does
    assert set(ledger.read().grants) == {"c9"}
    assert len(reads) == 1
    # written in place, the same size (a changed digit), a moment later (a kernel without
    # fine-grained change times stamps writes within one clock tick, 1 to 10 ms, alike): read,
    # and refused
    probe = tmp_path / "clock"

    def clock_ticked() -> bool:
        probe.write_bytes(b"")
        return probe.stat().st_mtime_ns > path.stat().st_mtime_ns

    wait_for(clock_ticked, "the kernel's file clock to move past the ledger's change time")
    raw = path.read_bytes()
    assert b'"pid": 4242' in raw
    with open(path, "r+b") as f:
        f.write(raw.replace(b'"pid": 4242', b'"pid": 4243', 1))
    with pytest.raises(LedgerCorrupt, match="checksum"):
        ledger.read()
    assert len(reads) == 2


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_what_a_ledger_keeps_open_is_its_own_and_goes_with_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: no module global holds a descriptor. The files a ledger read last stay open with
    that ledger, and only with it: another ledger of the same directory reads for itself, and a
    ledger dropped closes them."""
    before = _open_fds()
    ledger = Ledger(tmp_path)
    with ledger.transaction() as txn:
        txn.put(grant("c1"))
    assert ledger.read().grant("c1") == grant("c1")
    assert _open_fds() - before, "a ledger keeps the snapshot it wrote open"
    reads = _reads(monkeypatch)
    assert Ledger(tmp_path).read().grant("c1") == grant("c1")
    assert len(reads) == 1  # a ledger of its own: read, not taken from the first one's cache
    del ledger
    gc.collect()
    assert _open_fds() == before


def test_ledgers_given_one_cache_read_an_unchanged_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The services an agent child builds share its warm state's cache: what its rehearsal read
    is not read again by the service that serves the request."""
    with Ledger(tmp_path).transaction() as txn:
        txn.put(grant("c1"))
    cache = ReadCache()
    reads = _reads(monkeypatch)
    assert Ledger(tmp_path, cache=cache).read().grant("c1") == grant("c1")
    assert Ledger(tmp_path, cache=cache).read().grant("c1") == grant("c1")
    assert len(reads) == 1
    before = _open_fds()
    cache.let_go()
    assert len(before - _open_fds()) == 1  # the snapshot it held


def test_a_ledgers_memo_is_its_own_cache_and_only_its_owner_reuses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issues 21 and 39: a ledger's cache keeps the grants it last decoded and encoded. Another
    writer's commit changes one grant: this ledger's next read returns the others as the same
    objects, and its commits after its first encode only the grant that changed. A ledger with
    a cache of its own reuses none of them (no module global lends them)."""
    from numa_pin.ledger import codec

    many = {f"c{i:02d}": grant(f"c{i:02d}", cpus={i}) for i in range(20)}
    with Ledger(tmp_path).transaction() as txn:
        txn.state = LedgerState(many)
    ledger = Ledger(tmp_path)
    first = ledger.read()
    with Ledger(tmp_path).transaction() as txn:  # another writer
        txn.put(grant("c00", cpus={30}))
    again = ledger.read()
    assert again.grant("c00") == grant("c00", cpus={30}) and again.grant("c00") is not first.grant("c00")
    assert all(again.grants[cid] is first.grants[cid] for cid in many if cid != "c00")
    encoded: list[str] = []
    real = codec._member

    def counting(cid: str, g: Grant) -> tuple[bytes, bytes]:
        encoded.append(cid)
        return real(cid, g)

    monkeypatch.setattr(codec, "_member", counting)
    with ledger.transaction() as txn:
        txn.put(grant("c01", cpus={31}))
    assert sorted(encoded) == sorted(many)  # this ledger's first encoding
    encoded.clear()
    with ledger.transaction() as txn:
        txn.put(grant("c02", cpus={32}))
    assert encoded == ["c02"]
    stranger = Ledger(tmp_path)
    assert not any(g is again.grants.get(cid) for cid, g in stranger.read().grants.items())
    encoded.clear()
    with stranger.transaction() as txn:
        txn.put(grant("c03", cpus={33}))
    assert sorted(encoded) == sorted(many)
