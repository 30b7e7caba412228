"""Host services off exclusive CPUs (``numa-pin.io/host-services: disable``, ``isolation.host``).

While a live grant asks it, the cgroups of the host that are not containers (systemd's
``system.slice``, ``user.slice``, ``init.scope``, or their cgroup v1 cpusets) hold every online
CPU except the exclusive CPUs of the grants that ask it (:func:`host_cpus`); when the last such
grant goes they get their own cpusets back. A top-level cgroup that holds the container of such a
grant (docker's and runc's containers may sit in ``system.slice``) is not narrowed itself: its
other children are (:func:`host_dirs`), and a service started there later is narrowed at the next
``reconcile``; containers in a slice of their own avoid that. Cgroups of container managers
(``kubepods*``, ``machine.slice``, ...) are left to the CPU resource.

Where systemd owns the cgroup (a slice or a scope) the unit's ``AllowedCPUs`` is set as a
runtime property first (:func:`numa_pin.enforcer.cpuset.apply_cpuset` through the systemd
seam), so a ``daemon-reload`` keeps it. The originals (the cpuset file and the unit's
property) go into the saved settings (:mod:`numa_pin.enforcer.saved`) before the first change;
a release, a rollback and a reconcile after a crash put them back from there.
"""

from __future__ import annotations

import os

from numa_pin.base.cpuset import format_list
from numa_pin.enforcer import cgroups as cg
from numa_pin.enforcer.cpuset import restore_list
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError, IsolationError
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.requests.isolation import of_grant
from numa_pin.resources.node.base import Admission, Node, NodeResource, Release

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

    from numa_pin.enforcer.saved import Saved

KNOB = "host"
#: top-level cgroups of container managers: their containers' cpusets are the CPU resource's
MANAGERS = ("kubepods", "machine.slice", "machine", "docker", "podman", "libpod_parent", "crio", "containerd")
#: how deep a cgroup holding a protected container is split into its children
MAX_DEPTH = 4
#: at most this many host cgroups are narrowed (a runaway tree is refused, not walked)
MAX_DIRS = 512


def asking(state: LedgerState) -> list[Grant]:
    """The grants with exclusive CPUs that keep host services off them."""
    return [g for _, g in sorted(state.grants.items()) if g.cpus and of_grant(g).host]


def partition_cpus(state: LedgerState) -> frozenset[int]:
    """The CPUs of the live grants whose CPUs are an isolated partition (load balancing off): no
    host cgroup may list them (the kernel declares a top-level partition invalid when a sibling's
    own ``cpuset.cpus`` shares its CPUs)."""
    out: set[int] = set()
    for g in state.grants.values():
        if g.isolation.get("load_balancing") == "disable":
            out |= g.cpus
    return frozenset(out)


def host_cpus(node: Node, state: LedgerState) -> frozenset[int] | None:
    """The CPUs host services may use: online minus the CPUs of :func:`asking` and of the
    isolated partitions (None: none asks)."""
    grants = asking(state)
    if not grants:
        return None
    taken: set[int] = set(partition_cpus(state))
    for g in grants:
        taken |= g.cpus
    return node.topology.cpu_ids - taken


def inherited_cpus(node: Node, state: LedgerState) -> frozenset[int]:
    """What a host cgroup that inherits its CPUs has now: online minus the isolated partitions'."""
    return node.topology.cpu_ids - partition_cpus(state)


def held_dirs(node: Node) -> frozenset[str]:
    """The cpuset directories of the host cgroups this resource holds an original of (narrowed
    now, or kept as a residue): their explicit lists follow the partitions by themselves."""
    return frozenset(os.path.dirname(path) for path in _saved(node).of_knob(KNOB))


def host_dirs(node: Node, state: LedgerState) -> list[str]:
    """The hierarchy paths of the host cgroups to narrow: the top-level cgroups but those of
    container managers; one that holds the container of a grant asking host isolation is split
    into its children instead (its CPUs must stay in every ancestor), and a grant's own cgroup
    is never one (the CPU resource's). Narrowing an ancestor of any other grant is safe: its
    CPUs (exclusive, or the shared pool) are all host CPUs."""
    where = node.layout().hierarchy_subdir("cpuset")
    if where is None:
        return []
    root = cg.hierarchy_dir("/", node.config.cgroup_root, where[1])
    mine = {_norm(g.cgroup) for g in asking(state) if g.cgroup}
    grants = {_norm(g.cgroup) for g in state.grants.values() if g.cgroup}
    out: list[str] = []

    def walk(rel: str, depth: int) -> None:
        for child in cg.child_dirs(os.path.join(root, rel.lstrip("/")) if rel != "/" else root):
            name = os.path.basename(child)
            path = rel.rstrip("/") + "/" + name
            if (depth == 0 and name.startswith(MANAGERS)) or path in grants:
                continue
            if not any(p.startswith(path + "/") for p in mine):
                out.append(path)
            elif depth < MAX_DEPTH:
                walk(path, depth + 1)
            if len(out) > MAX_DIRS:
                raise EnforcementError(f"more than {MAX_DIRS} host cgroups to keep off exclusive CPUs", path=root)

    walk("/", 0)
    return out


def _norm(rel: str) -> str:
    return "/" + "/".join(p for p in rel.split("/") if p)


def _saved(node: Node) -> Saved:
    from numa_pin.enforcer.saved import Saved

    return Saved(node.config.state_dir)


def _narrow(node: Node, rel: str, cpus: frozenset[int], saved: Saved, undo: UndoLog) -> bool:
    """Confine host cgroup ``rel`` to ``cpus``, its original saved first; True when it changed."""
    from numa_pin.enforcer.cpuset import CPUSET_CPUS, apply_cpuset
    from numa_pin.enforcer.systemd import unit_of

    ref = cg.ref_from_path(rel, node.config.cgroup_root, node.layout())
    path = os.path.join(ref.cpuset_dir, CPUSET_CPUS)
    if saved.original(path, node.boot_id) is None:  # none yet, or an earlier boot's: this boot's
        systemd, unit = node.systemd(), unit_of(ref)
        shown = systemd.show(unit) if systemd is not None and unit is not None else None
        saved.save(path, {"knob": KNOB, "value": cg.read_cgroup_file(path), "rel": rel, "boot": node.boot_id,
                          "unit": unit if shown is not None and shown.loaded else None,
                          "allowed": shown.cpus if shown is not None else ""}, undo)
    local = UndoLog()
    apply_cpuset(ref, cpus, None, node.config.cgroup_root, local, systemd=node.systemd())
    if not len(local):
        return False

    def undo_narrow() -> None:  # an inherited (empty) cpuset comes back as what it inherits
        from numa_pin.enforcer.undo import describe_failures

        failures = local.rollback()
        if failures:
            raise EnforcementError(describe_failures(failures), path=path)

    undo.record(f"{rel}: host services on cpus {format_list(cpus)}", undo_narrow)
    return True


def _restore(node: Node, state: LedgerState, path: str, entry: dict[str, Any], saved: Saved,
             undo: UndoLog) -> bool:
    """Put back one host cgroup's own cpuset and its unit's ``AllowedCPUs``, then forget them;
    True when something was written.

    Where systemd owns the unit its property goes back first (an empty ``AllowedCPUs``: systemd
    leaves the kernel's inherited value). A cgroup that inherited its CPUs (``""``) and that the
    kernel refuses an empty list again (Linux 6.1 on a populated cgroup: ENOSPC) is a *residue*:
    its entry stays, marked, and its list follows what it would inherit
    (:func:`inherited_cpus`: never an isolated partition's CPUs), at every release and
    ``reconcile``, until the kernel takes the empty list."""
    from numa_pin.enforcer.saved import of_earlier_boot

    if of_earlier_boot(entry, node.boot_id):  # that boot's cgroups went with it: not written back
        saved.forget(path, undo)
        return True
    changed = False
    unit, systemd = entry.get("unit"), node.systemd()
    allowed = str(entry.get("allowed", ""))
    shown = systemd.show(unit) if isinstance(unit, str) and systemd is not None else None
    if isinstance(unit, str) and systemd is not None and shown is not None and shown.loaded \
            and shown.cpus != allowed:
        systemd.set_properties(unit, allowed, None)
        was = shown.cpus
        undo.record(f"{unit}: AllowedCPUs={allowed!r} (was {was!r})",
                    lambda: systemd.set_properties(unit, was, None, undoing=True))
        changed = True
    if not os.path.isfile(path):
        saved.forget(path, undo)
        return True
    current, original = cg.read_cgroup_file(path), str(entry.get("value", ""))
    if current != original:
        try:
            cg.write_cgroup_file(path, original)
        except EnforcementError:
            if original.strip():
                raise
            return _residue(node, state, path, entry, saved, undo, current) or changed
        undo.record(f"{path}: {original!r} (was {current!r})", lambda: restore_list(path, current))
        changed = True
    saved.forget(path, undo)
    return True


def _residue(node: Node, state: LedgerState, path: str, entry: dict[str, Any], saved: Saved, undo: UndoLog,
             current: str) -> bool:
    """A host cgroup the kernel will not give its empty (inherited) list back: it holds what it
    would inherit, and its entry stays, marked; True when something was written."""
    want = format_list(inherited_cpus(node, state))
    if not entry.get("residue"):  # the old entry comes back on a rollback (forget's undo runs last)
        saved.forget(path, undo)
        saved.save(path, {**entry, "residue": True}, undo)
    if current == want:
        return False
    cg.write_cgroup_file(path, want)
    undo.record(f"{path}: {want!r} (was {current!r}, inherits: Linux keeps an explicit list)",
                lambda: cg.write_cgroup_file(path, current))
    return True


def preflight(node: Node, admission: Admission) -> None:
    """Refuse (one line) a grant asking host isolation on a node with no host cgroup to narrow."""
    grant = admission.grant
    if grant.cpus and of_grant(grant).host and not host_dirs(node, admission.state):
        raise IsolationError("no host cgroup to keep off exclusive CPUs (host services share the "
                             "root cgroup here); numa-pin.io/host-services cannot be honoured")


def settle_host(node: Node, state: LedgerState, undo: UndoLog) -> None:
    """The host cgroups as ``state`` wants them (narrowed, given back, residues following the
    partitions): what the load-balancing knob runs before it makes a partition and after it
    dissolves one. Raises EnforcementError with the first problem."""
    if not asking(state) and not _saved(node).of_knob(KNOB):
        return
    for problem in HostNode()._apply(node, state, undo, strict=False)[1]:
        raise EnforcementError(problem)


class HostNode(NodeResource):
    """Host services off the CPUs of the grants that ask it."""

    name = "isolation.host"

    def _apply(self, node: Node, state: LedgerState, undo: UndoLog, strict: bool) -> tuple[bool, list[str]]:
        """Every host cgroup to :func:`host_cpus` (or back, when none asks); (changed, problems)."""
        saved = _saved(node)
        cpus = host_cpus(node, state)
        problems: list[str] = []
        changed = False
        narrowed = set()
        if cpus is not None:
            dirs = host_dirs(node, state)
            if not dirs and strict:
                raise IsolationError("no host cgroup to keep off exclusive CPUs (host services share the "
                                     "root cgroup here); numa-pin.io/host-services cannot be honoured")
            for rel in dirs:
                try:
                    changed |= _narrow(node, rel, cpus, saved, undo)
                    narrowed.add(rel)
                except EnforcementError as exc:
                    if strict:
                        raise
                    problems.append(f"host services: {exc}")
        for path, entry in sorted(saved.of_knob(KNOB).items()):
            if entry.get("rel") in narrowed:
                continue
            try:  # no longer narrowed (no grant asks, or the cgroup now holds one): its own cpuset back
                changed |= _restore(node, state, path, entry, saved, undo)
            except EnforcementError as exc:
                problems.append(f"host services not given back: {exc}")
        return changed, problems

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        if admission.grant.cpus and of_grant(admission.grant).host:
            self._apply(node, admission.state, admission.undo, strict=True)
        elif any(g.cpus and of_grant(g).host for g in admission.dropped):  # release --force
            for problem in self._apply(node, admission.state, admission.undo, strict=False)[1]:
                raise EnforcementError(problem)
        return admission

    def release(self, node: Node, release: Release) -> list[str]:
        if not any(g.cpus and of_grant(g).host for g in release.gone):
            return []
        return self._apply(node, release.after, release.undo, strict=False)[1]

    def collect(self, node: Node, before: LedgerState, after: LedgerState, gone: tuple[Grant, ...]) -> list[str]:
        """Grants found dead: host services get their CPUs back (again harmlessly after a crash)."""
        if not any(g.cpus and of_grant(g).host for g in gone):
            return []
        return self._apply(node, after, UndoLog(), strict=False)[1]

    def repair(self, node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
        if not asking(state) and not _saved(node).of_knob(KNOB):
            return []
        changed, problems = self._apply(node, state, undo, strict=False)
        for problem in problems:
            from numa_pin.reporting import report

            report.log_syslog(f"numa-pin: {problem}")
        return [g.container_id for g in asking(state)] if changed else []

    def preview(self, node: Node, state: LedgerState, grant: Grant, applied: bool) -> str | None:
        """What host isolation does (would do) for ``grant``: the host cgroups and their CPUs."""
        if not (grant.cpus and of_grant(grant).host):
            return None
        state = state.with_grant(grant)
        cpus = host_cpus(node, state)
        try:
            dirs = host_dirs(node, state)
        except EnforcementError as exc:
            return f"cannot: {exc}"
        if not dirs:
            return "cannot: no host cgroup to keep off exclusive CPUs (host services share the root cgroup)"
        return f"{'host cgroups' if applied else 'would confine'} {', '.join(dirs)} to cpus {format_list(cpus or ())}"

    def describe(self, grant: Grant) -> list[str]:
        return ["host-services=disable"] if grant.cpus and of_grant(grant).host else []

    def status(self, node: Node, state: LedgerState) -> dict[str, Any]:
        cpus = host_cpus(node, state)
        return {"host_services_cpus": "all" if cpus is None else format_list(cpus)}


__all__ = ["HostNode", "asking", "held_dirs", "host_cpus", "host_dirs", "inherited_cpus", "partition_cpus", "preflight",
           "settle_host"]
