"""The ledger's journal, ``ledger.log``: the commits since the snapshot ``ledger.json`` was last
written, one record each, appended (stdlib only).

A commit that changes a few grants of thousands costs what it changes, not what the node holds:
:mod:`numa_pin.ledger.store` appends its record here and syncs this file only, and rewrites the
snapshot (which then holds every record) once the journal would grow past a share of it, so the
amortised cost of a commit stays flat as the node fills.

A record is one line: the SHA-256 of its body in hex, a space, the body, a newline. The body is
canonical JSON (sorted keys, no whitespace, ASCII)::

    {"base":"sha256:<hex>","grants":{"<id>":{...}|null},"pods":{"<id>":{...}|null},"seq":N,"version":V}

``base`` is the ``checksum`` of the snapshot the record applies to, ``seq`` its place after it (1,
2, ...), ``grants`` and ``pods`` what the commit set (the record, as the snapshot spells it) or
removed (``null``), ``version`` the ledger format the records are in (an older one is migrated as
the snapshot is). :func:`replay` reads the journal onto its snapshot:

* the records that name the snapshot apply in order, each verified;
* the last record, when it has no newline, or fails its checksum and holds a NUL byte (a page
  the crash never wrote reads as zeros), is a commit that never returned (a crash mid-append):
  it is ignored, and the next writer cuts it off;
* a journal whose first record names another snapshot is what a crash between writing a new
  snapshot and emptying the journal left behind (the snapshot holds those records): ignored whole;
* anything else (a damaged record, a record of another snapshot after one of
  this one, a ``seq`` out of order, a removal of what is not there) is
  :class:`~numa_pin.errors.LedgerCorrupt`, as a damaged snapshot is.
"""

from __future__ import annotations

import errno
import json
import os

from numa_pin.base import safefs
from numa_pin.base.boundedio import json_loads_bounded
from numa_pin.base.digest import sha256_hex
from numa_pin.base.record import record
from numa_pin.errors import LedgerCorrupt, UnsafePathError
from numa_pin.ledger import derived
from numa_pin.ledger.codec import MAX_DEPTH, corrupt
from numa_pin.ledger.model import LEDGER_VERSION, Grant, LedgerState, PodRecord, migrate

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

#: a replay of at most this many changes makes each state from the last (carrying what the state
#: worked out from its grants, :mod:`~numa_pin.ledger.derived`); more are applied to one copy
_CHAINED_CHANGES = 8
_HEX = 64
_BODY_KEYS = frozenset(("base", "grants", "pods", "seq", "version"))


class NotTakenBack(OSError):
    """An append failed, and cutting the journal back to where it ended failed too."""

    def __init__(self, failed: OSError, again: OSError) -> None:
        super().__init__(failed.errno, failed.strerror or str(failed))
        self.again = again


@record
class Replay:
    """A journal read onto its snapshot: the ``state`` after the records that apply, the byte
    offset ``end`` after the last of them and their number ``seq``; ``cut`` when bytes follow
    ``end`` that the next append must cut off (a torn record, or a journal of another snapshot)."""

    state: LedgerState
    end: int
    seq: int
    cut: bool


def encode_record(base: str, seq: int, before: LedgerState, after: LedgerState) -> bytes:
    """The journal line of the commit that made ``after`` from ``before`` (pure): record ``seq``
    after the snapshot of checksum ``base``."""
    grants: dict[str, Any] = {}
    one = derived.changed_from(after, before.grants)
    if one is not None:
        ids: Any = one
    else:
        known = before.grants.get
        ids = [cid for cid, grant in after.grants.items() if known(cid) is not grant]
        ids.extend(before.grants.keys() - after.grants.keys())
    for cid in ids:
        grant = after.grants.get(cid)
        if grant is not None:
            grants[cid] = grant.to_dict()
        elif cid in before.grants:
            grants[cid] = None
    pods: dict[str, Any] = {}
    if after.pods is not before.pods:
        for pid in after.pods.keys() | before.pods.keys():
            now, was = after.pods.get(pid), before.pods.get(pid)
            if now is not was and now != was:
                pods[pid] = None if now is None else now.to_dict()
    body = json.dumps({"base": base, "grants": grants, "pods": pods, "seq": seq, "version": LEDGER_VERSION},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")
    return sha256_hex(body).encode("ascii") + b" " + body + b"\n"


def replay(raw: bytes, base: str | None, state: LedgerState, path: str, start: int = 0, seq: int = 0) -> Replay:
    """Apply the records of journal bytes ``raw`` from byte ``start`` (``seq`` records applied
    before it) to ``state``, the snapshot of checksum ``base`` (None: there is no snapshot), as
    the module's rules say (pure).

    Raises:
        LedgerCorrupt: a damaged record before the last, or any inconsistency (naming ``path``).
    """
    changes: list[tuple[str, str, Any, int, int]] = []
    pos = start
    while pos < len(raw):
        newline = raw.find(b"\n", pos)
        body = None if newline < 0 else _verified(raw[pos:newline])
        if body is None:
            if newline < 0 or (newline + 1 == len(raw) and b"\0" in raw[pos:newline]):
                break  # a commit that never returned
            raise _corrupt(f"record {seq + 1} (at byte {pos}) is damaged", path)
        doc = _body(body, seq + 1, path)
        if doc["base"] != base:
            if pos == 0 and base is not None:
                return Replay(state, 0, 0, True)  # records the snapshot already holds
            raise _corrupt(f"record {seq + 1} names snapshot {str(doc['base'])[:80]!r}, not {base!r}", path)
        if doc["seq"] != seq + 1:
            raise _corrupt(f"record {seq + 1} (at byte {pos}) says it is record {doc['seq']!r}", path)
        changes.extend(_changes(doc))
        seq += 1
        pos = newline + 1
    return Replay(_applied(state, changes, path), pos, seq, pos < len(raw))


def _verified(line: bytes) -> bytes | None:
    """The body of a journal line whose checksum holds, else None."""
    if len(line) <= _HEX + 1 or line[_HEX] != 0x20:
        return None
    body = line[_HEX + 1:]
    try:
        stated = line[:_HEX].decode("ascii")
    except UnicodeDecodeError:
        return None
    return body if sha256_hex(body) == stated else None


def _body(body: bytes, seq: int, path: str) -> dict[str, Any]:
    """A verified record's body, parsed and checked for shape."""
    try:
        doc = json_loads_bounded(body.decode("ascii"), MAX_DEPTH)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _corrupt(f"record {seq} is not valid JSON ({exc})", path) from exc
    if not isinstance(doc, dict) or set(doc) != _BODY_KEYS:
        raise _corrupt(f"record {seq} has the wrong shape", path)
    if not (isinstance(doc["grants"], dict) and isinstance(doc["pods"], dict) and type(doc["seq"]) is int
            and type(doc["version"]) is int and isinstance(doc["base"], str)):
        raise _corrupt(f"record {seq} has the wrong shape", path)
    return doc


def _changes(doc: dict[str, Any]) -> list[tuple[str, str, Any, int, int]]:
    """``(what, id, its JSON value or None, version, seq)`` of each change one record makes."""
    version, seq = doc["version"], doc["seq"]
    return ([("grant", cid, value, version, seq) for cid, value in doc["grants"].items()]
            + [("pod", pid, value, version, seq) for pid, value in doc["pods"].items()])


def _applied(state: LedgerState, changes: list[tuple[str, str, Any, int, int]], path: str) -> LedgerState:
    """``state`` with ``changes`` made in order. Each removal must find what it removes; only the
    last value of each grant or pod is decoded (a journal sets and removes the same containers
    over and over), and a few changes each make the next state from the last (carrying what a
    state works out from its grants), many are made to one copy."""
    last: dict[tuple[str, str], tuple[Any, int, int]] = {}
    for what, key, value, version, seq in changes:
        known = last.get((what, key))
        held = key in (state.grants if what == "grant" else state.pods) if known is None else known[0] is not None
        if value is None and not held:
            raise _corrupt(f"record {seq} removes {what} {key[:64]!r}, which the ledger does not hold", path)
        last[what, key] = (value, version, seq)
    if len(last) <= _CHAINED_CHANGES:
        for (what, key), (value, version, seq) in last.items():
            made = None if value is None else _decoded(what, key, value, version, seq, path)
            if made is None:
                state = state.without(key) if what == "grant" else state.without_pod(key)
            elif isinstance(made, Grant):
                state = state.with_grant(made)
            else:
                state = state.with_pod(made)
        return state
    grants, pods = dict(state.grants), dict(state.pods)
    for (what, key), (value, version, seq) in last.items():
        into: dict[str, Any] = grants if what == "grant" else pods
        if value is None:
            into.pop(key, None)
        else:
            into[key] = _decoded(what, key, value, version, seq, path)
    return LedgerState(grants, pods)


def _decoded(what: str, key: str, value: Any, version: int, seq: int, path: str) -> Grant | PodRecord:
    """The grant or pod record ``value`` of record ``seq``, migrated from its ``version``."""
    kind = "grants" if what == "grant" else "pods"
    try:
        if version != LEDGER_VERSION:
            doc = {"version": version, "written_by": "", "grants": {}, "pods": {}, kind: {key: value}}
            value = migrate(doc)[kind][key]
        made: Grant | PodRecord
        if what == "grant":
            made = Grant.from_dict(value)
            if made.container_id != key:
                raise LedgerCorrupt(f"grants[{key[:64]!r}] holds the grant of {made.container_id[:64]!r}")
        else:
            made = PodRecord.from_dict(value)
            if made.pod_id != key:
                raise LedgerCorrupt(f"pods[{key[:64]!r}] holds the record of {made.pod_id[:64]!r}")
    except (LedgerCorrupt, KeyError, TypeError) as exc:
        raise _corrupt(f"record {seq}: {exc}", path) from exc
    return made


def _corrupt(what: str, path: str) -> LedgerCorrupt:
    return corrupt(f"journal {what}", path)


def append(directory: str, path: str, line: bytes, start: int, new: bool) -> tuple[int, os.stat_result]:
    """Write ``line`` at byte ``start`` of the journal ``path`` (cutting off what follows) and
    sync it (``new``: the file did not exist, so the directory is synced too). Returns the open
    descriptor and its ``fstat`` after the write. On any failure the journal is cut back to
    ``start`` (best effort) and the error raised, so readers see the ledger without the record.

    Raises:
        UnsafePathError: the journal is not this user's private regular file.
        NotTakenBack: it failed, and so did cutting the journal back (readers may see the record).
        OSError: it cannot be opened, cut, written or synced.
    """
    fd = safefs.open_private(path, os.O_WRONLY | os.O_CREAT)
    try:
        try:
            size = os.fstat(fd).st_size
            if size < start:  # cut by someone else since it was read: appending would leave a hole
                raise OSError(errno.ESTALE, f"the journal has {size} bytes, {start} when it was read")
            if size != start:
                os.ftruncate(fd, start)
            os.lseek(fd, start, os.SEEK_SET)
            safefs.write_all(fd, line)
            os.fdatasync(fd)
            if new:
                safefs.fsync_dir(directory)
        except OSError as exc:
            if exc.errno == errno.ESTALE:
                raise
            try:
                os.ftruncate(fd, start)
            except OSError as again:
                raise NotTakenBack(exc, again) from exc
            try:
                os.fdatasync(fd)
            except OSError:
                pass  # the cut is in the page cache, which readers read
            raise
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def empty(path: str) -> None:
    """Cut the journal to nothing after a new snapshot holds its records (best effort: records
    that name an older snapshot are ignored, and the next append cuts them off)."""
    try:
        fd = safefs.open_private(path, os.O_WRONLY)
    except (OSError, UnsafePathError):
        return
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["NotTakenBack", "Replay", "append", "empty", "encode_record", "replay"]
