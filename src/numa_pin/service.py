"""The node service: wires the pure decision to the I/O edges (sysfs, ledger, cgroups, netlink).

Used by the OCI hook (``numa-pin-hook``) and the operator command (``numa-pin``). One admission
is one ledger transaction:

1. lock the ledger, drop grants whose process and cgroup are both gone;
2. decide (:func:`numa_pin.admission.decide.decide`);
3. enforce: cpuset of the container, shrink the shared pool, move SR-IOV netdevs, grant GPUs;
4. commit the grant. Any failure in 2-3 rolls back every write made so far and commits nothing,
   so a rejected container leaves nothing allocated.

SR-IOV VFs follow the grant's scope. Scope ``container``: moved into the container's netns as
``net1``, ``net2``, ... and given back when its grant goes. Scope ``pod`` (the grant's pod has a
:class:`~numa_pin.ledger.model.PodRecord`): moved once into the pod's network namespace, which the
pod's containers share, named ``net<N>`` counted per pod netns, and recorded on the pod record
(:class:`~numa_pin.ledger.model.PodNetdev`). A later container of the pod granted the same VF
finds it there and moves nothing. The VF goes back to the host when the pod record goes, with the
pod's last grant, whichever path drops it: release, or the garbage collection of dead grants in
an admission or a reconcile.
"""

from __future__ import annotations

import json
import os
import time

from numa_pin import names, report
from numa_pin.admission.decide import Decision, NodeSettings, decide, reject
from numa_pin.admission.request import ContainerRequest
from numa_pin.config.schema import Config
from numa_pin.deadline import Deadline
from numa_pin.enforcer import cgroups as cg
from numa_pin.enforcer.cpuset import apply_cpuset, read_cpuset
from numa_pin.enforcer.owner import ContainerCgroup, check_container_cgroup
from numa_pin.enforcer.pool import reserved_conflicts, resize_shared, shared_pool
from numa_pin.enforcer.undo import UndoLog, describe_failures
from numa_pin.errors import AdmissionTimeout, EnforcementError, NumaPinError, RequestError
from numa_pin.ledger.liveness import collect_garbage, is_alive, process_start_time
from numa_pin.ledger.model import KIND_PROCESS, GpuAccess, Grant, LedgerState, PodNetdev, PodRecord
from numa_pin.ledger.store import Ledger
from numa_pin.record import record, replace
from numa_pin.topology.cache import DEFAULT_MAX_AGE_S, cached_discover
from numa_pin.topology.model import Topology

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from collections.abc import Callable

    from numa_pin.topology.cpus import CpuTopology

#: how often an admission decides again after a real conflict (another writer took what its
#: decision holds, or changed its pod); each such conflict is another admission committed
MAX_ATTEMPTS = 8
#: how long a grant made before its container exists (podman precreate: no pid yet, the cgroup
#: named in the config not created yet) counts as alive without its cgroup
PENDING_GRACE_S = 120.0


def settings_from_config(config: Config) -> NodeSettings:
    """The decision-relevant part of the config, in the types the decision takes."""
    from numa_pin.providers.cpu import CpuOptions

    cm = config.cpu_manager
    opts = CpuOptions(**{name.replace("-", "_"): on for name, on in cm.options.as_kubelet().items()})
    resources: tuple = ()
    if config.devices:
        from numa_pin.devices.inventory import DeviceResource

        resources = tuple(DeviceResource(name, tuple(selectors)) for name, selectors in config.devices.items())
    return NodeSettings(
        policy=config.policy,
        scope=config.scope,
        policy_options=dict(config.policy_options),
        cpu_options=opts,
        reserved_cpus=cm.reserved_cpus,
        num_reserved_cpus=cm.num_reserved_cpus,
        reserved_memory=config.reserved_memory,
        device_resources=resources,
    )


@record
class Admitted:
    """The outcome of a successful admission."""

    grant: Grant
    decision: Decision | None  # None when an existing grant was re-applied (idempotent)


class NodeService:
    """All I/O of one node, rooted at the config's sysfs, proc, cgroup and state roots."""

    def __init__(self, config: Config, cache_dir: str | None = None, *,
                 topology_max_age: float = DEFAULT_MAX_AGE_S) -> None:
        self.config = config
        self.cache_dir = cache_dir
        #: a cached topology older than this many seconds is discovered again
        self.topology_max_age = topology_max_age
        self.ledger = Ledger(config.state_dir, lock_timeout=config.lock_timeout_s)
        self._topology: Topology | None = None
        self._settings: NodeSettings | None = None
        self._reserved: frozenset[int] | None = None
        self._cgroup_layout: cg.CgroupLayout | None = None
        self._cpu_topology: CpuTopology | None = None

    # ---- lazily computed facts -------------------------------------------------------------
    @property
    def topology(self) -> Topology:
        if self._topology is None:
            self._topology = cached_discover(self.config.sysfs_root, self.config.proc_root, self.cache_dir,
                                             max_age=self.topology_max_age)
        return self._topology

    @property
    def settings(self) -> NodeSettings:
        if self._settings is None:
            self._settings = settings_from_config(self.config)
        return self._settings

    def _alive(self, grant: Grant) -> bool:
        """:func:`is_alive`, plus: a pid-less grant with an expected cgroup (made at precreate) is
        alive for :data:`PENDING_GRACE_S` before the runtime creates that cgroup. So a container
        the runtime never started (podman then runs no poststop) does not keep its grant."""
        if is_alive(grant, self.config.proc_root, self.config.cgroup_root):
            return True
        return grant.pid is None and grant.cgroup is not None and time.time() - grant.created < PENDING_GRACE_S

    def _alive_since(self, snapshot: LedgerState) -> Callable[[Grant], bool]:
        """:meth:`_alive`, taking the word of ``snapshot`` (dead grants dropped) for its grants."""
        def alive(grant: Grant) -> bool:
            seen = snapshot.grants.get(grant.container_id)
            return seen is grant or seen == grant or self._alive(grant)

        return alive

    def _layout(self) -> cg.CgroupLayout:
        """How cgroups are mounted (read once per service from mountinfo)."""
        if self._cgroup_layout is None:
            self._cgroup_layout = cg.detect_layout(self.config.proc_root)
        return self._cgroup_layout

    def live_grant(self, container_id: str) -> Grant | None:
        """The grant recorded under ``container_id`` while its process or cgroup lives (read-only)."""
        grant = self.ledger.read().grants.get(container_id)
        return grant if grant is not None and self._alive(grant) else None

    # ---- decisions -------------------------------------------------------------------------
    def plan(self, request: ContainerRequest) -> Decision:
        """What :meth:`admit` would decide now, without changing anything."""
        state, _ = collect_garbage(self.ledger.read(), self._alive)
        return decide(self.topology, state, request, self.settings)

    def admit(
        self, request: ContainerRequest, pid: int | None, *, kind: str | None = None,
        owner: ContainerCgroup | None = None, deadline: Deadline | None = None,
        rootfs: str | None = None, expected_cgroup: str | None = None,
    ) -> Admitted:
        """Decide, enforce and record one container (or process). Raises an
        :class:`~numa_pin.errors.AdmissionError` on rejection, after rolling everything back.

        The decision is computed on a snapshot of the ledger, outside its lock, so a slow
        decision never blocks other admissions, releases or the operator. The commit then
        takes the lock and checks the decision against the ledger as it is now: it stands
        while what it takes is still free (its CPUs are picked again inside its hint when another
        admission took them), and it is made again only when what it depended on changed (at most
        :data:`MAX_ATTEMPTS` times; see :mod:`numa_pin.admission.validate`). The whole
        admission runs under ``deadline`` (default: the config's ``admission_timeout_s``);
        past it the container is rejected with :class:`~numa_pin.errors.AdmissionTimeout`.

        Raises :class:`~numa_pin.errors.EnforcementError` before anything is written when ``pid``
        sits in the hierarchy root, or (with ``owner``, the bundle's cgroup facts) in another cgroup.
        ``rootfs`` (the spec's ``root.path``) is where granted GPU nodes go before pivot_root.
        ``expected_cgroup`` (precreate, no pid yet) is the cgroup the runtime will create; the
        grant lives by it once :data:`PENDING_GRACE_S` have passed.
        """
        budget = deadline or Deadline(self.config.admission_timeout_s, f"admission of {request.container_id}")
        with budget.active():
            return self._admit(request, pid, kind, owner, budget, rootfs, expected_cgroup)

    def _admit(
        self, request: ContainerRequest, pid: int | None, kind: str | None, owner: ContainerCgroup | None,
        deadline: Deadline, rootfs: str | None = None, expected_cgroup: str | None = None,
    ) -> Admitted:
        cfg = self.config
        ref = None
        if pid:
            layout = self._layout()
            ref = cg.find_cgroup(pid, cfg.proc_root, cfg.cgroup_root, layout)
            check_container_cgroup(ref, owner, pid, os.path.join(cfg.proc_root, str(pid), "cgroup"))
        for _attempt in range(MAX_ATTEMPTS):
            with deadline.interruptible():
                snapshot, _ = collect_garbage(self.ledger.read(), self._alive)
                decision: Decision | None = None
                if request.container_id not in snapshot.grants:
                    decision = decide(self.topology, snapshot, request, self.settings)
            if decision is not None and not decision.admit:
                raise reject(decision)
            timeout = min(cfg.lock_timeout_s, deadline.remaining())
            with self.ledger.transaction(timeout=timeout, on_wait=report.lock_wait_notice) as txn:
                # one liveness pass per admission: a grant the snapshot found alive counts as alive
                # (at worst a grant that died since stays one more transaction); only grants new
                # since the snapshot, or found dead there, are checked again
                state, dropped = collect_garbage(txn.state, self._alive_since(snapshot))
                # issue 21: check the decision against the ledger as it is now (not an unchanged
                # snapshot); decide again only on a real conflict (docs/admission-concurrency.md)
                if request.container_id not in state.grants:
                    decision = self._revalidate(decision, request, snapshot, state)
                    if decision is None:
                        continue
                deadline.check()
                # pods whose last grant died: their VFs go home before anything is granted (the
                # decision already counts them free); a crash here leaves the records, and
                # restoring again is harmless
                self._log_problems(self._restore_pods(_pods_dropped(txn.state, state), dropped))
                existing = state.grants.get(request.container_id)
                undo = UndoLog()
                try:
                    if existing is not None and kind == KIND_PROCESS and existing.pid not in (pid, None):
                        raise RequestError(live_name_message(existing), annotation="--name")
                    bind = existing is not None and existing.pid is None and pid is not None
                    if existing is not None:
                        grant = replace(existing, pid=pid or existing.pid, start_time=_start_time(pid, cfg.proc_root),
                                        cgroup=ref.rel_path if ref is not None else existing.cgroup)
                        decision = None
                    else:
                        assert decision is not None
                        grant = self._grant(request, decision, pid, ref, kind)
                        if ref is None and expected_cgroup:
                            grant = replace(grant, cgroup=expected_cgroup)
                    new_state = state.with_grant(grant)
                    if decision is not None and decision.pod_affinity is not None and request.pod_id not in state.pods:
                        pod = PodRecord(
                            request.pod_id, decision.pod_affinity, decision.policy, decision.scope, time.time()
                        )
                        new_state = new_state.with_pod(pod)
                    self._enforce(grant, ref, new_state, undo, pool_changed=any(g.cpus for g in dropped))
                    if (existing is None or bind) and pid and grant.devices and not grant.netdevs:
                        netdevs, gpus, pod_vfs = self._grant_devices(grant, pid, undo, rootfs, new_state)
                        if netdevs or gpus is not None:
                            grant = replace(grant, netdevs=netdevs, gpus=gpus)
                            new_state = new_state.with_grant(grant)
                        if pod_vfs:
                            pod = new_state.pods[grant.pod_id]
                            new_state = new_state.with_pod(replace(pod, netdevs=pod.netdevs + pod_vfs))
                except BaseException as exc:
                    self._roll_back(undo, exc, request.container_id)
                    raise
                txn.state = new_state
            if decision is not None and cfg.syslog:
                report.log_decision(grant, "admitted")
            return Admitted(grant, decision)
        raise AdmissionTimeout(
            f"admission of {request.container_id}: the ledger changed under {MAX_ATTEMPTS} decisions in a row; "
            "try again"
        )

    def _revalidate(self, decision: Decision | None, request: ContainerRequest, snapshot: LedgerState,
                    state: LedgerState) -> Decision | None:
        """``decision`` as it may be committed on ``state`` (:func:`~numa_pin.admission.validate.revalidate`),
        or None to decide again (no decision: the snapshot had this container's grant, now gone)."""
        if decision is None:
            return None
        from numa_pin.admission.validate import revalidate

        if self._cpu_topology is None:
            from numa_pin.topology.cpus import CpuTopology

            self._cpu_topology = CpuTopology.from_topology(self.topology)
        return revalidate(decision, request, snapshot, state, topology=self.topology, cpu_topology=self._cpu_topology,
                          settings=self.settings, reserved=self.reserved())

    def _roll_back(self, undo: UndoLog, exc: BaseException, container_id: str) -> None:
        """Undo every write of a failed admission or release. Undo steps that fail are attached
        to ``exc`` (they become part of its one line) and always logged to syslog."""
        failures = undo.rollback()
        if not failures:
            return
        if isinstance(exc, NumaPinError):
            exc.add_rollback_failures(failures)
        else:
            exc.add_note(describe_failures(failures))
        report.log_syslog(f"numa-pin: {container_id}: {describe_failures(failures)}")

    def _grant(self, request: ContainerRequest, decision: Decision, pid: int | None, ref, kind: str | None) -> Grant:
        return Grant(
            container_id=request.container_id,
            pod_id=request.pod_id,
            container_name=request.name,
            kind=kind or ("exclusive" if decision.exclusive else "shared"),
            pid=pid,
            start_time=_start_time(pid, self.config.proc_root),
            cgroup=ref.rel_path if ref is not None else None,
            cpus=decision.cpus,
            mems=decision.mems,
            devices={k: tuple(v) for k, v in decision.devices.items()},
            memory={k: dict(v) for k, v in decision.memory.items()},
            cpuset_limit=request.cpuset,
            affinity=decision.hint.affinity,
            policy=decision.policy,
            scope=decision.scope,
            created=time.time(),
            netdevs=(),
        )

    # ---- enforcement -----------------------------------------------------------------------
    def shared_pool(self, state: LedgerState) -> frozenset[int]:
        """All CPUs minus every exclusive grant; the reserved CPUs keep it from emptying."""
        exclusive = [g.cpus for g in state.grants.values() if g.cpus]
        return shared_pool(self.topology.cpu_ids, exclusive, self.reserved())

    def config_conflicts(self, state: LedgerState) -> list[str]:
        """One line per grant that holds CPUs the current config reserves, with the way out
        (kubelet checks its checkpoint against its config the same way, but refuses to start)."""
        from numa_pin.cpuset import format_list

        held = reserved_conflicts({g.container_id: g.cpus for g in state.grants.values() if g.cpus}, self.reserved())
        return [
            f"grant {cid} holds CPU {format_list(cpus)}, which the config now reserves; it stays with that "
            f"container until it ends (numa-pin release {cid}), or restore the reservation it was made under"
            for cid, cpus in held.items()
        ]

    def reserved(self) -> frozenset[int]:
        """The CPUs reserved for the system (computed once per service: it only depends on config
        and topology)."""
        if self._reserved is None:
            from numa_pin.allocators.cpu import reserved_cpus
            from numa_pin.topology.cpus import CpuTopology

            s = self.settings
            self._reserved = reserved_cpus(
                CpuTopology.from_topology(self.topology), s.cpu_options, s.reserved_cpus, s.num_reserved_cpus
            )
        return self._reserved

    def _shared_refs(self, state: LedgerState, exclude: str | None = None,
                     real_dirs: dict[str, str] | None = None):
        """The shared containers' cgroups (``real_dirs``: a memo of parents' real paths, so each
        path check costs one ``lstat``; see :func:`numa_pin.enforcer.cgroups.realpath`)."""
        paths = [g.cgroup for g in state.shared_grants() if g.container_id != exclude and g.cgroup]
        return cg.refs_from_paths(paths, self.config.cgroup_root, self._layout(), real_dirs)

    def _limits(self, state: LedgerState, real_dirs: dict[str, str] | None = None,
                ) -> dict[cg.CgroupRef, frozenset[int]]:
        """Shared containers' own cpusets (their cpuset is the pool inside it), by cgroup."""
        layout = self._layout()
        return {
            cg.ref_from_path(g.cgroup, self.config.cgroup_root, layout, real_dirs): g.cpuset_limit
            for g in state.shared_grants() if g.cgroup and g.cpuset_limit
        }

    def _resize_shared(self, state: LedgerState, undo: UndoLog, exclude: str | None = None) -> None:
        """Every shared container's cpuset to the pool of ``state`` (inside its own cpuset), path
        checks sharing one memo; writes only the cpusets that change (issue 21)."""
        memo: dict[str, str] = {}
        resize_shared(self._shared_refs(state, exclude, memo), self.shared_pool(state), self.config.cgroup_root,
                      undo, self._limits(state, memo), memo)

    def _enforce(self, grant: Grant, ref, state: LedgerState, undo: UndoLog, pool_changed: bool = False) -> None:
        pool = self.shared_pool(state)
        if ref is not None:
            if grant.cpus:
                apply_cpuset(ref, grant.cpus, grant.mems, self.config.cgroup_root, undo)
            elif grant.kind == "shared":
                own = pool & grant.cpuset_limit if grant.cpuset_limit else pool
                apply_cpuset(ref, own, read_cpuset(ref).mems, self.config.cgroup_root, undo)
        if grant.cpus or pool_changed:
            self._resize_shared(state, undo, exclude=grant.container_id)

    def _grant_devices(
        self, grant: Grant, pid: int, undo: UndoLog, rootfs: str | None, state: LedgerState
    ) -> tuple[tuple[dict[str, str], ...], GpuAccess | None, tuple[PodNetdev, ...]]:
        """Move granted SR-IOV VF netdevs into the container's netns (``net1``, ``net2``, ...; scope
        pod: once into the pod's netns, see :meth:`_move_pod_vf`), open the container's device
        cgroup to granted GPUs and create their nodes (and the GPU list file) in the container's
        mount namespace. ``state`` is the ledger as it will be committed, pod record included.
        Returns the container's netdev records, the GPU access and the VFs this admission moved
        into the pod's netns."""
        from numa_pin.topology.model import KIND_GPU

        records: list[dict[str, str]] = []
        pod_vfs: list[PodNetdev] = []
        gpus = []
        pod = state.pods.get(grant.pod_id) if grant.scope == names.POD_SCOPE else None
        for resource, ids in grant.devices.items():
            for address in ids:
                dev = self.topology.device(address)
                if dev is None:
                    continue
                if dev.kind == KIND_GPU:
                    gpus.append(dev)
                elif dev.is_vf and dev.netdevs:
                    _check_not_parked(state, address, grant, pod)
                    if pod is not None:
                        moved = self._move_pod_vf(grant, pod, resource, address, pid, tuple(pod_vfs), undo)
                        if moved is not None:
                            pod_vfs.append(moved)
                        continue
                    from numa_pin.enforcer.netdev import move_netdev_to_netns

                    rec = move_netdev_to_netns(
                        address, pid, f"net{len(records) + 1}", self.config.sysfs_root, self.config.proc_root,
                        bring_up=True, undo=undo,
                    )
                    records.append({"record": json.dumps(rec.to_dict(), sort_keys=True)})
        access: GpuAccess | None = None
        if gpus:
            from numa_pin.enforcer.gpu import grant_gpus

            allowed = grant_gpus(gpus, pid, self.config.proc_root, self.config.cgroup_root, self._layout(), undo)
            from numa_pin.enforcer.devnodes import expose_gpus

            nodes = expose_gpus(gpus, pid, self.config.proc_root, rootfs, undo)
            rules = [str(r) for r in allowed.added] if allowed is not None else []
            if nodes or rules:  # what a release of a live container takes back (see _revoke_gpus)
                v2 = allowed is not None and allowed.version == 2
                access = GpuAccess(tuple(nodes), tuple(rules),
                                   allowed.cgroup_dir if allowed is not None and not v2 else None,
                                   tuple(allowed.bpf_dirs) if allowed is not None else ())
        return tuple(records), access, tuple(pod_vfs)

    def _move_pod_vf(
        self, grant: Grant, pod: PodRecord, resource: str, address: str, pid: int,
        moving: tuple[PodNetdev, ...], undo: UndoLog,
    ) -> PodNetdev | None:
        """Move VF ``address`` into the pod's network namespace (the one ``pid`` is in) under the
        first ``net<N>`` no VF of the pod holds there, unless the pod's record says it is there
        already (None: nothing moved). ``moving``: VFs this admission moved before.

        Raises EnforcementError when the pod's record puts the VF in another network namespace
        (containers of one pod that do not share one), or when the move fails."""
        from numa_pin.enforcer.netdev import move_netdev_to_netns
        from numa_pin.enforcer.netns import netns_id, netns_path

        ns = netns_id(pid, self.config.proc_root)
        held = pod.netdev(address)
        if held is not None:
            if held.netns != ns:
                raise EnforcementError(
                    f"VF {address} of pod {pod.pod_id} is in the network namespace container {held.moved_by} "
                    f"is in ({held.ifname} there), not in that of container {grant.container_id}; pod scope "
                    "moves a VF once for the pod, so the pod's containers must share its network namespace",
                    path=netns_path(pid, self.config.proc_root),
                )
            return None
        taken = {n.ifname for n in (*pod.netdevs, *moving) if n.netns == ns}
        name = next(f"net{i}" for i in range(1, len(taken) + 2) if f"net{i}" not in taken)
        rec = move_netdev_to_netns(
            address, pid, name, self.config.sysfs_root, self.config.proc_root, bring_up=True, undo=undo,
        )
        return PodNetdev(address, resource, name, ns, grant.container_id, json.dumps(rec.to_dict(), sort_keys=True))

    def _restore_pods(self, pods: tuple[PodRecord, ...], grants: tuple[Grant, ...] = ()) -> list[str]:
        """Give the VFs of pods whose record went back to the host, pulling them out of the pod's
        network namespace through any process still in it (``grants``' pids first: the pod's
        containers released by hand still run), or finding them at home when it is gone."""
        if not any(pod.netdevs for pod in pods):
            return []
        from numa_pin.enforcer.netdev import NetdevRecord, restore_netdev
        from numa_pin.enforcer.netns import find_netns_member

        problems: list[str] = []
        members: dict[str, int | None] = {}
        prefer = [g.pid for g in grants if g.pid is not None]
        for pod in pods:
            for vf in pod.netdevs:
                if vf.netns not in members:
                    members[vf.netns] = find_netns_member(vf.netns, self.config.proc_root, prefer)
                member = members[vf.netns]
                try:
                    rec = NetdevRecord.from_dict(json.loads(vf.record))
                    restore_netdev(rec, member, self.config.sysfs_root, self.config.proc_root)
                except (NumaPinError, KeyError, ValueError) as exc:
                    why = "" if member is not None else (
                        "; no process is left in the pod's network namespace: the kernel gives the VF "
                        "back when that namespace is destroyed"
                    )
                    problems.append(f"pod {pod.pod_id}: VF {vf.address} ({vf.ifname}) not restored: {exc}{why}")
        return problems

    def _log_problems(self, problems: list[str]) -> None:
        for problem in problems:
            report.log_syslog(f"numa-pin: {problem}")

    def _revoke_gpus(self, grant: Grant) -> list[str]:
        """Take back the GPU nodes and device rules of a grant whose container still runs (a
        release by hand): ``devices.deny`` on cgroup v1, the prologue of the device programs on
        v2. A dead container took them along with its namespace and cgroup."""
        access = grant.gpus
        if access is None or grant.pid is None or not self._alive(grant):
            return []
        try:
            from numa_pin.enforcer import cgroups as cgf
            from numa_pin.enforcer.devnodes import remove_device_nodes

            remove_device_nodes(grant.pid, list(access.nodes), self.config.proc_root, None)
            if access.devices_dir and os.path.isdir(access.devices_dir):
                for rule in access.rules:
                    cgf.write_cgroup_file(os.path.join(access.devices_dir, "devices.deny"), rule)
            if access.bpf_dirs:  # cgroup v2: take numa-pin's prologue out of the device programs
                from numa_pin.enforcer.gpu import revoke_device_rules

                revoke_device_rules(list(access.rules), list(access.bpf_dirs))
        except NumaPinError as exc:
            return [f"{grant.container_id}: GPU access not taken back: {exc}"]
        return []

    def _restore_netdevs(self, grant: Grant) -> list[str]:
        """Give moved VFs back to the host (by PCI address, under their host names)."""
        from numa_pin.enforcer.netdev import NetdevRecord, restore_netdev

        problems: list[str] = []
        for entry in grant.netdevs:
            if "record" not in entry:
                continue  # moved by the runtime (linux.netDevices), which the kernel gives back
            try:
                rec = NetdevRecord.from_dict(json.loads(entry["record"]))
                restore_netdev(rec, None, self.config.sysfs_root, self.config.proc_root)
            except (NumaPinError, KeyError, ValueError) as exc:
                problems.append(f"{grant.container_id}: netdev not restored: {exc}")
        return problems

    def note_runtime_netdevs(self, container_id: str, host_names: tuple[str, ...]) -> Grant:
        """Record that the runtime moves these VF netdevs (``linux.netDevices``), so no later
        stage moves them again. Raises LedgerError, or KeyError when the grant is gone."""
        with self.ledger.transaction() as txn:
            grant = replace(txn.state.grants[container_id], netdevs=tuple({"runtime": n} for n in host_names))
            txn.state = txn.state.with_grant(grant)
        return grant

    # ---- release ---------------------------------------------------------------------------
    def release(self, container_id: str) -> Grant | None:
        """Forget a container's grant and give its CPUs back to the shared pool. Idempotent.

        Called at poststop, when the container's process and cgroup are usually gone already, so
        the grant is looked up before garbage collection would drop it silently."""
        with self.ledger.transaction() as txn:
            grant = txn.state.grants.get(container_id)
            state = txn.state.without(container_id) if grant is not None else txn.state
            state, dropped = collect_garbage(state, self._alive)
            if grant is not None and not state.grants_of_pod(grant.pod_id) and grant.pod_id in state.pods:
                state = state.without_pod(grant.pod_id)
            gone = ((grant,) if grant is not None else ()) + dropped
            for g in gone:
                self._log_problems(self._restore_netdevs(g) + self._revoke_gpus(g))
            self._log_problems(self._restore_pods(_pods_dropped(txn.state, state), gone))
            if (grant is not None and grant.cpus) or any(g.cpus for g in dropped):
                undo = UndoLog()
                try:
                    self._resize_shared(state, undo)
                except EnforcementError as exc:
                    self._roll_back(undo, exc, container_id)
                    raise
            txn.state = state
        if grant is not None and self.config.syslog:
            report.log_decision(grant, "released")
        return grant

    def reconcile(self) -> tuple[list[Grant], list[str]]:
        """Drop dead grants, then re-assert every live cgroup's cpuset (drift repair)."""
        repaired: list[str] = []
        with self.ledger.transaction() as txn:
            state, removed = collect_garbage(txn.state, self._alive)
            self._log_problems(self._restore_pods(_pods_dropped(txn.state, state), removed))
            layout = self._layout()
            undo = UndoLog()
            pool = self.shared_pool(state)
            for g in state.grants.values():
                if not g.cgroup:
                    continue
                ref = cg.ref_from_path(g.cgroup, self.config.cgroup_root, layout)
                if not os.path.isdir(ref.cpuset_dir):
                    continue
                cpus = g.cpus if g.cpus else (pool & g.cpuset_limit if g.cpuset_limit else pool)
                before = len(undo)
                mems = g.mems if g.cpus and g.mems else read_cpuset(ref).mems
                apply_cpuset(ref, cpus, mems, self.config.cgroup_root, undo)
                if len(undo) != before:
                    repaired.append(g.container_id)
            txn.state = state
        return list(removed), repaired


def live_name_message(grant: Grant) -> str:
    """Why ``numa-pin run --name`` may not take a name a live grant holds."""
    from numa_pin.cpuset import format_list

    return (
        f"{grant.container_id!r} is the name of a live grant (pid {grant.pid}, cpus "
        f"{format_list(grant.cpus) or 'shared'}); choose another --name, or `numa-pin release "
        f"{grant.container_id}` once that job is gone"
    )


def _pods_dropped(before: LedgerState, after: LedgerState) -> tuple[PodRecord, ...]:
    """Pod records of ``before`` that ``after`` no longer has (their pod's last grant went)."""
    return tuple(pod for pod_id, pod in sorted(before.pods.items()) if pod_id not in after.pods)


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


def _start_time(pid: int | None, proc_root: str) -> float | None:
    """The process start time liveness compares against, so pid reuse cannot fool GC."""
    return process_start_time(pid, proc_root) if pid else None


__all__ = ["PENDING_GRACE_S", "Admitted", "NodeService", "live_name_message", "settings_from_config"]
