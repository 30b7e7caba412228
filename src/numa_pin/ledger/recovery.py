"""Rebuild a lost or corrupt ledger from what runs on the node (``numa-pin recover``).

The ledger is the only record of which CPUs are held exclusively. When it is empty, cut short,
zeroed, bit-flipped or written by a newer numa-pin, every admission that asks for something
stops (a guess would hand CPUs out twice). Recovery rebuilds the grants before any new one is
made, from two sources, and never from a guess that could free a CPU a running container holds:

1. **What is left of the damaged file** (:func:`salvage`): every grant and pod record that still
   parses, checksum or not. One is kept only when the machine confirms it: it is alive as the
   service counts it (its process or populated cgroup, or a grant made at precreate within its
   grace period: ``Node.alive`` in :mod:`numa_pin.resources.node.base`) and, for an exclusive
   grant whose cgroup exists, that cgroup's ``cpuset.cpus`` are its CPUs. A kept
   grant carries everything the file said (devices, memory, VFs, policy).
2. **The cpuset cgroups themselves** (:func:`scan`): every populated container cgroup (its
   leaf names a container; systemd units and slices are not containers) whose ``cpuset.cpus``
   is narrower than the online CPUs, and that no kept grant already covers. The shared pool is
   a CPU set that is all online CPUs minus every set neither inside nor around it, chosen as
   :func:`_pool` says; a container on a part of the pool (its own cpuset), the pool, or more
   than it is shared, any other is exclusive. With no pool found every one is exclusive: CPUs
   may stay idle, none is handed out twice.
   A cgroup found this way gets a grant with its CPUs and memory nodes and no devices.

What cannot come back is written down in ``docs/ledger-config.md`` (Recovery).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from numa_pin.base import cpuset as cpulist
from numa_pin.base.boundedio import json_loads_bounded
from numa_pin.base.record import record
from numa_pin.enforcer.cgroups import child_dirs, leaf_container_id
from numa_pin.errors import LedgerCorrupt
from numa_pin.ledger.liveness import cgroup_populated, detect_cgroup_version
from numa_pin.ledger.model import KIND_EXCLUSIVE, KIND_SHARED, Grant, LedgerState, PodRecord

if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")

#: how deep the scan walks the cpuset hierarchy, and how many cgroups it reads at most
MAX_SCAN_DEPTH = 8
MAX_SCAN_CGROUPS = 20000
#: leaf suffixes of systemd units that are not containers
_UNITS = (".service", ".mount", ".socket", ".slice", ".swap", ".target", ".timer")
_JSON_DEPTH = 32


@record
class Recovery:
    """What :func:`rebuild` made of a damaged ledger."""

    state: LedgerState
    salvaged: tuple[str, ...]  # grants taken from the damaged file, confirmed by the machine
    found: tuple[str, ...]  # grants rebuilt from cpuset cgroups
    dropped: tuple[str, ...]  # grants of the damaged file that nothing running confirms


def salvage(raw: bytes | None) -> tuple[dict[str, Grant], dict[str, PodRecord]]:
    """Every grant and pod record of a damaged ledger file that still parses on its own (pure).
    The checksum and version are not checked: the machine confirms each grant instead."""
    if not raw:
        return {}, {}
    try:
        doc = json_loads_bounded(raw.decode("utf-8", "replace"), _JSON_DEPTH)
    except ValueError:
        return {}, {}
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict):
        return {}, {}
    grants = _records(data.get("grants"), Grant.from_dict, lambda grant: grant.container_id)
    pods = _records(data.get("pods"), PodRecord.from_dict, lambda pod: pod.pod_id)
    return grants, pods


def _records(value: object, parse: Callable[[Any], T], key: Callable[[T], str]) -> dict[str, T]:
    """The entries of one map of a damaged ledger that parse on their own and sit under their
    own key."""
    out: dict[str, T] = {}
    for name, entry in _items(value):
        try:
            rec = parse(entry)
        except (LedgerCorrupt, ValueError, TypeError, AttributeError, KeyError):
            continue
        if key(rec) == name:
            out[name] = rec
    return out


def scan(cgroup_root: str, online: frozenset[int], reserved: frozenset[int] = frozenset(),
         skip: Iterable[str] = ()) -> dict[str, Grant]:
    """Grants for the populated container cgroups on fewer CPUs than ``online`` (see the module
    doc), by container id; cgroups in ``skip`` (relative paths) and below them are left out."""
    version = detect_cgroup_version(cgroup_root)
    base = os.path.normpath(cgroup_root if version == 2 else os.path.join(cgroup_root, "cpuset"))
    skipped = {"/" + p.strip("/") for p in skip}
    found: dict[str, tuple[frozenset[int], frozenset[int]]] = {}  # rel -> (cpus, mems)
    level, seen = [base], 0
    for _depth in range(MAX_SCAN_DEPTH):
        below: list[str] = []
        for directory in level:
            for child in child_dirs(directory):
                seen += 1
                if seen > MAX_SCAN_CGROUPS:
                    break
                rel = "/" + os.path.relpath(child, base).replace(os.sep, "/")
                if rel in skipped:
                    continue
                held = _container_cpuset(child, rel, online)
                if held is None:
                    below.append(child)
                elif cgroup_populated(child):
                    found[rel] = held
        level = below
        if not level:
            break
    pool = _pool(found, online, reserved)
    out: dict[str, Grant] = {}
    now = time.time()
    for rel, (cpus, mems) in sorted(found.items()):
        shared = pool is not None and (cpus <= pool or pool <= cpus) or bool(cpus & reserved)
        cid = leaf_container_id(rel) or rel
        if cid in out:
            cid = rel
        out[cid] = Grant(
            container_id=cid, pod_id="", container_name="", kind=KIND_SHARED if shared else KIND_EXCLUSIVE,
            cgroup=rel, cpus=frozenset() if shared else cpus, mems=frozenset() if shared else mems, created=now,
        )
    return out


def rebuild(
    raw: bytes | None, alive: Callable[[Grant], bool], cgroup_cpus: Callable[[Grant], frozenset[int] | None],
    cgroup_root: str, online: frozenset[int], reserved: frozenset[int] = frozenset(),
) -> Recovery:
    """The ledger to write in place of the damaged bytes ``raw``: salvaged grants the machine
    confirms (``alive``; ``cgroup_cpus(grant)``, the CPUs its cgroup has, or None when it has
    none, must be an exclusive grant's own), plus grants :func:`scan` finds for the rest."""
    grants, pods = salvage(raw)
    kept: dict[str, Grant] = {}
    dropped: list[str] = []
    for cid, grant in sorted(grants.items()):
        ok = alive(grant)
        if ok and grant.kind == KIND_EXCLUSIVE and grant.cpus:
            actual = cgroup_cpus(grant)
            ok = actual is None or actual == grant.cpus
        if ok:
            kept[cid] = grant
        else:
            dropped.append(cid)
    found = scan(cgroup_root, online, reserved, skip=[g.cgroup for g in kept.values() if g.cgroup])
    found = {cid: g for cid, g in found.items() if cid not in kept}
    held = {c for g in kept.values() if g.kind == KIND_EXCLUSIVE for c in g.cpus}
    clash = [cid for cid, g in found.items() if g.cpus & held]
    for cid in clash:  # a found cgroup on CPUs a kept grant holds: that grant's cgroup is elsewhere
        found[cid] = Grant(cid, "", "", KIND_SHARED, cgroup=found[cid].cgroup, created=found[cid].created)
    every = {**kept, **found}
    pods_kept = {pid: pod for pid, pod in pods.items() if any(g.pod_id == pid for g in every.values())}
    try:
        state = LedgerState(every, pods_kept)
    except ValueError:  # records that contradict each other: keep the grants, which hold the CPUs
        state = LedgerState(every, {})
    return Recovery(state, tuple(sorted(kept)), tuple(sorted(found)), tuple(dropped))


def _items(value: object) -> list[tuple[str, object]]:
    return sorted((k, v) for k, v in value.items() if isinstance(k, str)) if isinstance(value, dict) else []


def _container_cpuset(
    directory: str, rel: str, online: frozenset[int]
) -> tuple[frozenset[int], frozenset[int]] | None:
    """``(cpus, mems)`` of a container cgroup narrower than ``online``; None for anything else
    (not a container's leaf, no cpuset files, all online CPUs)."""
    leaf = rel.rsplit("/", 1)[-1]
    if leaf.endswith(_UNITS) or leaf == "init.scope" or leaf_container_id(rel) is None:
        return None
    try:
        with open(os.path.join(directory, "cpuset.cpus"), "rb") as fp:
            cpus = cpulist.parse_list(fp.read(65536).decode("ascii", "replace").strip())
        with open(os.path.join(directory, "cpuset.mems"), "rb") as fp:
            mems = cpulist.parse_list(fp.read(65536).decode("ascii", "replace").strip())
    except (OSError, ValueError):
        return None
    if not cpus or cpus >= online:
        return None
    return cpus, mems


def _pool(found: dict[str, tuple[frozenset[int], frozenset[int]]], online: frozenset[int],
          reserved: frozenset[int]) -> frozenset[int] | None:
    """The shared pool among the found containers' ``(cpus, mems)``, or None (then every one is
    exclusive: CPUs may stay idle, none is handed out twice).

    A candidate is a CPU set that is every online CPU the sets neither inside nor around it do
    not have (exclusive sets and the pool partition the node). Exclusive grants and the pool
    look alike as sets, so among candidates the pool is the one that holds a reserved CPU, else
    the one the most containers sit on or inside, else the one with the most memory nodes (an
    exclusive grant is pinned to its own), else the largest."""
    sets = {cpus for cpus, _ in found.values()}
    ranked = []
    for cpus in sets:
        rest: set[int] = set()
        for other in sets:
            if not (other <= cpus or other >= cpus):  # inside it (a limit) or around it: shared
                rest |= other
        if cpus != online - rest:
            continue
        members = [mems for c, mems in found.values() if c <= cpus]
        widest = max((len(m) for m in members), default=0)
        ranked.append((bool(cpus & reserved), len(members), widest, len(cpus), sorted(cpus)))
    if not ranked:
        return None
    return frozenset(max(ranked)[4])


__all__ = ["MAX_SCAN_CGROUPS", "MAX_SCAN_DEPTH", "Recovery", "rebuild", "salvage", "scan"]
