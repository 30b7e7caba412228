"""The ledger file's bytes: encoding, decoding and checking them (pure, stdlib only).

The file is ``{"version": N, "checksum": "sha256:<hex>", "data": {...}}`` written by ``json.dumps``
with indent 1 and sorted keys; ``checksum`` is the SHA-256 of the *canonical* JSON of ``data``
(sorted keys, no whitespace, ASCII). :func:`encode` makes those bytes, reusing each unchanged
grant's text; :func:`decode` parses and verifies them and raises
:class:`~numa_pin.errors.LedgerCorrupt` (with :data:`REMEDY`) for anything else. Where the bytes
live, and how they are locked and replaced, is :mod:`numa_pin.ledger.store`.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from json.encoder import encode_basestring_ascii as _quote

from numa_pin.base.boundedio import json_loads_bounded
from numa_pin.base.digest import sha256_hex, sha256_hex_parts
from numa_pin.errors import LedgerCorrupt, LedgerError
from numa_pin.ledger import derived
from numa_pin.ledger.migrate import SNAPSHOT_ONLY_VERSION
from numa_pin.ledger.model import LEDGER_VERSION, Grant, LedgerState, newer_version_message

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    #: ``(grants, ids, indented members, canonical members)`` of the grants last encoded, in
    #: container id order, the members as the file's bytes
    Encoded = tuple[Mapping[str, Grant], list[str], list[bytes], list[bytes]]

#: what an operator should do about a corrupt ledger (appended to every LedgerCorrupt)
REMEDY = ("run `numa-pin recover`: it keeps the file aside and rebuilds the grants from what runs "
          "(numa-pin never resets it silently; until then only containers that ask for nothing start)")
#: deepest nesting read (a ledger nests 5 levels)
MAX_DEPTH = 32
#: longest container name or pod id a new grant may record (Kubernetes allows 253 characters)
MAX_NAME_CHARS = 1024


def check_new_grants(before: LedgerState, after: LedgerState, path: str) -> None:
    """Refuse a grant ``after`` adds or changes whose container name or pod id is longer than
    :data:`MAX_NAME_CHARS` (pure): a few such grants would grow the ledger past what its
    reader takes. Grants already recorded are left alone."""
    changed = derived.changed_from(after, before.grants)
    for cid in after.grants if changed is None else changed:
        grant = after.grants.get(cid)
        if grant is None:
            continue  # gone
        known = before.grants.get(cid)
        if known is grant or known == grant:  # the same object first: thousands of grants unchanged
            continue
        for what, value in (("container name", grant.container_name), ("pod id", grant.pod_id),
                            ("container id", grant.container_id)):
            if len(value) > MAX_NAME_CHARS:
                raise LedgerError(f"refusing to record container {cid[:64]!r}: its {what} has {len(value)} "
                                  f"characters, more than {MAX_NAME_CHARS}", path=path)


class Memo:
    """What one owner's encodings and decodings keep for the next (issue 21): a commit changes
    one grant of hundreds, and the unchanged ones are the very objects the last read or write
    returned. Its owner passes it in (:class:`~numa_pin.ledger.reader.ReadCache` is one); an
    encoding or decoding given none reuses nothing."""

    def __init__(self) -> None:
        #: the grants last encoded and their members: the next encoding copies these lists and
        #: mends them where a grant changed, came or went (None: nothing encoded yet)
        self.encoded: Encoded | None = None
        #: ``{container id: (repr of its JSON value, Grant)}`` of the grants last decoded: a
        #: grant whose JSON is unchanged is neither decoded nor checked again, and stays the
        #: same object (so its encoded text is reused too)
        self.decoded: dict[str, tuple[str, Grant]] = {}


#: stands for the grants in the rest of the document while it is encoded (a string JSON escapes
#: to one that no grant, pod or version text can hold)
_GRANTS_SLOT = "\x00grants\x00"
#: how deep a grant sits in the file: {"data": {"grants": {"<id>": {...}}}}
_GRANT_INDENT = "   "


def encode(state: LedgerState, version: int = LEDGER_VERSION, memo: Memo | None = None) -> bytes:
    """The file bytes for ``state`` in format ``version`` (:data:`LEDGER_VERSION`, or
    :data:`SNAPSHOT_ONLY_VERSION` for a snapshot no journal record follows; the data is the same):
    data, its version and its checksum (pure: the bytes of
    ``json.dumps`` of the document, indent 1 and sorted keys; each grant's part is encoded once
    and reused while the grant is unchanged, and a busy node's thousand grants are copied once
    into the checksum's text and once into the file's, never through a ``str``; the members are
    ``memo``'s, mended, when it is given)."""
    return encode_checked(state, version, memo)[0]


def encode_checked(state: LedgerState, version: int = LEDGER_VERSION, memo: Memo | None = None
                   ) -> tuple[bytes, str]:
    """:func:`encode`'s bytes and the ``checksum`` they state (what the journal's records name)."""
    if version not in (LEDGER_VERSION, SNAPSHOT_ONLY_VERSION):
        raise ValueError(f"ledger format {version} is neither {LEDGER_VERSION} nor {SNAPSHOT_ONLY_VERSION}")
    rest = LedgerState({}, state.pods).to_dict()
    rest["grants"], rest["version"] = _GRANTS_SLOT, version
    encoded = _members(state, None if memo is None else memo.encoded)
    if memo is not None:
        memo.encoded = encoded
    _, _, pretty, canonical = encoded
    slot = json.dumps(_GRANTS_SLOT)
    head, tail = _canonical(rest).split(slot, 1)
    digest = sha256_hex_parts((head + "{").encode("ascii"), b",".join(canonical), ("}" + tail).encode("ascii"))
    stated = "sha256:" + digest
    doc = {"version": version, "checksum": stated, "data": rest}
    before, after = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False).split(slot, 1)
    if not pretty:
        return f"{before}{{}}{after}\n".encode("ascii"), stated
    # one join: the head rides on the first member and the tail on the last (joining the members
    # first, then that with the head and tail, copies a busy node's megabyte twice: 8x slower)
    members = list(pretty)
    members[0] = before.encode("ascii") + b"{\n" + members[0]
    members[-1] += b"\n  }" + after.encode("ascii") + b"\n"
    return b",\n".join(members), stated


def _members(state: LedgerState, last: Encoded | None) -> Encoded:
    """``(grants, ids, indented members, canonical members)`` for the grants of ``state``, in id
    order: the lists of ``last`` mended where few grants differ from it, else made anew (the
    one that differs is known, :func:`~numa_pin.ledger.derived.changed_from`, where ``state``
    was made from the grants of ``last`` by one change)."""
    grants = state.grants
    if last is not None:
        before, ids, pretty, canonical = last
        if before is grants:
            return last
        one = derived.changed_from(state, before)
        if one is not None:
            changed = [cid for cid in one if cid in grants]
            gone = {cid for cid in one if cid not in grants}
        else:
            known = before.get
            changed = [cid for cid, grant in grants.items() if known(cid) is not grant]
            gone = before.keys() - grants.keys()
        if len(changed) + len(gone) <= max(8, len(grants) // 8):
            ids, pretty, canonical = list(ids), list(pretty), list(canonical)
            for cid in gone:
                at = bisect_left(ids, cid)
                del ids[at], pretty[at], canonical[at]
            for cid in changed:
                member, flat = _member(cid, grants[cid])
                at = bisect_left(ids, cid)
                if at < len(ids) and ids[at] == cid:
                    pretty[at], canonical[at] = member, flat
                else:
                    ids.insert(at, cid)
                    pretty.insert(at, member)
                    canonical.insert(at, flat)
            return grants, ids, pretty, canonical
    ids = sorted(grants)
    members = [_member(cid, grants[cid]) for cid in ids]
    return grants, ids, [m[0] for m in members], [m[1] for m in members]


def _member(cid: str, grant: Grant) -> tuple[bytes, bytes]:
    """``"<id>": {...}`` of one grant, as the file indents it and in canonical form."""
    d = grant.to_dict()
    key = _quote(cid)  # json.dumps of a str
    return (f"{_GRANT_INDENT}{key}: {_indented(d, chr(10) + _GRANT_INDENT)}".encode("ascii"),
            f"{key}:{_canonical(d)}".encode("ascii"))


def decode(raw: bytes, path: str, memo: Memo | None = None) -> LedgerState:
    """Parse and verify the file bytes ``raw`` read from ``path`` (pure but for ``memo``, whose
    grants are reused where their JSON is unchanged and which then keeps these).

    Raises:
        LedgerCorrupt: bad UTF-8/JSON, wrong shape, newer version, bad checksum.
    """
    return decode_checked(raw, path, memo)[0]


def decode_checked(raw: bytes, path: str, memo: Memo | None = None) -> tuple[LedgerState, str, int]:
    """:func:`decode`'s state, the file's ``checksum`` (what the journal's records name) and its
    format version (journal records follow only a snapshot of :data:`LEDGER_VERSION`)."""
    try:
        doc = json_loads_bounded(raw.decode("utf-8"), MAX_DEPTH, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise corrupt(f"not valid JSON ({exc})", path) from exc
    if not isinstance(doc, dict):
        raise corrupt(f"expected a JSON object, found {type(doc).__name__}", path)
    if set(doc) != {"version", "checksum", "data"}:
        raise corrupt(f"expected keys checksum, data, version; found {', '.join(sorted(doc))}", path)
    version, data, stated = doc["version"], doc["data"], doc["checksum"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise corrupt(f"version must be an integer, found {version!r}", path)
    if version > LEDGER_VERSION:
        written_by = data.get("written_by") if isinstance(data, dict) else None
        raise LedgerCorrupt(f"{newer_version_message(version, written_by)}; or `numa-pin recover` to rebuild it "
                            "from what runs (what only that release records is lost)", path=path)
    if not isinstance(data, dict):
        raise corrupt("data must be a JSON object", path)
    actual = checksum(data)
    if stated != actual:
        raise corrupt(f"checksum mismatch: file says {stated!r}, content hashes to {actual!r}", path)
    if data.get("version") != version:
        raise corrupt(f"version {version} does not match data version {data.get('version')!r}", path)
    try:
        return LedgerState.from_dict(data, None if memo is None else memo.decoded), actual, version
    except LedgerCorrupt as exc:
        raise corrupt(str(exc), path) from exc


def _indented(value: Any, newline: str) -> str:
    """``json.dumps(value, indent=1, sort_keys=True, allow_nan=False)`` with every line after
    the first starting with ``newline``'s indent: the same text, without the generic encoder's
    per-item overhead (a grant is a flat record with a few small containers)."""
    kind = type(value)
    if kind is str:
        return _quote(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float and value - value == 0:  # finite (json refuses NaN and infinities below)
        return float.__repr__(value)
    if value is None:
        return "null"
    if kind is dict:
        if not value:
            return "{}"
        inner = newline + " "
        items = [f"{inner}{_quote(_key(k))}: {_indented(v, inner)}" for k, v in sorted(value.items())]
        return "{" + ",".join(items) + newline + "}"
    if kind is list or kind is tuple:
        if not value:
            return "[]"
        inner = newline + " "
        return "[" + ",".join(inner + _indented(v, inner) for v in value) + newline + "]"
    return json.dumps(value, allow_nan=False)  # floats, true, false, and what json makes of the rest


def _key(key: object) -> str:
    """A dict key as JSON writes it (keys sort as they are: node ids as numbers, as json does)."""
    return key if isinstance(key, str) else json.dumps(key, allow_nan=False)


def checksum(data: dict[str, Any]) -> str:
    """``"sha256:<hex>"`` of the canonical JSON of ``data``."""
    return "sha256:" + sha256_hex(_canonical(data).encode("ascii"))


def _canonical(data: object) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def corrupt(what: str, path: str) -> LedgerCorrupt:
    return LedgerCorrupt(f"corrupt ledger: {what}; {REMEDY}", path=path)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


__all__ = ["MAX_DEPTH", "MAX_NAME_CHARS", "REMEDY", "Memo", "check_new_grants", "checksum", "corrupt", "decode",
           "decode_checked", "encode", "encode_checked"]
