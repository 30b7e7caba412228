"""No scheduler load balancing on a container's exclusive CPUs: the load-balancing knob.

A container asks with ``cpu-load-balancing.crio.io: disable`` (or
``numa-pin.io/cpu-load-balancing``).

cgroup v2: the container's cgroup becomes an *isolated partition*: its CPUs leave every
scheduling domain. A cgroup whose parent is not a partition root (every container cgroup but
one at the top) can only be one when each ancestor below the root lists those CPUs in
``cpuset.cpus.exclusive`` (Linux 6.7's remote partitions). So numa-pin adds the grant's CPUs to
``cpuset.cpus.exclusive`` of each ancestor, top down, sets the container's own to its CPUs and
writes ``isolated`` to its ``cpuset.cpus.partition``, then reads that file back: the kernel
writes ``isolated invalid (<reason>)`` when it will not, and the admission fails with that
reason (everything written is rolled back). A kernel without ``cpuset.cpus.partition``, or
without ``cpuset.cpus.exclusive`` where an ancestor needs it, rejects the container with one
line before anything is written.

cgroup v1: ``cpuset.sched_load_balance`` is set to 0 on the container's cpuset and on each
ancestor below the root that has it at 1. It takes effect only when the root cpuset has it at
0 too; numa-pin never turns the root's off itself, since every task in the root cpuset (most
host processes on a v1 node) would lose balancing with it. When the root's is 1 the container
is rejected with one line saying so; an administrator who shields CPUs (``cset shield``, a
balanced cpuset for the rest) sets the root's to 0.

Ancestors are shared by many containers: each grant's record (in the node's IRQ and partition journal,
written before the first write) says which CPUs it added to which ancestor (v2), or which
flags it turned off (v1); what a grant added is taken back when it goes, and a v1 flag is
turned back on only when no remaining grant sits below it. ``reconcile`` re-asserts the
partition of every live grant that asks, and undoes the records of grants the ledger no longer
holds (a crash between the writes and the commit).
"""

from __future__ import annotations

import os

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.enforcer import cgroups as cg
from numa_pin.errors import EnforcementError, IsolationError
from numa_pin.resources.base import Resource
from numa_pin.resources.node.base import Admission, Node, NodeResource, Release

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from typing import Any

    from numa_pin.enforcer.undo import UndoLog
    from numa_pin.ledger.model import Grant, LedgerState

PARTITION = "cpuset.cpus.partition"
EXCLUSIVE = "cpuset.cpus.exclusive"
LOAD_BALANCE = "cpuset.sched_load_balance"
ISOLATED = "isolated"
DISABLE = "disable"
#: the annotations a container asks with, CRI-O's name first
ANNOTATIONS = ("cpu-load-balancing.crio.io", "numa-pin.io/cpu-load-balancing")


def asks(grant: Grant) -> bool:
    """Whether ``grant`` asked for no load balancing on its CPUs (``Grant.isolation``, which
    :mod:`numa_pin.requests.isolation` checked when the grant was made)."""
    return grant.isolation.get("load_balancing") == DISABLE and bool(grant.cpus)


def _read(path: str) -> str:
    return cg.read_cgroup_file(path)


def _write(path: str, text: str, undo: UndoLog, what: str) -> None:
    """Write ``text`` unless the file says it already; the old value goes into ``undo``."""
    old = _read(path)
    if old == text:
        return
    cg.write_cgroup_file(path, text)
    undo.record(f"{what} {path} {old!r}", lambda: cg.write_cgroup_file(path, old))


def _ancestors(ref: cg.CgroupRef) -> list[str]:
    """The cgroup directories strictly between the hierarchy root and the container's, top down."""
    root, out, d = ref.hierarchy_root, [], os.path.dirname(ref.cpuset_dir)
    while len(d) > len(root) and d.startswith(root):
        out.append(d)
        d = os.path.dirname(d)
    return out[::-1]


# ---- cgroup v2 -----------------------------------------------------------------------
def _check_v2(grant: Grant, ref: cg.CgroupRef, ancestors: list[str]) -> None:
    """Refuse (before any write) on a kernel without what an isolated partition needs here."""
    if not os.path.exists(os.path.join(ref.cpuset_dir, PARTITION)):
        raise IsolationError(
            f"container {grant.container_id} asks cpu-load-balancing=disable, but this kernel has no cpuset "
            f"partitions ({PARTITION} is missing)", path=ref.cpuset_dir)
    if ancestors and not os.path.exists(os.path.join(ref.cpuset_dir, EXCLUSIVE)):
        raise IsolationError(
            f"container {grant.container_id} asks cpu-load-balancing=disable, but its cgroup is nested and this "
            f"kernel has no {EXCLUSIVE} (a nested isolated partition needs Linux 6.7 or later)", path=ref.cpuset_dir)


def blockers(node: Node, state: LedgerState, grant: Grant, root: str, own: str | None) -> dict[str, frozenset[int]]:
    """``{sibling: CPUs}``: the top-level cgroups (children of ``root``, the hierarchy's; ``own``
    left out) that list some of ``grant``'s CPUs in their own ``cpuset.cpus``, where the kernel
    would declare a top-level partition on them invalid. Host cgroups numa-pin holds are not
    counted (they leave the partition's CPUs before it is made:
    :func:`~numa_pin.resources.node.host.settle_host`), nor other grants' cgroups (their CPUs are
    theirs); one an administrator or another tool pinned is."""
    from numa_pin.resources.node import host

    skip = {os.path.normpath(own or root), *host.held_dirs(node)}
    skip |= {os.path.normpath(os.path.join(root, g.cgroup.lstrip("/"))) for g in state.grants.values() if g.cgroup}
    out: dict[str, frozenset[int]] = {}
    for sibling in cg.child_dirs(root):
        if os.path.normpath(sibling) in skip:
            continue
        try:
            listed = parse_list(_read(os.path.join(sibling, "cpuset.cpus")))
            kind = _read(os.path.join(sibling, PARTITION)).split() if os.path.exists(
                os.path.join(sibling, PARTITION)) else ["member"]
        except (EnforcementError, ValueError):
            continue  # no cpuset here, or gone
        if listed & grant.cpus and kind[:1] == ["member"]:
            out[sibling] = listed & grant.cpus
    return out


def _check_siblings(node: Node, state: LedgerState, grant: Grant, ref: cg.CgroupRef) -> None:
    """A top-level partition (v2): refuse, before any write, when :func:`blockers` finds a sibling."""
    for sibling, cpus in sorted(blockers(node, state, grant, ref.hierarchy_root, ref.cpuset_dir).items()):
        raise IsolationError(
            f"container {grant.container_id} asks cpu-load-balancing=disable, but the top-level cgroup "
            f"{os.path.basename(sibling)} lists CPUs {format_list(cpus)} in its own cpuset (the kernel would "
            "make the partition invalid; host services and this partition cannot both have them)", path=sibling)


def preview(node: Node, state: LedgerState, grant: Grant) -> str:
    """What ``plan`` says of a grant asking no load balancing on cgroup v2 before its cgroup is
    known: whether this kernel can make a nested partition, and the top-level cgroups that keep
    the node from having one beside them."""
    where = node.layout().hierarchy_subdir("cpuset")
    if where is None:
        return "cannot: no cgroup hierarchy carries the cpuset controller"
    root = cg.hierarchy_dir("/", node.config.cgroup_root, where[1])
    if where[0] == 1:
        balance = os.path.join(root, LOAD_BALANCE)
        if os.path.exists(balance) and _read(balance) != "0":
            return "cannot: the root cpuset balances load (sched_load_balance 1); numa-pin does not turn it off"
        return f"sched_load_balance 0 on the container's cpuset (CPUs {format_list(grant.cpus)})"
    children = cg.child_dirs(root)
    if not any(os.path.exists(os.path.join(d, PARTITION)) for d in children):
        return f"cannot: this kernel has no cpuset partitions ({PARTITION} is missing)"
    nested = any(os.path.exists(os.path.join(d, EXCLUSIVE)) for d in children)
    blocked = blockers(node, state, grant, root, None)
    why = ", ".join(f"{os.path.basename(d)} lists CPUs {format_list(c)} in its own cpuset"
                    for d, c in sorted(blocked.items()))
    why += " (host services and an isolated partition cannot both have them)"
    if nested:
        return f"an isolated partition on CPUs {format_list(grant.cpus)}" + (
            f"; at the top of the hierarchy it cannot: {why}" if blocked else "")
    if blocked:
        return f"cannot: this kernel has no {EXCLUSIVE} (a nested partition needs Linux 6.7), and at the top: {why}"
    return (f"an isolated partition on CPUs {format_list(grant.cpus)} only where the container's cgroup is at the "
            f"top of the hierarchy (this kernel has no {EXCLUSIVE}: a nested one needs Linux 6.7)")


def _plan_v2(grant: Grant, ref: cg.CgroupRef, ancestors: list[str]) -> dict[str, Any]:
    added = {}
    for d in ancestors:
        have = parse_list(_read(os.path.join(d, EXCLUSIVE)))
        if grant.cpus - have:
            added[d] = format_list(grant.cpus - have)
    return {"version": 2, "dir": ref.cpuset_dir, "added": added}


def _apply_v2(grant: Grant, ref: cg.CgroupRef, ancestors: list[str], undo: UndoLog) -> None:
    for d in ancestors:
        path = os.path.join(d, EXCLUSIVE)
        have = parse_list(_read(path))
        if grant.cpus - have:
            _write(path, format_list(have | grant.cpus), undo, "exclusive CPUs of")
    own = os.path.join(ref.cpuset_dir, EXCLUSIVE)
    if os.path.exists(own):
        _write(own, format_list(grant.cpus), undo, "exclusive CPUs of")
    path = os.path.join(ref.cpuset_dir, PARTITION)
    _write(path, ISOLATED, undo, "partition")
    state = _read(path)
    if state != ISOLATED:
        raise IsolationError(
            f"the kernel did not make container {grant.container_id}'s cgroup an isolated partition: {state}",
            path=path)


def _undo_v2(entry: dict[str, Any], undo: UndoLog) -> None:
    d = entry["dir"]
    if os.path.isdir(d):
        _write(os.path.join(d, PARTITION), "member", undo, "partition")
        if os.path.exists(os.path.join(d, EXCLUSIVE)):
            _write(os.path.join(d, EXCLUSIVE), "", undo, "exclusive CPUs of")
    for anc, cpus in sorted(entry.get("added", {}).items(), key=lambda kv: -len(kv[0])):  # bottom up
        path = os.path.join(anc, EXCLUSIVE)
        if os.path.exists(path):
            have = parse_list(_read(path))
            _write(path, format_list(have - parse_list(cpus)), undo, "exclusive CPUs of")


# ---- cgroup v1 -----------------------------------------------------------------------
def _check_v1(grant: Grant, ref: cg.CgroupRef) -> None:
    if not os.path.exists(os.path.join(ref.cpuset_dir, LOAD_BALANCE)):
        raise IsolationError(f"container {grant.container_id} asks cpu-load-balancing=disable, but its cpuset "
                             f"has no {LOAD_BALANCE}", path=ref.cpuset_dir)
    _check_v1_root(grant, ref.hierarchy_root)


def _check_v1_root(grant: Grant, hierarchy_root: str) -> None:
    root = os.path.join(hierarchy_root, LOAD_BALANCE)
    if os.path.exists(root) and _read(root) != "0":
        raise IsolationError(
            f"container {grant.container_id} asks cpu-load-balancing=disable, but on cgroup v1 that takes effect "
            "only when the root cpuset balances nothing itself, and its sched_load_balance is 1; numa-pin does not "
            "turn it off for the whole node (set it to 0, with a balanced cpuset for the other CPUs)", path=root)


def _check_root_only(node: Node, grant: Grant) -> None:
    """Before the container's cgroup exists (podman's precreate, NRI's CreateContainer): what the
    hierarchy's root alone rules out, so every path refuses such a container at its first call."""
    found = node.layout().hierarchy_subdir("cpuset")
    if found is not None and found[0] == 1:
        _check_v1_root(grant, os.path.join(node.config.cgroup_root, found[1]))


def _plan_v1(ref: cg.CgroupRef, ancestors: list[str]) -> dict[str, Any]:
    changed = [d for d in (*ancestors, ref.cpuset_dir) if _read(os.path.join(d, LOAD_BALANCE)) != "0"]
    return {"version": 1, "dir": ref.cpuset_dir, "changed": changed}


def _undo_v1(entry: dict[str, Any], others: list[dict[str, Any]], undo: UndoLog) -> None:
    """Turn back on the flags ``entry`` turned off, bottom up; one that another grant still sits
    below passes to that grant's record, which turns it back on when it goes."""
    for d in sorted(entry.get("changed", ()), key=len, reverse=True):
        below = next((o for o in others if o["dir"] == d or o["dir"].startswith(d.rstrip("/") + "/")), None)
        if below is not None:
            below["changed"] = sorted({*below.get("changed", ()), d})
        elif os.path.exists(os.path.join(d, LOAD_BALANCE)):
            _write(os.path.join(d, LOAD_BALANCE), "1", undo, "sched_load_balance of")


def preflight(node: Node, admission: Admission) -> None:
    """Refuse, before any resource writes, a grant that asks on a kernel or a cgroup v1 root
    that cannot give it (see :func:`_check_v2` and :func:`_check_v1`)."""
    grant, ref = admission.grant, admission.ref
    if not asks(grant):
        return
    if ref is None:
        _check_root_only(node, grant)
    elif ref.version == 2:
        ancestors = _ancestors(ref)
        _check_v2(grant, ref, ancestors)
        if not ancestors:
            _check_siblings(node, admission.state, grant, ref)
    else:
        _check_v1(grant, ref)


# ---- the resource --------------------------------------------------------------------
def settle(node: Node, state: LedgerState, undo: UndoLog, ensure: tuple[Grant, ...]) -> list[str]:
    """Undo the records of grants ``state`` no longer holds (or that no longer ask), then make
    the grants of ``ensure`` isolated. Returns the ids of the grants it wrote for."""
    from numa_pin.resources.node import host, journal

    cfg = node.config
    doc = journal.read(cfg.state_dir, node.boot_id)
    records: dict[str, Any] = dict(doc.get("partitions") or {})
    done: list[str] = []
    stale = sorted(cid for cid in records if cid not in state.grants or not asks(state.grants[cid]))
    for cid in stale:
        entry = records.pop(cid)
        if entry.get("version") == 1:
            records = {k: dict(v) for k, v in records.items()}  # a flag may pass to another record
            _undo_v1(entry, [v for k, v in sorted(records.items()) if k not in stale], undo)
        else:
            _undo_v2(entry, undo)
        done.append(cid)
    if stale:
        doc = {**doc, "partitions": records}
        journal.write(cfg.state_dir, node.boot_id, doc, undo)
        host.settle_host(node, state, undo)  # host cgroups kept off the partitions' CPUs get them back
    for grant in ensure:
        ref = node.live_cgroup_ref(grant)
        if ref is None or not asks(grant):
            continue
        ancestors = _ancestors(ref)
        if ref.version == 2:
            _check_v2(grant, ref, ancestors)
            if not ancestors:  # the host cgroups numa-pin holds leave its CPUs first
                host.settle_host(node, state, undo)
                _check_siblings(node, state, grant, ref)
            entry = _plan_v2(grant, ref, ancestors)
            old = records.get(grant.container_id)
            if old is not None and old.get("dir") == entry["dir"]:  # what it added earlier stays its own
                entry["added"] = {**old.get("added", {}), **entry["added"]}
        else:
            _check_v1(grant, ref)
            entry = _plan_v1(ref, ancestors)
            old = records.get(grant.container_id)
            if old is not None and old.get("dir") == entry["dir"]:
                entry["changed"] = sorted(set(old.get("changed", ())) | set(entry["changed"]))
        if records.get(grant.container_id) != entry:  # the record before the first write
            records[grant.container_id] = entry
            doc = {**doc, "partitions": dict(records)}
            journal.write(cfg.state_dir, node.boot_id, doc, undo)
        marks = len(undo)
        if ref.version == 2:
            _apply_v2(grant, ref, ancestors, undo)
        else:
            for d in (*ancestors, ref.cpuset_dir):
                _write(os.path.join(d, LOAD_BALANCE), "0", undo, "sched_load_balance of")
        if len(undo) != marks:
            done.append(grant.container_id)
    return done


class PartitionResource(Resource):
    """The pure half: a grant's words for ``status``."""

    name = "cpu-load-balancing"

    def describe(self, grant: Grant) -> list[str]:
        return ["load-balancing=disable"] if asks(grant) else []  # the word of IsolationRequest.words()


class PartitionNode(PartitionResource, NodeResource):
    """The load-balancing knob: enforce, release and repair (see the module's doc)."""

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        grant = admission.grant
        if asks(grant) or any(asks(g) for g in admission.dropped):
            settle(node, admission.state, admission.undo, (grant,) if admission.ref is not None else ())
        return admission

    def release(self, node: Node, release: Release) -> list[str]:
        if any(asks(g) for g in release.gone):
            settle(node, release.after, release.undo, ())
        return []

    def collect(self, node: Node, before: LedgerState, after: LedgerState, gone: tuple[Grant, ...]) -> list[str]:
        """Grants found dead (or of an earlier boot): what their records added is taken back now;
        a journal of an earlier boot is dropped, never undone."""
        if not any(asks(g) for g in gone):
            return []
        from numa_pin.enforcer.undo import UndoLog
        from numa_pin.resources.node import journal

        try:
            journal.drop_earlier_boot(node.config.state_dir, node.boot_id)
            settle(node, after, UndoLog(), ())
        except EnforcementError as exc:  # the next reconcile tries again
            return [f"load balancing not given back: {exc}"]
        return []

    def repair(self, node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
        live = tuple(g for _, g in sorted(state.grants.items()) if asks(g))
        return [cid for cid in settle(node, state, undo, live) if cid in state.grants]

    def preview(self, node: Node, state: LedgerState, grant: Grant, applied: bool) -> str | None:
        """``plan``'s line (see :func:`preview`); ``explain``'s: the partition as the kernel shows it."""
        if not asks(grant):
            return None
        ref = node.live_cgroup_ref(grant) if applied and grant.cgroup else None
        if ref is None:
            return preview(node, state, grant)
        try:
            return f"{ref.rel_path}: {_read(os.path.join(ref.cpuset_dir, PARTITION))}"
        except EnforcementError as exc:
            return f"cannot: {exc}"

    def status(self, node: Node, state: LedgerState) -> dict[str, Any]:
        held = [g.container_id for _, g in sorted(state.grants.items()) if asks(g)]
        return {"load_balancing_off": held} if held else {}


__all__ = ["ANNOTATIONS", "PartitionNode", "PartitionResource", "asks", "blockers", "preflight", "preview", "settle"]
