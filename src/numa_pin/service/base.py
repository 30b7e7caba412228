"""What every ledger transaction of the node service shares (:class:`ServiceBase`).

:class:`~numa_pin.service.node.NodeService` admits, releases, resizes and reconciles; each of those is
one ledger transaction, and each needs the same plumbing, kept here: the ledger and its lock-wait
count, which grants count as alive (all of them, those a snapshot vouches for, or only those that
hold something), the rollback of a failed transaction's writes (failures attached to the error and
logged), what every resource collects or gives back once grants are gone, what every resource
says the runtime must apply where the runtime applies a grant (precreate, NRI), and the syslog
lines of dropped grants and resource problems. Like the service, it names no resource.

A grant whose data no check survives (an id or cgroup holding a NUL or another control character,
too long, a cgroup that leaves the hierarchy: :func:`unusable`, or a cgroup path check that raises
:class:`~numa_pin.errors.CgroupEscapeError`) is *set aside* (:meth:`ServiceBase.set_aside`): left
out of the state every transaction works on, so the ledger no longer holds it once one commits,
and recorded as a reason file marked ``set_aside`` that ``status`` and ``reconcile`` report and
``numa-pin release <id>`` removes. Nothing is written to its cgroup (no path to it can be trusted);
what it held is free again in the ledger. So it never blocks another admission, status or release.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from numa_pin.base.text import MAX_PATH, quote, unfit
from numa_pin.config.schema import Config
from numa_pin.enforcer import cgroups as cg
from numa_pin.enforcer.undo import UndoLog, describe_failures
from numa_pin.errors import CgroupEscapeError, NumaPinError
from numa_pin.ledger.derived import changed_from, of_earlier_boot
from numa_pin.ledger.liveness import collect_garbage, collect_needed
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.ledger.store import Ledger
from numa_pin.reporting import report, tally
from numa_pin.resources.node.base import Node, Release
from numa_pin.resources.node.registry import settings_from_config
from numa_pin.topology.cache import DEFAULT_MAX_AGE_S

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from numa_pin.admission.decide import Decision
    from numa_pin.requests.request import ContainerRequest
    from numa_pin.resources.node.runtime import RuntimeEdit
    from numa_pin.resources.node.warm import WarmState
    from numa_pin.resources.runtime import RuntimeTarget


def unusable(grant: Grant) -> str | None:
    """Why no path check can be made of ``grant``'s recorded data, or None (pure)."""
    for what, value in (("container id", grant.container_id), ("cgroup", grant.cgroup or "")):
        wrong = unfit(value, MAX_PATH)
        if wrong is not None:
            return f"its {what} {quote(value)} {wrong}"
    if grant.cgroup and ".." in grant.cgroup.split("/"):
        return f"its cgroup {quote(grant.cgroup)} leaves the cgroup hierarchy"
    return None


class ServiceBase(Node):
    """A :class:`~numa_pin.resources.node.base.Node` with its ledger, and the helpers its
    transactions share. ``warm_state``: the agent child's caches and the work it leaves until
    the hook has its answer (:mod:`numa_pin.resources.node.warm`); None: cold, all of it now."""

    def __init__(self, config: Config, cache_dir: str | None = None, *,
                 topology_max_age: float = DEFAULT_MAX_AGE_S,
                 on_wait: Callable[[int | None], None] = report.lock_wait_notice,
                 warm_state: WarmState | None = None) -> None:
        super().__init__(config, cache_dir, topology_max_age=topology_max_age, make_settings=settings_from_config,
                         warm_state=warm_state)
        #: told the ledger lock holder's pid when an admission starts waiting for it
        self.on_wait = on_wait
        self.ledger = Ledger(config.state_dir, lock_timeout=config.lock_timeout_s,
                             cache=None if warm_state is None else warm_state.ledger)
        #: admissions of this service that waited for the ledger lock (``numa_pin_lock_waits_total``)
        self.lock_waits = 0
        #: the grants this service set aside (:meth:`set_aside`), recorded once each
        self.set_aside_ids: set[str] = set()
        #: the grants :func:`unusable` passed, by container id: each is checked once, not once per transaction
        self._usable: dict[str, Grant] = {}
        #: the grants of the last state :meth:`set_aside` left (every one usable): of a state one
        #: change later (the next transaction's, on a busy node's thousands) only that change is checked
        self._usable_grants: Mapping[str, Grant] | None = None
        #: grants whose cgroup path was found to leave the cgroup root (:meth:`escaped`), by container id
        self._escaped: dict[str, Grant] = {}

    @property
    def deferring(self) -> bool:
        """Whether what can wait is left until the hook has its answer (:meth:`after_reply`)."""
        return self.warm_state is not None and self.warm_state.deferred is not None

    def after_reply(self, work: Callable[[], None]) -> None:
        """Leave ``work`` until the agent's child has replied (once), where it defers; else nothing."""
        if self.warm_state is not None:
            self.warm_state.after_reply(work)

    def set_aside(self, state: LedgerState) -> LedgerState:
        """``state`` without the grants :func:`unusable` finds no check can be made of, each one
        recorded as set aside (see the module docstring). Each grant is checked once; of a state
        one change after the last one this left, only that change is looked at."""
        usable, grants = self._usable, state.grants
        if len(usable) > 2 * len(grants) + 64:
            usable.clear()  # containers come and go: forget those long gone
        if grants is self._usable_grants:
            return state
        one = None if self._usable_grants is None else changed_from(state, self._usable_grants)
        bad = []
        for cid, grant in grants.items() if one is None else [(cid, grants[cid]) for cid in one if cid in grants]:
            if usable.get(cid) is grant:
                continue  # this very grant was checked already (a grant is never changed, only replaced)
            why = "its cgroup path leaves the cgroup root" if self._escaped.get(cid) == grant else unusable(grant)
            if why is None:
                usable[cid] = grant
            else:
                bad.append((grant, why))
        for grant, why in bad:
            state = state.without(grant.container_id)
            self._record_set_aside(grant, why)
        self._usable_grants = state.grants
        return state

    def escaped(self, grant: Grant, why: str) -> None:
        """Set ``grant`` aside: its cgroup path leaves the cgroup root (the next transaction
        drops it from the ledger; nothing is done to it)."""
        if len(self._escaped) > 64:
            self._escaped.clear()
        self._escaped[grant.container_id] = grant
        self._usable.pop(grant.container_id, None)
        self._usable_grants = None  # the next transaction looks at every grant again
        self._record_set_aside(grant, why)

    def _record_set_aside(self, grant: Grant, why: str) -> None:
        if grant.container_id in self.set_aside_ids:
            return
        self.set_aside_ids.add(grant.container_id)
        line = (f"numa-pin: set aside the grant of {grant.container_id}: {why}; nothing is done to it, "
                "`numa-pin release` removes it")
        report.write_reason(self.config.state_dir, grant.container_id, line, {"kind": "set-aside", "set_aside": True})
        if self.config.syslog:
            report.log_syslog(line)

    def _alive(self, grant: Grant) -> bool:
        """Liveness; a grant whose cgroup path check raises is set aside, and counts as gone."""
        try:
            return super()._alive(grant)
        except CgroupEscapeError as exc:
            self._record_set_aside(grant, str(exc))
            return False

    def cgroup_ref(self, grant: Grant) -> cg.CgroupRef | None:
        """The recorded cgroup; None for a grant whose path check raises (it is set aside)."""
        try:
            return super().cgroup_ref(grant)
        except CgroupEscapeError as exc:
            self._record_set_aside(grant, str(exc))
            return None

    def live_grant(self, container_id: str) -> Grant | None:
        """The grant recorded under ``container_id`` while its process or cgroup lives (read-only)."""
        grant = self.ledger.read().grants.get(container_id)
        return grant if grant is not None and self._alive(grant) else None

    def _alive_since(self, snapshot: LedgerState) -> Callable[[Grant], bool]:
        """:meth:`_alive`, taking the word of ``snapshot`` (dead grants dropped) for its grants."""
        def alive(grant: Grant) -> bool:
            seen = snapshot.grants.get(grant.container_id)
            return seen is grant or seen == grant or self._alive(grant)

        return alive

    def _collect_needed(self, state: LedgerState, sample: bool = True) -> tuple[LedgerState, tuple[Grant, ...]]:
        """The grants of ``state`` found dead dropped, of those an admission or release needs
        (:func:`~numa_pin.ledger.liveness.collect_needed`): every grant that holds something, a
        few of those that hold nothing unless not ``sample`` (the boot check for the rest);
        ``reconcile`` and ``plan`` check them all. Grants set aside are left out first."""
        return collect_needed(self.set_aside(state), self._alive, self.boot_id, sample=sample)

    def runtime_edit(self, grant: Grant, request: ContainerRequest | None, target: RuntimeTarget,
                     state: LedgerState | None = None) -> RuntimeEdit:
        """What the runtime on ``target`` must apply for ``grant``: every resource's part, merged
        (``request``: the one it was admitted for; None for an update, which carries the cpuset)."""
        from numa_pin.resources.node.runtime import RuntimeAsk, merge_edits

        ask = RuntimeAsk(grant, request, target, self.ledger.read() if state is None else state)
        return merge_edits([resource.runtime(self, ask) for resource in self.resources])

    def applied(self, grant: Grant, edit: RuntimeEdit) -> Grant:
        """``grant`` noting what the runtime applies of ``edit`` itself (each resource notes its
        part), recorded in the ledger when that changes it. Raises LedgerError, or KeyError
        when the grant is gone."""
        noted = self._note(grant, edit)
        if noted == grant:
            return grant
        with self.ledger.transaction() as txn:
            noted = self._note(txn.state.grants[grant.container_id], edit)
            txn.state = txn.state.with_grant(noted)
        return noted

    def _note(self, grant: Grant, edit: RuntimeEdit) -> Grant:
        for resource in self.resources:
            grant = resource.applied(grant, edit)
        return grant

    def _count_admission(self, request: ContainerRequest, decision: Decision | None, exc: Exception | None,
                         seconds: float, waits: int) -> None:
        """Count one admission in :mod:`numa_pin.reporting.tally` (best effort, never raises): a grant
        re-applied without a decision counts only its lock waits."""
        counts: dict[str, float] = {"lock_waits": waits}
        if decision is not None or exc is not None:
            cfg = self.config
            policy = decision.policy if decision is not None else request.policy or cfg.policy
            scope = decision.scope if decision is not None else request.scope or cfg.scope
            kind = exc.kind if isinstance(exc, NumaPinError) else "internal" if exc is not None else None
            counts.update(tally.admission_increments(
                seconds=seconds, cpus=request.exclusive, memory=bool(request.amounts.memory_resources),
                policy=policy, scope=scope, full_pcpus=cfg.cpu_manager.options.full_pcpus_only, error_kind=kind))
        tally.add(self.config.state_dir, counts)

    def _waiting(self, holder: int | None) -> None:
        self.lock_waits += 1
        self.on_wait(holder)

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

    def _undoer(self, undo: UndoLog, container_id: str):
        """:meth:`_roll_back` of ``undo`` for :meth:`Transaction.on_commit_failure`."""
        return lambda exc: self._roll_back(undo, exc, container_id)

    def _collect(self, before: LedgerState, after: LedgerState, gone: tuple[Grant, ...]) -> None:
        gone = tuple(g for g in gone if g.container_id not in self.set_aside_ids)  # nothing is done to those
        for resource in self.resources:
            self._log_problems(resource.collect(self, before, after, gone))

    def _give_back(self, going: Release) -> None:
        for resource in reversed(self.resources):
            self._log_problems(resource.give_back(self, going))

    def _log_dropped(self, dropped: tuple[Grant, ...]) -> None:
        """A ``released`` line for each grant garbage collection dropped (and why)."""
        if self.config.syslog:
            for g in dropped:
                why = "of an earlier boot" if of_earlier_boot(g, self.boot_id) else "process and cgroup gone"
                report.log_syslog(f"{report.decision_line(g, 'released')} [{why}]", error=False)

    def drop_earlier_boots(self) -> tuple[Grant, ...]:
        """Drop (and log) the grants of earlier boots now; cheap when there are none (one read of the
        ledger). Commands and the agent call it as they start, so ``status`` never shows them.
        Every resource collects them: what they saved of an earlier boot is forgotten, never
        written back, so the first grant of this boot saves this boot's own values."""
        if self.boot_id is None or not any(of_earlier_boot(g, self.boot_id)
                                           for g in self.ledger.read().grants.values()):
            return ()
        with self.ledger.transaction() as txn:
            state, dropped = collect_garbage(txn.state, lambda g: not of_earlier_boot(g, self.boot_id))
            self._log_dropped(dropped)
            self._collect(txn.state, state, dropped)  # their saved originals and journal entries settle too
            txn.state = state
        return dropped

    def _log_problems(self, problems: list[str]) -> None:
        for problem in problems:
            report.log_syslog(f"numa-pin: {problem}")


__all__ = ["ServiceBase"]
