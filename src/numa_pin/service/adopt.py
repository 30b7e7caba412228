"""Adopting many running containers in one ledger transaction (:func:`adopt_batch`).

A plugin that was away (NRI's ``Synchronize`` after a restart) meets every container that started
meanwhile at once, and the runtime waits for one answer for all of them: on a busy node that is
thousands. Admitting them one by one costs a ledger commit each and runs out of the runtime's
time. Here they are decided one after another on the ledger as the batch leaves it, each enforced
through every resource with its own undo, and committed together:

* a container refused (its decision, a cgroup it does not own, a failed write) has its own writes
  rolled back and is reported; the others go on;
* the containers that ask for something are decided first, so the shared pool they leave is known
  when the shared containers are enforced (none of those is narrowed twice);
* past the deadline the rest are reported as timed out, untouched, and what was adopted commits;
* anything else (a bug, an interrupt) and a failed commit roll back every write of the batch.

Like :mod:`numa_pin.service.node`, it names no resource. Only the NRI plugin uses it; the hook never
imports it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from numa_pin.admission.decide import decide, reject
from numa_pin.base.deadline import Deadline
from numa_pin.base.record import record, replace
from numa_pin.enforcer import cgroups as cg
from numa_pin.enforcer.owner import check_container_cgroup
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import AdmissionTimeout, NumaPinError
from numa_pin.ledger.liveness import boot_clock, process_start_time
from numa_pin.ledger.model import Grant, LedgerState, PodRecord
from numa_pin.reporting import report
from numa_pin.requests.request import ContainerRequest
from numa_pin.resources.base import grant_from, path_refusal
from numa_pin.resources.node.base import Admission
from numa_pin.service.base import ServiceBase

TYPE_CHECKING = False

if TYPE_CHECKING:
    from numa_pin.resources.runtime import RuntimeTarget


@record
class Adoptee:
    """One running container to adopt: its request, its pid (None: not started yet) and the
    cgroup the runtime made for it (kept when there is no pid)."""

    request: ContainerRequest
    pid: int | None
    expected_cgroup: str | None = None


@record
class Adopted:
    """What became of one :class:`Adoptee`: its grant, or the error that refused it."""

    container_id: str
    grant: Grant | None
    error: NumaPinError | None = None


def adopt_batch(service: ServiceBase, adoptees: Sequence[Adoptee], deadline: Deadline,
                target: RuntimeTarget | None = None) -> list[Adopted]:
    """Adopt every container of ``adoptees`` that holds no grant yet, in one ledger transaction
    (see the module docstring). ``target``: the path they came in by; one that asks what it
    cannot carry is refused (:class:`~numa_pin.errors.PathLimitError`), as its admission would
    be. Returns an :class:`Adopted` per adoptee without a grant, in the order given. Raises what
    the ledger raises (its lock, a failed commit), after rolling back."""
    if not adoptees:
        return []
    done: dict[str, Adopted] = {}
    undos: list[tuple[str, UndoLog]] = []
    timeout = min(service.config.lock_timeout_s, max(deadline.remaining(), 0.001))
    with service.ledger.transaction(timeout=timeout, on_wait=service._waiting) as txn:
        state, dropped = service._collect_needed(txn.state)
        service._log_dropped(dropped)
        service._collect(txn.state, state, dropped)
        first = True
        real_dirs: dict[str, str] = {}  # the parents' real paths, resolved once for the batch
        try:
            for item in sorted(adoptees, key=lambda a: a.request.asks_nothing):
                cid = item.request.container_id
                if cid in state.grants or cid in done:
                    continue
                try:
                    deadline.check()
                except AdmissionTimeout as exc:
                    done[cid] = Adopted(cid, None, exc)
                    continue
                undo = UndoLog()
                try:
                    if target is not None:
                        path_refusal(service.resources, item.request, target)
                    enforced = _adopt_one(service, state, item, undo, dropped if first else (), txn.state, real_dirs)
                except NumaPinError as exc:
                    service._roll_back(undo, exc, cid)
                    done[cid] = Adopted(cid, None, exc)
                    continue
                first = False
                undos.append((cid, undo))
                state = enforced.state
                done[cid] = Adopted(cid, enforced.grant)
        except BaseException as exc:
            _roll_back_all(service, undos, exc)
            raise
        txn.on_commit_failure(lambda exc: _roll_back_all(service, undos, exc))
        txn.state = state
    if service.config.syslog:
        for outcome in done.values():
            if outcome.grant is not None:
                report.log_decision(outcome.grant, "admitted")
    return [done[a.request.container_id] for a in adoptees if a.request.container_id in done]


def _adopt_one(service: ServiceBase, state: LedgerState, item: Adoptee, undo: UndoLog,
               dropped: tuple[Grant, ...], before: LedgerState, real_dirs: dict[str, str]) -> Admission:
    """Decide and enforce one adoptee on ``state``; its writes go to ``undo``. Raises the
    refusal (an AdmissionError) or what enforcing raised."""
    cfg, request, pid = service.config, item.request, item.pid
    ref = None
    if pid:
        ref = cg.find_cgroup(pid, cfg.proc_root, cfg.cgroup_root, service._layout(), real_dirs=real_dirs)
        check_container_cgroup(ref, None, pid, f"{cfg.proc_root}/{pid}/cgroup")
    decision = decide(service.topology, state, request, service.settings)
    if not decision.admit:
        raise reject(decision)
    started = process_start_time(pid, cfg.proc_root, service.boot_times) if pid else None
    grant = grant_from(request, decision, pid=pid, start_time=started,
                       cgroup=ref.rel_path if ref is not None else None, kind=None, created=time.time(),
                       boot_id=service.boot_id)
    if ref is None and item.expected_cgroup:
        grant = replace(grant, cgroup=item.expected_cgroup, pending_since=boot_clock())
    new_state = state.with_grant(grant)
    if decision.pod_affinity is not None and request.pod_id not in state.pods:
        new_state = new_state.with_pod(PodRecord(request.pod_id, decision.pod_affinity, decision.policy,
                                                 decision.scope, time.time()))
    enforcing = Admission(grant, new_state, undo, ref, pid, None, dropped, bool(pid), before, real_dirs)
    for resource in service.resources:
        enforcing = resource.enforce(service, enforcing, grant)
    return enforcing


def _roll_back_all(service: ServiceBase, undos: list[tuple[str, UndoLog]], exc: BaseException) -> None:
    """Undo every adoption of the batch, the last first."""
    for cid, undo in reversed(undos):
        service._roll_back(undo, exc, cid)


__all__ = ["Adopted", "Adoptee", "adopt_batch"]
