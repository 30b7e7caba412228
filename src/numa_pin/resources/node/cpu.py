"""Exclusive CPUs and the shared pool on the machine: the I/O half of the CPU resource.

* enforce: the container's cpuset (its exclusive CPUs and memory nodes; a shared container
  gets the shared pool, inside its own cpuset if it has one, and keeps its memory nodes), then
  every other shared container's cpuset (with the cpuset cgroups nested in it) shrinks to the
  new pool when the pool changed; one the kernel will not shrink is left as it was, logged,
  and shown by :func:`blocked_shared`, so that it blocks nobody's admission;
* mixed containers (``cpu-shared``: exclusive CPUs and the shared pool, one cpuset) follow the
  pool as the shared containers do, on every change of it (:func:`_follow_mixed`);
* release: the pool grows back when a grant with exclusive CPUs went (a failure rolls back);
* repair (``reconcile``): every live cgroup's cpuset is written again where it drifted;
* conflicts: grants holding CPUs the current config reserves;
* status: the shared pool, the reserved CPUs, and the CPUs free for exclusive use per node.
"""

from __future__ import annotations

import os

from numa_pin.base.cpuset import format_list
from numa_pin.base.record import replace
from numa_pin.enforcer import cgroups as cg
from numa_pin.enforcer.cpuset import apply_cpuset
from numa_pin.enforcer.nested import cpus_file, leaf_dirs, read_list
from numa_pin.enforcer.pool import ResizeResult, check_shared, reserved_conflicts, resize_shared
from numa_pin.enforcer.pool import shared_pool as pool_of
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import AllocationError, CgroupEscapeError, NumaPinError
from numa_pin.ledger.model import KIND_SHARED, Grant, LedgerState
from numa_pin.reporting import report
from numa_pin.resources.cpu import CpuResource, cpuset_of, mixed, mixed_env
from numa_pin.resources.node.base import Admission, Node, NodeResource, Release

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from typing import Any

    from numa_pin.resources.node.runtime import RuntimeAsk, RuntimeEdit


def reserved(node: Node) -> frozenset[int]:
    """The CPUs reserved for the system (computed once per node: config and topology only)."""

    def compute() -> frozenset[int]:
        from numa_pin.allocators.cpu import reserved_cpus
        from numa_pin.topology.cpus import CpuTopology

        s = node.settings
        return reserved_cpus(
            CpuTopology.from_topology(node.topology), s.cpu_options, s.reserved_cpus, s.num_reserved_cpus
        )

    out: frozenset[int] = node.memo("cpu.reserved", compute)
    return out


def shared_pool(node: Node, state: LedgerState) -> frozenset[int]:
    """All CPUs minus every exclusive grant (and minus the reserved CPUs with
    ``strict-cpu-reservation``); without it the reserved CPUs keep it from emptying."""
    strict = node.settings.cpu_options.strict_cpu_reservation
    online = node.topology.cpu_ids  # minus the kernel's isolated CPUs unless the config lets them in
    online = online if node.config.isolation.shared_pool_isolated else online - node.settings.isolated_cpus
    return pool_of(online, [state.exclusive_cpus()], reserved(node), strict=strict)


def blocked_shared(node: Node, state: LedgerState) -> list[str]:
    """One line per shared container still on CPUs outside the shared pool: one the kernel
    would not shrink (a nested cgroup it keeps busy, a v2 partition), left as it was so that
    it blocks nobody's admission (read from the cgroups; nothing is written)."""
    ids = _shared_ids(node, state)
    return [f"{ids[b.ref]}: {b}" for b in check_shared(ids, shared_pool(node, state), _limits(node, state))]


def warm(node: Node, state: LedgerState) -> None:
    """Check every shared container's cgroup path now, see which have no cgroup below them, open
    their ``cpuset.cpus`` for writing, and keep all three in the node's
    :class:`~numa_pin.resources.node.warm.WarmState`, forgetting (and closing) what it kept
    before; a node without one (cold) keeps nothing. The agent's spare calls it at each
    rehearsal, so what it saw is at most :data:`~numa_pin.agent.spare.REHEARSE_EVERY_S` old when
    the request it serves uses it."""
    kept = node.warm_state
    if kept is None:
        return
    kept.forget()
    kept.refs = {}
    kept.leaves = leaf_dirs(_shared_refs(node, state))
    kept.handles = cg.open_handles(cpus_file(d) for d in sorted(kept.leaves))


def _shared_ids(node: Node, state: LedgerState, exclude: str | None = None,
                real_dirs: dict[str, str] | None = None) -> dict[cg.CgroupRef, str]:
    """The cgroups of the shared containers (``exclude`` left out), with their container ids
    (:func:`_shared_refs`)."""
    return {ref: cid for cid, ref in _shared_pairs(node, state, exclude, real_dirs)}


def _checked_refs(node: Node, grants: list[Grant], real_dirs: dict[str, str] | None,
                  escaped: list[Grant] | None = None) -> list[tuple[str, cg.CgroupRef]]:
    """(container id, cgroup) of each of ``grants``, every path checked (one pass; path by path
    once one fails). A grant whose path leaves the cgroup root is left out, told to the node
    (:meth:`~numa_pin.resources.node.base.Node.escaped`, which sets it aside) and added to
    ``escaped``: one bad record never blocks the node's admissions."""
    root, layout = node.config.cgroup_root, node.layout()
    try:
        refs = cg.refs_from_paths([g.cgroup or "" for g in grants], root, layout, real_dirs)
        return [(g.container_id, ref) for g, ref in zip(grants, refs)]
    except CgroupEscapeError:
        pass
    out = []
    for g in grants:
        try:
            out.append((g.container_id, cg.refs_from_paths([g.cgroup or ""], root, layout, real_dirs)[0]))
        except CgroupEscapeError as exc:
            node.escaped(g, str(exc))
            if escaped is not None:
                escaped.append(g)
    return out


def _shared_refs(node: Node, state: LedgerState, exclude: str | None = None,
                 real_dirs: dict[str, str] | None = None,
                 escaped: list[Grant] | None = None) -> tuple[cg.CgroupRef, ...]:
    """The cgroups of the shared containers (:func:`_shared_pairs`)."""
    return tuple(ref for _, ref in _shared_pairs(node, state, exclude, real_dirs, escaped))


def _shared_pairs(node: Node, state: LedgerState, exclude: str | None = None,
                  real_dirs: dict[str, str] | None = None,
                  escaped: list[Grant] | None = None) -> tuple[tuple[str, cg.CgroupRef], ...]:
    """The cgroups of the shared containers (``exclude`` left out) with their container ids, in
    container id order; one whose path leaves the cgroup root is left out (see
    :func:`_checked_refs`). ``real_dirs``: a memo of parents' real paths (one ``lstat`` per path
    check, hundreds of shared containers on a busy node; see
    :func:`numa_pin.enforcer.cgroups.realpath`). Where the node is warm (:func:`warm`), paths
    it checked are not checked again, and the answer for the very shared grants of the last call
    (a state one exclusive grant later carries them, :mod:`numa_pin.ledger.derived`) is that
    call's."""
    shared = state.shared_grants()
    grants = [g for g in shared if g.container_id != exclude and g.cgroup]
    kept = node.warm_state
    if kept is None or kept.refs is None:
        return tuple(_checked_refs(node, grants, real_dirs, escaped))
    root = os.fspath(node.config.cgroup_root)
    left_out = state.grants.get(exclude) if exclude is not None else None
    whole = left_out is None or left_out.kind != KIND_SHARED  # ``exclude`` changes nothing
    if whole and kept.last is not None and kept.last[0] is shared and kept.last[1] == root:
        return kept.last[2]
    known = kept.refs.get(root)
    if known is None:
        known = kept.refs[root] = {}
    for cid, ref in _checked_refs(node, [g for g in grants if g.cgroup not in known], real_dirs, escaped):
        known[state.grants[cid].cgroup or ""] = ref
    out = tuple((g.container_id, known[g.cgroup]) for g in grants if g.cgroup in known)
    if whole and len(out) == len(grants):
        kept.last = (shared, root, out)
    return out


def _log_blocked(resized: ResizeResult) -> ResizeResult:
    """Shared containers left as they were go to syslog (``status`` shows them, see blocked_shared)."""
    for blocked in resized.blocked:
        report.log_syslog(f"numa-pin: {blocked}")
    return resized


def _limits(node: Node, state: LedgerState,
            real_dirs: dict[str, str] | None = None) -> dict[cg.CgroupRef, frozenset[int]]:
    """Shared containers' own cpusets (their cpuset is the pool inside it), by cgroup."""
    grants = [g for g in state.limited_shared() if g.cgroup]
    limits = {ref: state.grants[cid].cpuset_limit for cid, ref in _checked_refs(node, grants, real_dirs)}
    return {ref: limit for ref, limit in limits.items() if limit}


def _resize(node: Node, state: LedgerState, pool: frozenset[int], undo: UndoLog,
            exclude: str | None = None, before: LedgerState | None = None,
            escaped: list[Grant] | None = None) -> ResizeResult:
    """Every shared container (``exclude`` left out) to ``pool``, one memo of real paths for all.
    ``before``: the ledger the change started from (an admission's, a release's): the shared
    containers are taken to be on its pool, not read (see :func:`resize_shared`)."""
    real_dirs: dict[str, str] = {}
    previous, kept = None, node.warm_state
    if before is not None:
        try:
            previous = shared_pool(node, before)
        except AllocationError:  # no pool under the config as it is now (changed since): read them
            previous = None
    return resize_shared(_shared_refs(node, state, exclude, real_dirs, escaped), pool, node.config.cgroup_root, undo,
                         _limits(node, state, real_dirs), systemd=node.systemd(), real_dirs=real_dirs,
                         checked=True,  # _shared_refs checked each path (now, or as the spare rehearsed)
                         previous=previous, leaves=None if kept is None else kept.leaves,
                         handles=None if kept is None else kept.handles)


def _follow_mixed(node: Node, state: LedgerState, pool: frozenset[int], undo: UndoLog,
                  exclude: str | None = None) -> list[tuple[str, ResizeResult]]:
    """Every mixed container (``exclude`` left out) to its exclusive CPUs and ``pool``, each read
    and written where it differs, the cpuset cgroups nested in it with it (as a shared
    container's, :func:`resize_shared`); one the kernel will not change is left as it was and
    logged. Mixed containers are few (latency workloads): each is its own batch."""
    # the shared majority falls out at its empty cpus, before anything is sorted
    grants = sorted((g for g in state.grants.values() if g.cpus and mixed(g) and g.cgroup
                     and g.container_id != exclude), key=lambda g: g.container_id)
    out = []
    for cid, ref in _checked_refs(node, grants, None):
        resized = resize_shared([ref], cpuset_of(state.grants[cid], pool), node.config.cgroup_root, undo,
                                systemd=node.systemd(), checked=True)
        out.append((cid, _log_blocked(resized)))
    return out


class CpuNode(CpuResource, NodeResource):
    """The CPU resource, decision and enforcement."""

    preview_word = "cpu-shared"  # what ``plan`` and ``explain`` call its line

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        grant, ref, state, undo = admission.grant, admission.ref, admission.state, admission.undo
        root = node.config.cgroup_root
        pool = shared_pool(node, state)
        if ref is not None:
            if grant.cpus:
                apply_cpuset(ref, cpuset_of(grant, pool), grant.mems, root, undo, systemd=node.systemd(),
                             real_dirs=admission.real_dirs)
            elif grant.kind == KIND_SHARED:
                own = pool & grant.cpuset_limit if grant.cpuset_limit else pool
                # only the CPUs move: a shared container's memory nodes stay its own (on cgroup v2
                # its cpuset.mems is usually empty, inheriting the parent's)
                apply_cpuset(ref, own, None, root, undo, systemd=node.systemd(), real_dirs=admission.real_dirs)
        if grant.cpus or any(g.cpus for g in admission.dropped):
            escaped: list[Grant] = []
            _log_blocked(_resize(node, state, pool, undo, grant.container_id, admission.before, escaped))
            _follow_mixed(node, state, pool, undo, grant.container_id)
            for gone in escaped:  # set aside: the ledger this admission commits no longer holds it
                admission = replace(admission, state=admission.state.without(gone.container_id))
        return admission

    def release(self, node: Node, release: Release) -> list[str]:
        if any(g.cpus for g in release.gone) and not release.later:
            state = release.after
            pool = shared_pool(node, state)
            resized = _resize(node, state, pool, release.undo, before=release.before)
            followed = _follow_mixed(node, state, pool, release.undo)
            return [str(b) for b in resized.blocked + tuple(b for _, r in followed for b in r.blocked)]
        return []

    def settle(self, node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
        """The shared and mixed containers grow to the pool as it is now (a release left it for later)."""
        pool = shared_pool(node, state)
        followed = _follow_mixed(node, state, pool, undo)
        blocked = _resize(node, state, pool, undo).blocked + tuple(b for _, r in followed for b in r.blocked)
        return [str(b) for b in blocked]

    def repair(self, node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
        repaired: list[str] = []
        pool = shared_pool(node, state)
        for g in state.grants.values():
            ref = node.cgroup_ref(g)
            if ref is None or g.kind == KIND_SHARED or not os.path.isdir(ref.cpuset_dir):
                continue  # shared containers: resized below, their nested cgroups with them
            cpus = cpuset_of(g, pool) if g.cpus else (pool & g.cpuset_limit if g.cpuset_limit else pool)
            before = len(undo)
            apply_cpuset(ref, cpus, g.mems if g.cpus and g.mems else None, node.config.cgroup_root, undo,
                         systemd=node.systemd())
            if len(undo) != before:
                repaired.append(g.container_id)
        shared = _shared_ids(node, state)
        resized = _log_blocked(_resize(node, state, pool, undo))
        return repaired + [shared[ref] for ref in resized.updated]

    def conflicts(self, node: Node, state: LedgerState) -> list[str]:
        """One line per grant that holds CPUs the current config reserves, with the way out
        (kubelet checks its checkpoint against its config the same way, but refuses to start)."""
        held = reserved_conflicts({g.container_id: g.cpus for g in state.grants.values() if g.cpus}, reserved(node))
        return [
            f"grant {cid} holds CPU {format_list(cpus)}, which the config now reserves; it stays with that "
            f"container until it ends (numa-pin release {cid}), or restore the reservation it was made under"
            for cid, cpus in held.items()
        ]

    def runtime(self, node: Node, ask: RuntimeAsk) -> RuntimeEdit | None:
        """The cpuset the runtime applies: an exclusive grant's CPUs and memory nodes, a shared
        container's the shared pool (inside its own cpuset), as :meth:`enforce` writes them; a
        mixed one's its exclusive CPUs and the pool, with both lists in its environment."""
        from numa_pin.resources.node.runtime import RuntimeEdit

        grant = ask.grant
        if mixed(grant):
            pool = shared_pool(node, ask.state)
            return RuntimeEdit(cpus=cpuset_of(grant, pool), mems=grant.mems or None, env=mixed_env(grant, pool))
        if grant.cpus:
            return RuntimeEdit(cpus=grant.cpus, mems=grant.mems or None)
        if grant.kind != KIND_SHARED:
            return None
        pool = shared_pool(node, ask.state)
        own = pool & grant.cpuset_limit if grant.cpuset_limit else pool
        return RuntimeEdit(cpus=own) if own else None

    def preview(self, node: Node, state: LedgerState, grant: Grant, applied: bool) -> str | None:
        """``plan`` and ``explain``'s line for a mixed container: the cpuset it gets (would get),
        and whether its cgroup holds it now (None for any other grant)."""
        if not mixed(grant):
            return None
        pool = shared_pool(node, state)
        want = cpuset_of(grant, pool)
        line = f"cpuset {format_list(want)}: exclusive {format_list(grant.cpus)} and the shared pool"
        ref = node.cgroup_ref(grant) if applied else None
        if ref is None:
            return line
        try:
            held = read_list(cpus_file(ref.cpuset_dir))
        except NumaPinError as exc:
            return f"{line}; cannot read its cgroup: {exc}"
        return line + ("; held" if held == want else f"; drifted to {format_list(held)} (reconcile repairs it)")

    def status(self, node: Node, state: LedgerState) -> dict[str, Any]:
        topo = node.topology
        taken = state.exclusive_cpus() | reserved(node)
        return {
            "shared_pool": format_list(shared_pool(node, state)),
            "reserved": format_list(reserved(node)),
            "free_exclusive_cpus_per_node": {
                str(n): format_list(topo.nodes[n].cpus & (topo.cpu_ids - taken))
                for n in topo.node_ids
            },
            "blocked_shared": blocked_shared(node, state),
        }


__all__ = ["CpuNode", "blocked_shared", "reserved", "shared_pool", "warm"]
