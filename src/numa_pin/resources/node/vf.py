"""SR-IOV VF netdevs moved into containers: a device kind's I/O half (the PCI device kind
decides which VFs a container gets).

VFs follow the grant's scope. Scope ``container``: moved into the container's netns as
``net1``, ``net2``, ... at its first start with a pid, and given back when its grant goes, pulled
out through any process still in that namespace (its identity is kept with the move): under
Kubernetes a container joins its pod's namespace, which outlives it, so the kernel does not give
the VF back when the container ends.
Scope ``pod`` (the grant's pod has a :class:`~numa_pin.ledger.model.PodRecord`): moved once
into the pod's network namespace, which the pod's containers share, named ``net<N>`` counted
per pod netns, and recorded on the pod record (:class:`~numa_pin.ledger.model.PodNetdev`). A
later container of the pod granted the same VF finds it there and moves nothing. The VF goes
back to the host when the pod record goes, with the pod's last grant, whichever path drops it:
release, or the garbage collection of dead grants in an admission or a reconcile.

VFs the runtime moves itself (``linux.netDevices``, noted at precreate by
:meth:`VfNode.applied`) are never moved again; the kernel gives them back.

VF settings (``numa-pin.io/vf-config``, kept on the grant) go with every move numa-pin makes:
:func:`~numa_pin.enforcer.netdev.move_netdev_to_netns` sets them on the PF and the restore puts
the saved state back; :meth:`VfNode.repair` sets them again where they drifted. The saved state
is journaled durably before the PF changes (:mod:`numa_pin.resources.node.vfjournal`), so
:meth:`VfNode.repair` also puts it back after a crash before the commit.
"""

from __future__ import annotations

from numa_pin.base import names
from numa_pin.base.record import replace
from numa_pin.errors import EnforcementError, NumaPinError, RequestError
from numa_pin.ledger.model import Grant, LedgerState, PodNetdev, PodRecord
from numa_pin.resources.node.base import Admission, Node, NodeResource, Release
from numa_pin.topology.model import KIND_GPU

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from numa_pin.enforcer.undo import UndoLog
    from numa_pin.resources.node.runtime import RuntimeAsk, RuntimeEdit


class VfNode(NodeResource):
    name = "sriov-vf"

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        if admission.grant.vf_config:
            _check_vf_settings(node, admission.grant, decided)
        if not admission.devices_pending(decided):
            return admission
        grant, state, pid = admission.grant, admission.state, admission.pid
        assert pid is not None
        records: list[dict[str, Any]] = []
        pod_vfs: list[PodNetdev] = []
        pod = state.pods.get(grant.pod_id) if grant.scope == names.POD_SCOPE else None
        cfg = node.config
        ns: str | None = None
        taken: set[str] = set()
        for resource, address in _granted_vfs(node, grant):
            _check_not_parked(state, address, grant, pod)
            if pod is not None:
                moved = _move_pod_vf(node, grant, pod, resource, address, pid, tuple(pod_vfs), admission.undo, state)
                if moved is not None:
                    pod_vfs.append(moved)
                continue
            from numa_pin.enforcer.netdev import move_netdev_to_netns
            from numa_pin.resources.node.vfjournal import journaler

            if ns is None:  # under Kubernetes the pod's: other containers' VFs may hold names there
                ns = _netns_of(pid, cfg.proc_root)
                taken = _names_in(state, ns)
            name = _first_free(taken)
            taken.add(name)
            rec = move_netdev_to_netns(
                address, pid, name, cfg.sysfs_root, cfg.proc_root,
                bring_up=True, undo=admission.undo, vf_settings=grant.vf_config or None,
                journal=journaler(node, grant.container_id, admission.undo),
            )
            records.append({"record": rec.to_dict(), **({"netns": ns} if ns else {})})
        if records:
            admission = admission.updated(netdevs=tuple(records))
        if pod_vfs:
            pod = admission.state.pods[grant.pod_id]
            pod = replace(pod, netdevs=pod.netdevs + tuple(pod_vfs))
            admission = replace(admission, state=admission.state.with_pod(pod))
        return admission

    def runtime(self, node: Node, ask: RuntimeAsk) -> RuntimeEdit | None:
        """VF netdevs the runtime moves in itself where it can (``linux.netDevices``), named
        ``net1``, ``net2``, ...; a pod's VFs never: they go once into the pod's namespace; nor
        VFs with settings (``numa-pin.io/vf-config``): the runtime sets nothing on the PF, so the
        prestart hook moves them with their settings, as on every other path."""
        grant = ask.grant
        if (ask.request is None or not ask.target.net_devices or grant.scope == names.POD_SCOPE
                or grant.vf_config):
            return None
        topology = node.topology
        hosts = [dev.netdevs[0] for ids in grant.devices.values() for address in ids
                 if (dev := topology.device(address)) is not None and dev.is_vf and dev.netdevs]
        if not hosts:
            return None
        from numa_pin.resources.node.runtime import RuntimeEdit

        return RuntimeEdit(net_devices={host: f"net{i}" for i, host in enumerate(hosts, 1)})

    def applied(self, grant: Grant, edit: RuntimeEdit) -> Grant:
        """The VFs the runtime moves itself (``linux.netDevices``) are never moved again."""
        if not edit.net_devices:
            return grant
        return replace(grant, netdevs=tuple({"runtime": host} for host in edit.net_devices))

    def collect(self, node: Node, before: LedgerState, after: LedgerState, gone: tuple[Grant, ...]) -> list[str]:
        return _restore_pods(node, _pods_dropped(before, after), gone)

    def repair(self, node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
        """Set the VF settings again on the PF of every moved VF that lost them (a PF reset, a
        hand-made ``ip link set``), and put back the saved state of journaled VFs no grant holds
        (a crash before the commit); the containers whose VFs it repaired."""
        from numa_pin.enforcer.netdev_record import NetdevRecord
        from numa_pin.enforcer.vfsettings import reassert_vf_settings
        from numa_pin.reporting import report
        from numa_pin.resources.node.vfjournal import give_back_orphans

        repaired, problems = give_back_orphans(node, state)
        for problem in problems:
            report.log_syslog(f"numa-pin: {problem}")
        for grant, data in _settings_records(state):
            try:
                drift = reassert_vf_settings(NetdevRecord.from_dict(data), grant.vf_config)
            except (NumaPinError, KeyError, ValueError) as exc:
                report.log_syslog(f"numa-pin: {grant.container_id}: VF settings not set again: {exc}")
                continue
            if drift and grant.container_id not in repaired:
                repaired.append(grant.container_id)
        return repaired

    def give_back(self, node: Node, release: Release) -> list[str]:
        problems: list[str] = []
        for grant in release.gone:
            problems += _restore_netdevs(node, grant)
        return problems + self.collect(node, release.before, release.after, release.gone)


def _move_pod_vf(
    node: Node, grant: Grant, pod: PodRecord, resource: str, address: str, pid: int,
    moving: tuple[PodNetdev, ...], undo: UndoLog, state: LedgerState,
) -> PodNetdev | None:
    """Move VF ``address`` into the pod's network namespace (the one ``pid`` is in) under the
    first ``net<N>`` no VF holds there, unless the pod's record says it is there already (None:
    nothing moved). ``moving``: VFs this admission moved before.

    Raises EnforcementError when the pod's record puts the VF in another network namespace
    (containers of one pod that do not share one), or when the move fails."""
    from numa_pin.enforcer.netdev import move_netdev_to_netns
    from numa_pin.enforcer.netns import netns_id, netns_path
    from numa_pin.resources.node.vfjournal import journaler

    cfg = node.config
    ns = netns_id(pid, cfg.proc_root)
    held = pod.netdev(address)
    if held is not None:
        if held.netns != ns:
            raise EnforcementError(
                f"VF {address} of pod {pod.pod_id} is in the network namespace container {held.moved_by} "
                f"is in ({held.ifname} there), not in that of container {grant.container_id}; pod scope "
                "moves a VF once for the pod, so the pod's containers must share its network namespace",
                path=netns_path(pid, cfg.proc_root),
            )
        return None
    name = _first_free(_names_in(state, ns) | {n.ifname for n in moving if n.netns == ns})
    rec = move_netdev_to_netns(address, pid, name, cfg.sysfs_root, cfg.proc_root, bring_up=True, undo=undo,
                               vf_settings=grant.vf_config or None, journal=journaler(node, grant.container_id, undo))
    return PodNetdev(address, resource, name, ns, grant.container_id, rec.to_dict())


def _restore_pods(node: Node, pods: tuple[PodRecord, ...], grants: tuple[Grant, ...] = ()) -> list[str]:
    """Give the VFs of pods whose record went back to the host, pulling them out of the pod's
    network namespace through any process still in it (``grants``' pids first: the pod's
    containers released by hand still run), or finding them at home when it is gone."""
    if not any(pod.netdevs for pod in pods):
        return []
    from numa_pin.enforcer.netdev import NetdevRecord, restore_netdev
    from numa_pin.enforcer.netns import find_netns_member
    from numa_pin.resources.node.vfjournal import forget

    cfg = node.config
    problems: list[str] = []
    members: dict[str, int | None] = {}
    prefer = [g.pid for g in grants if g.pid is not None]
    for pod in pods:
        for vf in pod.netdevs:
            if vf.netns not in members:
                members[vf.netns] = find_netns_member(vf.netns, cfg.proc_root, prefer)
            member = members[vf.netns]
            try:
                rec = NetdevRecord.from_dict(vf.record)
                restore_netdev(rec, member, cfg.sysfs_root, cfg.proc_root)
                forget(node, rec.bdf)
            except (NumaPinError, KeyError, ValueError) as exc:
                why = "" if member is not None else (
                    "; no process is left in the pod's network namespace: the kernel gives the VF "
                    "back when that namespace is destroyed"
                )
                problems.append(f"pod {pod.pod_id}: VF {vf.address} ({vf.ifname}) not restored: {exc}{why}")
    return problems


def _names_in(state: LedgerState, ns: str) -> set[str]:
    """The names the VFs numa-pin moved hold in the network namespace ``ns`` (a pod's, and
    those of containers of container scope that joined it); none for an unknown namespace."""
    if not ns:
        return set()
    names_there = {vf.ifname for pod in state.pods.values() for vf in pod.netdevs if vf.netns == ns}
    for grant in state.grants.values():
        names_there.update(str(e["record"].get("container_name")) for e in grant.netdevs
                           if e.get("netns") == ns and "record" in e)
    return names_there


def _first_free(taken: set[str]) -> str:
    return next(f"net{i}" for i in range(1, len(taken) + 2) if f"net{i}" not in taken)


def _netns_of(pid: int, proc_root: str) -> str:
    """The identity of ``pid``'s network namespace, or "" where it cannot be read (the move then
    names the namespace's file itself)."""
    from numa_pin.enforcer.netns import netns_id

    try:
        return netns_id(pid, proc_root)
    except EnforcementError:
        return ""


def _restore_netdevs(node: Node, grant: Grant) -> list[str]:
    """Give moved VFs back to the host (by PCI address, under their host names), pulled out
    through a process still in the namespace they were moved into (the grant's first), else
    found at home (the namespace is gone, and the kernel gave them back)."""
    from numa_pin.enforcer.netdev import NetdevRecord, restore_netdev
    from numa_pin.enforcer.netns import find_netns_member
    from numa_pin.resources.node.vfjournal import forget

    cfg = node.config
    problems: list[str] = []
    members: dict[str, int | None] = {}
    for entry in grant.netdevs:
        if "record" not in entry:
            continue  # moved by the runtime (linux.netDevices), which the kernel gives back
        ns = entry.get("netns")
        if ns and ns not in members:
            members[ns] = find_netns_member(ns, cfg.proc_root, [grant.pid] if grant.pid else [])
        try:
            rec = NetdevRecord.from_dict(entry["record"])
            restore_netdev(rec, members.get(ns) if ns else None, cfg.sysfs_root, cfg.proc_root)
            forget(node, rec.bdf)
        except (NumaPinError, KeyError, ValueError) as exc:
            problems.append(f"{grant.container_id}: netdev not restored: {exc}")
    return problems


def _pods_dropped(before: LedgerState, after: LedgerState) -> tuple[PodRecord, ...]:
    """Pod records of ``before`` that ``after`` no longer has (their pod's last grant went)."""
    return tuple(pod for pod_id, pod in sorted(before.pods.items()) if pod_id not in after.pods)


def _granted_vfs(node: Node, grant: Grant) -> list[tuple[str, str]]:
    """``(resource, address)`` of every VF with a network interface ``grant`` holds."""
    out: list[tuple[str, str]] = []
    for resource, ids in grant.devices.items():
        for address in ids:
            dev = node.topology.device(address)
            if dev is not None and dev.kind != KIND_GPU and dev.is_vf and dev.netdevs:
                out.append((resource, address))
    return out


def _settings_records(state: LedgerState) -> list[tuple[Grant, Mapping[str, Any]]]:
    """``(grant, record)`` of every VF moved with settings: the grant's own, and a pod's VFs with
    the grant of the container that moved them while it lives."""
    out: list[tuple[Grant, Mapping[str, Any]]] = []
    for grant in state.grants.values():
        if grant.vf_config:
            out += [(grant, entry["record"]) for entry in grant.netdevs if "record" in entry]
    for pod in state.pods.values():
        for vf in pod.netdevs:
            mover = state.grants.get(vf.moved_by)
            if mover is not None and mover.vf_config:
                out.append((mover, vf.record))
    return out


def _check_vf_settings(node: Node, grant: Grant, decided: Grant) -> None:
    """Refuse (one line naming the annotation) VF settings that no VF numa-pin moves would get,
    or a MAC address asked for several VFs."""
    from numa_pin.requests.vfconfig import ANNOTATION

    vfs = _granted_vfs(node, grant)
    if not vfs:
        raise RequestError(f"container {grant.container_id} asks VF settings but is granted no SR-IOV VF "
                           "with a network interface", annotation=ANNOTATION)
    if any("runtime" in entry for entry in decided.netdevs):
        raise RequestError(f"the runtime moves the VFs of container {grant.container_id} (linux.netDevices); "
                           "numa-pin sets VF settings only on the VFs it moves itself", annotation=ANNOTATION)
    if "mac" in grant.vf_config and len(vfs) > 1:
        raise RequestError(f"one mac for {len(vfs)} VFs ({', '.join(a for _, a in vfs)}); a MAC address "
                           "names one VF", annotation=ANNOTATION)


def _check_not_parked(state: LedgerState, address: str, grant: Grant, pod: PodRecord | None) -> None:
    """Refuse a VF that sits in another pod's network namespace (a device plugin named it again
    while that pod still has a grant); it returns to the host with that pod's last grant."""
    found = state.pod_netdev(address)
    if found is None or (pod is not None and found[0] == pod.pod_id):
        return
    pod_id, vf = found
    raise EnforcementError(
        f"VF {address} granted to container {grant.container_id} is in the network namespace of pod "
        f"{pod_id} ({vf.ifname}, moved by container {vf.moved_by}) until that pod's last container ends"
    )


__all__ = ["VfNode"]
