"""Ledger format versions: what this numa-pin writes, and how older files are read (pure).

The JSON-ready form of :class:`~numa_pin.ledger.model.LedgerState` carries a ``version``;
older versions are brought up to :data:`LEDGER_VERSION` by :data:`MIGRATIONS`, one step per
version, and newer ones are refused with :class:`numa_pin.errors.LedgerCorrupt` naming the
numa-pin release that wrote them:

* 1 -> 2: every grant gets ``cpuset_limit`` (``null``: no cpuset of its own);
* 2 -> 3: a grant's GPU undo record leaves its ``netdevs`` for a field of its own (``gpus``),
  and every pod gets an empty ``netdevs`` (VFs moved once into the pod's netns);
* 3 -> 4: the undo record of a moved VF (a grant's ``{"record": ...}`` netdevs entry, a pod
  netdev's ``record``) is a JSON object instead of JSON text inside the JSON ledger;
* 4 -> 5: records may follow in ``ledger.log`` (the data is the same). A snapshot that a journal
  may follow is stamped 5, so that a release that reads ``ledger.json`` alone (one from before the
  journal) refuses it instead of missing those records; one that none may follow, a small
  ledger's or one ``numa-pin recover --fold`` wrote, stays version 4
  (:data:`SNAPSHOT_ONLY_VERSION`), which those releases read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import MappingProxyType

from numa_pin import __version__
from numa_pin.base.boundedio import json_loads_bounded
from numa_pin.errors import LedgerCorrupt

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any, TypeGuard

#: how deep a netdev undo record may nest (the record, its PF-side VF config)
MAX_RECORD_DEPTH = 4

#: the newest ledger format this numa-pin reads and writes: a snapshot that journal records may follow
LEDGER_VERSION = 5
#: the format of a snapshot no journal record follows: what releases from before the journal read
SNAPSHOT_ONLY_VERSION = 4


def _v1_to_v2(d: dict[str, Any]) -> dict[str, Any]:
    """Version 2 adds ``cpuset_limit`` to every grant (``null``: no cpuset of its own)."""
    grants = d.get("grants")
    if isinstance(grants, dict):
        d["grants"] = {k: {**g, "cpuset_limit": None} if isinstance(g, dict) else g for k, g in grants.items()}
    d["version"] = 2
    return d


def _v2_to_v3(d: dict[str, Any]) -> dict[str, Any]:
    """Version 3 gives a grant's GPU undo record a field of its own (``gpus``; version 2 kept it
    as a ``{"gpu": "<json>"}`` entry of ``netdevs``) and every pod a ``netdevs`` list (VFs moved
    once into the pod's network namespace; version 2 moved none per pod).

    Raises:
        LedgerCorrupt: a version-2 GPU entry that is not the JSON object numa-pin wrote.
    """
    grants = d.get("grants")
    if isinstance(grants, dict):
        d["grants"] = {k: _split_gpu_entry(k, g) if isinstance(g, dict) else g for k, g in grants.items()}
    pods = d.get("pods")
    if isinstance(pods, dict):
        d["pods"] = {k: {**p, "netdevs": []} if isinstance(p, dict) else p for k, p in pods.items()}
    d["version"] = 3
    return d


def _split_gpu_entry(key: str, grant: dict[str, Any]) -> dict[str, Any]:
    netdevs = grant.get("netdevs")
    out = {**grant, "gpus": None}
    if not isinstance(netdevs, list):
        return out
    gpu = [e for e in netdevs if isinstance(e, dict) and "gpu" in e]
    if not gpu:
        return out
    merged: dict[str, Any] = {"nodes": [], "rules": [], "devices_dir": None, "bpf_dirs": []}
    for entry in gpu:
        try:
            rec = json.loads(entry["gpu"]) if isinstance(entry["gpu"], str) else None
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or not all(isinstance(rec.get(f), list) for f in ("nodes", "rules")):
            raise LedgerCorrupt(f"grant {key!r}: version-2 GPU record in netdevs is not a JSON object with "
                                f"nodes and rules: {str(entry['gpu'])[:80]!r}")
        merged["nodes"] += rec["nodes"]
        merged["rules"] += rec["rules"]
        if merged["devices_dir"] is None:
            merged["devices_dir"] = rec.get("devices_dir")
        if isinstance(rec.get("bpf_dirs"), list):
            merged["bpf_dirs"] += rec["bpf_dirs"]
    out["gpus"] = merged
    out["netdevs"] = [e for e in netdevs if not (isinstance(e, dict) and "gpu" in e)]
    return out


def _v3_to_v4(d: dict[str, Any]) -> dict[str, Any]:
    """Version 4 keeps the undo record of a moved VF as a JSON object (version 3 kept it as
    JSON text): ``{"record": "<json>"}`` entries of a grant's ``netdevs`` and the ``record`` of a
    pod's netdevs are parsed.

    Raises:
        LedgerCorrupt: a version-3 record that is not the text of a JSON object.
    """
    grants = d.get("grants")
    if isinstance(grants, dict):
        d["grants"] = {k: _parse_records("grant", k, g) if isinstance(g, dict) else g for k, g in grants.items()}
    pods = d.get("pods")
    if isinstance(pods, dict):
        d["pods"] = {k: _parse_records("pod", k, p) if isinstance(p, dict) else p for k, p in pods.items()}
    d["version"] = 4
    return d


def _parse_record(where: str, text: object) -> object:
    if not isinstance(text, str):
        return text  # the shape check of the current version names it
    try:
        rec = json_loads_bounded(text, MAX_RECORD_DEPTH)
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        raise LedgerCorrupt(f"{where}: version-3 netdev record is not the text of a JSON object: {text[:80]!r}")
    return rec


def _parse_records(what: str, key: str, owner: dict[str, Any]) -> dict[str, Any]:
    """``owner`` (a grant or a pod) with the record text of each of its ``netdevs`` parsed."""
    netdevs = owner.get("netdevs")
    if not isinstance(netdevs, list):
        return owner
    entries = [
        {**e, "record": _parse_record(f"{what} {key!r}", e["record"])} if isinstance(e, dict) and "record" in e else e
        for e in netdevs
    ]
    return {**owner, "netdevs": entries}


def _v4_to_v5(d: dict[str, Any]) -> dict[str, Any]:
    """Version 5: records may follow in ``ledger.log`` (the data is version 4's)."""
    d["version"] = 5
    return d


#: ``migrate`` steps: ``MIGRATIONS[n]`` turns a version-``n`` dict into a version ``n + 1`` dict
MIGRATIONS: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] = MappingProxyType(
    {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5}
)

def migrate(
    d: object,
    *,
    migrations: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] = MIGRATIONS,
    current: int = LEDGER_VERSION,
) -> dict[str, Any]:
    """Bring a ledger data dict to format version ``current``.

    Raises:
        LedgerCorrupt: not a dict, no integer ``version``, a version newer than ``current``
            (the message names the release that wrote it), or no migration step for it.
    """
    if not isinstance(d, dict):
        raise LedgerCorrupt(f"ledger data must be a JSON object, got {type(d).__name__}")
    version = d.get("version")
    if not _is_int(version):
        raise LedgerCorrupt(f"ledger data has no integer version (got {version!r})")
    if version > current:
        raise LedgerCorrupt(newer_version_message(version, d.get("written_by"), current))
    while version < current:
        step = migrations.get(version)
        if step is None:
            raise LedgerCorrupt(f"unknown ledger format version {version} (no migration to {current})")
        d = step(dict(d))
        version += 1
        if d.get("version") != version:
            raise LedgerCorrupt(f"migration from version {version - 1} did not produce version {version}")
    return d


def newer_version_message(version: int, written_by: object, current: int = LEDGER_VERSION) -> str:
    """The operator-facing text for a ledger written by a newer numa-pin."""
    writer = written_by if isinstance(written_by, str) and written_by else "a newer numa-pin"
    return (
        f"ledger format version {version} was written by {writer}; this numa-pin "
        f"{__version__} reads format versions up to {current}: run that numa-pin "
        "release (or newer) on this node"
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


__all__ = ["LEDGER_VERSION", "MAX_RECORD_DEPTH", "MIGRATIONS", "SNAPSHOT_ONLY_VERSION", "migrate",
           "newer_version_message"]
