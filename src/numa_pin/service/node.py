"""The node service: wires the pure decision to the I/O edges through the registered resources.

Used by the OCI hook (``numa-pin-hook``) and the operator command (``numa-pin``). One admission
is one ledger transaction:

1. lock the ledger, drop grants whose process and cgroup are both gone (every resource
   collects what outlives them: :meth:`~numa_pin.resources.node.base.NodeResource.collect`);
2. decide (:func:`numa_pin.admission.decide.decide`);
3. enforce: every resource, in registry order
   (:meth:`~numa_pin.resources.node.base.NodeResource.enforce`);
4. commit the grant. Any failure in 2-3 rolls back every write made so far and commits nothing,
   so a rejected container leaves nothing allocated.

A release gives back what the grant holds (every resource, in reverse order); a reconcile drops
dead grants and repairs drift. What these transactions share (the ledger, liveness, rollback,
logging) is :class:`~numa_pin.service.base.ServiceBase`. This module names no resource: the resources are
:mod:`numa_pin.resources` (pure halves) and :mod:`numa_pin.resources.node` (their I/O).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from numa_pin.admission.decide import Decision, decide, reject
from numa_pin.base.deadline import Deadline
from numa_pin.base.record import record, replace
from numa_pin.enforcer import cgroups as cg
from numa_pin.enforcer.owner import ContainerCgroup, check_container_cgroup
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import AdmissionTimeout, EnforcementError, LedgerCorrupt, NumaPinError, RequestError
from numa_pin.ledger.liveness import BootTimes, boot_clock, collect_garbage, process_start_time, sample_idle
from numa_pin.ledger.model import KIND_PROCESS, KIND_SHARED, Grant, LedgerState, PodRecord
from numa_pin.reporting import report, tally
from numa_pin.requests.request import ContainerRequest
from numa_pin.resources.base import grant_from, live_name_message, path_refusal
from numa_pin.resources.node.base import PENDING_GRACE_S, Admission, Release
from numa_pin.resources.node.registry import settings_from_config
from numa_pin.service.base import ServiceBase
from numa_pin.topology.cache import DEFAULT_MAX_AGE_S

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from numa_pin.config.schema import Config
    from numa_pin.ledger.store import Transaction
    from numa_pin.resources.node.warm import WarmState
    from numa_pin.resources.runtime import RuntimeTarget
    from numa_pin.service.adopt import Adopted, Adoptee

#: how often an admission decides again after a real conflict (another writer took what its
#: decision holds, or changed its pod); each such conflict is another admission committed
MAX_ATTEMPTS = 8

@record
class Admitted:
    """The outcome of a successful admission."""

    grant: Grant
    decision: Decision | None  # None when an existing grant was re-applied (idempotent)


class NodeService(ServiceBase):
    """All I/O of one node, rooted at the config's sysfs, proc, cgroup and state roots."""

    # ---- decisions -------------------------------------------------------------------------
    def plan(self, request: ContainerRequest) -> Decision:
        """What :meth:`admit` would decide now, without changing anything."""
        state, _ = collect_garbage(self.set_aside(self.ledger.read()), self._alive)
        return decide(self.topology, state, request, self.settings)

    def admit(
        self, request: ContainerRequest, pid: int | None, *, kind: str | None = None,
        owner: ContainerCgroup | None = None, deadline: Deadline | None = None,
        rootfs: str | None = None, expected_cgroup: str | None = None, expected_root: str | None = None,
        target: RuntimeTarget | None = None,
    ) -> Admitted:
        """Decide, enforce and record one container (or process). Raises an
        :class:`~numa_pin.errors.AdmissionError` on rejection, after rolling everything back.

        The decision is computed on a snapshot of the ledger, outside its lock, so a slow
        decision never blocks other admissions, releases or the operator. The commit then
        takes the lock, checks that the ledger is still the snapshot and, if another writer
        got there first, decides again (at most :data:`MAX_ATTEMPTS` times). The whole
        admission runs under ``deadline`` (default: the config's ``admission_timeout_s``);
        past it the container is rejected with :class:`~numa_pin.errors.AdmissionTimeout`.

        Raises :class:`~numa_pin.errors.EnforcementError` before anything is written when ``pid``
        sits in the hierarchy root, or (with ``owner``, the bundle's cgroup facts) in another cgroup.
        ``rootfs`` (the spec's ``root.path``) is the container's root before pivot_root, for the resources
        that put files there.
        ``expected_cgroup`` (precreate, no pid yet) is the cgroup the runtime will create; the
        grant lives by it once :data:`PENDING_GRACE_S` have passed; ``expected_root`` is the root
        filesystem the runtime was given (gone: the container was removed before it started).
        ``target`` is the path the request came in by: a new container that asks what it cannot
        carry is refused with :class:`~numa_pin.errors.PathLimitError` before anything is decided
        (None: no check).
        """
        started, waits = time.monotonic(), self.lock_waits
        try:
            admitted = self._admit_in_time(request, pid, kind, owner, deadline, rootfs,
                                           (expected_cgroup, expected_root), target)
        except Exception as exc:
            self._count_admission(request, None, exc, time.monotonic() - started, self.lock_waits - waits)
            raise
        self._count_admission(request, admitted.decision, None, time.monotonic() - started, self.lock_waits - waits)
        return admitted

    def _admit_in_time(
        self, request: ContainerRequest, pid: int | None, kind: str | None, owner: ContainerCgroup | None,
        deadline: Deadline | None, rootfs: str | None, expected: tuple[str | None, str | None],
        target: RuntimeTarget | None,
    ) -> Admitted:
        budget = deadline or Deadline(self.config.admission_timeout_s, f"admission of {request.container_id}")
        with budget.active():
            try:
                return self._admit(request, pid, kind, owner, budget, rootfs, expected, target)
            except LedgerCorrupt as exc:
                if not request.asks_nothing:
                    raise
                # nothing was written yet; a container that asks for nothing starts untouched, and
                # `numa-pin recover` finds it later if the pool has shrunk under it
                report.log_syslog(f"numa-pin: {request.container_id}: started without a grant: {exc}")
                return Admitted(Grant(request.container_id, request.pod_id, request.name, KIND_SHARED, pid=pid,
                                      created=time.time()), None)

    def _admit(
        self, request: ContainerRequest, pid: int | None, kind: str | None, owner: ContainerCgroup | None,
        deadline: Deadline, rootfs: str | None = None, expected: tuple[str | None, str | None] = (None, None),
        target: RuntimeTarget | None = None,
    ) -> Admitted:
        cfg = self.config
        expected_cgroup, expected_root = expected
        ref = None
        if pid:
            layout = self._layout()
            ref = cg.find_cgroup(pid, cfg.proc_root, cfg.cgroup_root, layout)
            check_container_cgroup(ref, owner, pid, os.path.join(cfg.proc_root, str(pid), "cgroup"))
        for _attempt in range(MAX_ATTEMPTS):
            with deadline.interruptible():
                read = self.ledger.read()
                snapshot, dead = self._collect_needed(read, sample=not self.deferring)
                decision: Decision | None = None
                if request.container_id not in snapshot.grants:
                    if target is not None:
                        path_refusal(self.resources, request, target)
                    decision = decide(self.topology, snapshot, request, self.settings)
            if decision is not None and not decision.admit:
                raise reject(decision)
            timeout = min(cfg.lock_timeout_s, deadline.remaining())
            with self.ledger.transaction(timeout=timeout, on_wait=self._waiting) as txn:
                # one liveness pass per admission: a grant the snapshot found alive counts as alive
                # (at worst a grant that died since stays one more transaction); only grants new
                # since the snapshot, or found dead there, are checked again (when the ledger is
                # still the one the snapshot was taken of, the dead are dropped as found there)
                if txn.state is read:
                    state, dropped = snapshot, dead
                else:
                    state, dropped = collect_garbage(self.set_aside(txn.state), self._alive_since(snapshot))
                # the decision is checked against the ledger as it is now, not an unchanged
                # snapshot; it is made again only on a real conflict (docs/design/admission-concurrency.md)
                if request.container_id not in state.grants:
                    decision = self._revalidate(decision, request, snapshot, state)
                    if decision is None:
                        continue
                deadline.check()
                self._log_dropped(dropped)
                # what outlives the dead grants goes home before anything is granted
                # (the decision already counts it free); a crash here leaves the records, and
                # giving back again is harmless
                self._collect(txn.state, state, dropped)
                existing = state.grants.get(request.container_id)
                undo = UndoLog()
                try:
                    if existing is not None and kind == KIND_PROCESS and existing.pid not in (pid, None):
                        raise RequestError(live_name_message(existing), annotation="--name")
                    bind = existing is not None and existing.pid is None and pid is not None
                    started = _start_time(pid, cfg.proc_root, self.boot_times)
                    if existing is not None:
                        grant = replace(existing, pid=pid or existing.pid, start_time=started,
                                        cgroup=ref.rel_path if ref is not None else existing.cgroup,
                                        pending_since=None if pid else existing.pending_since,
                                        pending_root=None if pid else existing.pending_root)
                        decision = None
                    else:
                        assert decision is not None
                        grant = grant_from(request, decision, pid=pid, start_time=started,
                                           cgroup=ref.rel_path if ref is not None else None, kind=kind,
                                           created=time.time(), boot_id=self.boot_id)
                        if ref is None and expected_cgroup:
                            grant = replace(grant, cgroup=expected_cgroup, pending_since=boot_clock(),
                                            pending_root=expected_root)
                    new_state = state.with_grant(grant)
                    if decision is not None and decision.pod_affinity is not None and request.pod_id not in state.pods:
                        pod = PodRecord(
                            request.pod_id, decision.pod_affinity, decision.policy, decision.scope, time.time()
                        )
                        new_state = new_state.with_pod(pod)
                    enforcing = Admission(grant, new_state, undo, ref, pid, rootfs, dropped,
                                          (existing is None or bind) and bool(pid), txn.state)
                    for resource in self.resources:
                        enforcing = resource.enforce(self, enforcing, grant)
                    grant, new_state = enforcing.grant, enforcing.state
                except BaseException as exc:
                    self._roll_back(undo, exc, request.container_id)
                    raise
                # a failed ledger write undoes all of it too (the commit is inside the rollback)
                txn.on_commit_failure(self._undoer(undo, request.container_id))
                txn.state = new_state
            if decision is not None and cfg.syslog:
                report.log_decision(grant, "admitted")
            self.after_reply(self.sweep)
            return Admitted(grant, decision)
        raise AdmissionTimeout(
            f"admission of {request.container_id}: the ledger changed under {MAX_ATTEMPTS} decisions in a row; "
            "try again"
        )

    def adopt_batch(self, adoptees: Sequence[Adoptee], deadline: Deadline,
                    target: RuntimeTarget | None = None) -> list[Adopted]:
        """Adopt running containers that hold no grant, all in one ledger transaction
        (:func:`numa_pin.service.adopt.adopt_batch`: each refusal rolled back alone, a failed commit
        rolls back all; ``target``: their path, as :meth:`admit` takes it)."""
        from numa_pin.service.adopt import adopt_batch

        return adopt_batch(self, adoptees, deadline, target)

    def _revalidate(self, decision: Decision | None, request: ContainerRequest, snapshot: LedgerState,
                    state: LedgerState) -> Decision | None:
        """``decision`` as it may be committed on ``state`` (:func:`~numa_pin.admission.validate.revalidate`),
        or None to decide again (no decision: the snapshot had this container's grant, now gone)."""
        if decision is None:
            return None
        from numa_pin.admission.validate import revalidate

        return revalidate(decision, request, snapshot, state, topology=self.topology, settings=self.settings,
                          memo=self.memo)

    # ---- what the resources say about the node ----------------------------------------------
    def config_conflicts(self, state: LedgerState) -> list[str]:
        """One line per grant the current config contradicts, with the way out (kubelet checks
        its checkpoint against its config the same way, but refuses to start)."""
        return [line for resource in self.resources for line in resource.conflicts(self, state)]

    def describe(self, state: LedgerState) -> dict[str, Any]:
        """What every resource shows in ``numa-pin status`` (merged, in registry order)."""
        out: dict[str, Any] = {}
        for resource in self.resources:
            out.update(resource.status(self, state))
        return out

    def describe_grant(self, grant: Grant) -> list[str]:
        """Every resource's words about ``grant`` (``<resource>=<what it holds>``), each once."""
        return list(dict.fromkeys(word for resource in self.resources for word in resource.describe(grant)))

    # ---- release ---------------------------------------------------------------------------
    def release(self, container_id: str, *, pending_only: bool = False) -> Grant | None:
        """Forget a container's grant and give back what it holds. Idempotent.

        Called at poststop, when the container's process and cgroup are usually gone already, so
        the grant is looked up before garbage collection would drop it silently. ``pending_only``:
        only a grant no process was bound to yet (a refused prestart's precreate grant)."""
        with self.ledger.transaction() as txn:
            txn.state = self.set_aside(txn.state)
            grant = txn.state.grants.get(container_id)
            if pending_only and grant is not None and grant.pid is not None:
                grant = None
            state = txn.state.without(container_id) if grant is not None else txn.state
            state, dropped = self._collect_needed(state, sample=not self.deferring)
            self._log_dropped(dropped)
            if grant is not None and not state.grants_of_pod(grant.pod_id) and grant.pod_id in state.pods:
                state = state.without_pod(grant.pod_id)
            gone = ((grant,) if grant is not None else ()) + dropped
            later = self.deferring and bool(gone)
            going = Release(txn.state, state, grant, gone, UndoLog(), later)
            try:
                for resource in reversed(self.resources):
                    self._log_problems(resource.release(self, going))
            except EnforcementError as exc:
                self._roll_back(going.undo, exc, container_id)
                raise
            # a failed ledger write undoes it (the commit is inside the rollback); what cannot be
            # undone (NodeResource.give_back) waits until the ledger no longer grants it
            txn.on_commit_failure(self._undoer(going.undo, container_id))
            txn.after_commit(lambda: self._give_back(going))
            txn.state = state
        if grant is not None:
            tally.add(self.config.state_dir, {"releases": 1})
        if later:
            self.after_reply(self.settle)
        self.after_reply(self.sweep)
        if grant is not None and self.config.syslog:
            report.log_decision(grant, "released")
        return grant

    def settle(self) -> None:
        """What releases left for later (:meth:`after_reply`), done now for the ledger as it is:
        every resource's :meth:`~numa_pin.resources.node.base.NodeResource.settle`, under the lock.
        Never raises: a failure is logged, and what it left undone only waits for the next
        release, exclusive admission or ``reconcile`` (a shared container on fewer CPUs than the
        pool has never runs where it must not)."""
        try:
            with self.ledger.transaction() as txn:
                undo = UndoLog()
                for resource in self.resources:
                    self._log_problems(resource.settle(self, txn.state, undo))
                undo.commit()
        except NumaPinError as exc:
            report.log_syslog(f"numa-pin: growing the shared containers back failed: {exc}")

    def sweep(self) -> None:
        """The turn at liveness of the grants that hold nothing (shared containers), which an
        admission or release left for later (:meth:`after_reply`): a few of them are checked
        under the lock (:func:`~numa_pin.ledger.liveness.sample_idle`), and the dead ones dropped
        and logged. Never raises: a failure is logged, and a dead shared grant meanwhile holds
        nothing another container needs."""
        try:
            with self.ledger.transaction() as txn:
                state, dropped = sample_idle(txn.state, self._alive)
                if dropped:
                    self._log_dropped(dropped)
                    self._collect(txn.state, state, dropped)
                    txn.state = state
        except NumaPinError as exc:
            report.log_syslog(f"numa-pin: checking the shared containers' liveness failed: {exc}")

    def release_to_shared(self, container_id: str) -> Grant | None:
        """Take back what a live container holds for itself alone and keep tracking it as a shared
        container (``numa-pin release --force``): its grant becomes a shared grant
        (:meth:`~numa_pin.ledger.model.Grant.as_shared`), enforced by every resource as a shared
        container's, with the old grant's holdings counted as dropped (they go back to the node),
        and what cannot be undone is given back once the ledger no longer grants it. Returns the
        new grant, or None when there is none. The poststop (or a release once it has stopped)
        drops it."""
        with self.ledger.transaction() as txn:
            txn.state = self.set_aside(txn.state)
            before, old = txn.state, txn.state.grants.get(container_id)
            if old is None:
                return None
            grant = old.as_shared()
            enforcing = self._enforce_changed(txn, old, grant, (old,))
            undo = enforcing.undo
            txn.after_commit(lambda: self._give_back(Release(before, enforcing.state, old, (old,), undo)))
            txn.state = enforcing.state
        if self.config.syslog:
            report.log_decision(grant, "released to the shared pool")
        return grant

    def _enforce_changed(self, txn: Transaction, old: Grant, grant: Grant, gone: tuple[Grant, ...]) -> Admission:
        """Enforce ``grant``, the new form of the live grant ``old``, through every resource inside
        ``txn``; a failure rolls back what was written, and a failed commit runs the undo."""
        undo = UndoLog()
        enforcing = Admission(grant, txn.state.with_grant(grant), undo, self.live_cgroup_ref(old), old.pid,
                              None, gone, False, txn.state)
        try:
            for resource in self.resources:
                enforcing = resource.enforce(self, enforcing, grant)
        except BaseException as exc:
            self._roll_back(undo, exc, old.container_id)
            raise
        txn.on_commit_failure(self._undoer(undo, old.container_id))
        return enforcing

    # ---- resize ----------------------------------------------------------------------------
    def update_grant(self, container_id: str, change: Callable[[Grant, LedgerState], Grant]) -> tuple[Grant, Grant]:
        """Replace the live grant of ``container_id`` with ``change(grant, ledger state)``, computed
        under the ledger lock, and enforce it through every resource in the same transaction (its
        cgroup written, the shared pool resized, each write with its undo); a failure rolls all of
        it back and commits nothing. Returns (old, new grant). Raises RequestError when no live
        grant has that id, and whatever ``change`` raises (``numa-pin resize``, an adopted cpuset)."""
        with self.ledger.transaction() as txn:
            txn.state = self.set_aside(txn.state)
            old = txn.state.grants.get(container_id)
            if old is None or not self._alive(old):
                raise RequestError(f"no running container or process holds a grant {container_id!r}",
                                   annotation="ID")
            grant = change(old, txn.state)
            enforcing = self._enforce_changed(txn, old, grant, ())
            txn.state = enforcing.state
        if self.config.syslog:
            report.log_decision(enforcing.grant, "resized")
        return old, enforcing.grant

    def reconcile(self) -> tuple[list[Grant], list[str]]:
        """Drop dead grants, then let every resource repair what drifted; then prune the reason
        files (:func:`~numa_pin.reporting.report.prune_reasons`)."""
        repaired: list[str] = []
        with self.ledger.transaction() as txn:
            state, removed = collect_garbage(self.set_aside(txn.state), self._alive)
            self._log_dropped(removed)
            self._collect(txn.state, state, removed)
            undo = UndoLog()
            for resource in self.resources:
                repaired += [cid for cid in resource.repair(self, state, undo) if cid not in repaired]
            txn.on_commit_failure(self._undoer(undo, "reconcile"))
            txn.state = state
        tally.add(self.config.state_dir, {"reconcile_runs": 1, "reconcile_repairs": len(repaired),
                                          "reconcile_dropped": len(removed)})
        report.prune_reasons(self.config.state_dir)  # a killed writer's file, when no rejection came after it
        return list(removed), repaired


def _start_time(pid: int | None, proc_root: str, boot_times: BootTimes) -> float | None:
    """The process start time liveness compares against, so pid reuse cannot fool GC."""
    return process_start_time(pid, proc_root, boot_times) if pid else None


def open_service(config: Config, cache_dir: str | None = None, *, topology_max_age: float = DEFAULT_MAX_AGE_S,
                 warm_state: WarmState | None = None) -> NodeService:
    """The node service of ``config``, as every entry point builds it. ``cache_dir``: where the
    topology is cached (the hook's and the agent's; None: discovered afresh), kept at most
    ``topology_max_age`` seconds; ``warm_state``: what the agent's spare warmed (None: cold)."""
    return NodeService(config, cache_dir, topology_max_age=topology_max_age, warm_state=warm_state)


__all__ = ["PENDING_GRACE_S", "Admitted", "NodeService", "live_name_message", "open_service", "settings_from_config"]
