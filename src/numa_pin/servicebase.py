"""What every ledger transaction of the node service shares (:class:`ServiceBase`).

:class:`~numa_pin.service.NodeService` admits, releases, resizes and reconciles; each of those is
one ledger transaction, and each needs the same plumbing, kept here: the ledger and its lock-wait
count, which grants count as alive (all of them, those a snapshot vouches for, or only those that
hold something), the rollback of a failed transaction's writes (failures attached to the error and
logged), what every resource collects or gives back once grants are gone, what every resource
says the runtime must apply where the runtime applies a grant (precreate, NRI), and the syslog
lines of dropped grants and resource problems. Like the service, it names no resource.
"""

from __future__ import annotations

from collections.abc import Callable

from numa_pin import report
from numa_pin.config.schema import Config
from numa_pin.enforcer.undo import UndoLog, describe_failures
from numa_pin.errors import NumaPinError
from numa_pin.ledger.liveness import collect_garbage, collect_needed, of_earlier_boot
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.ledger.store import Ledger
from numa_pin.resources.node.base import Node, Release
from numa_pin.resources.node.registry import settings_from_config
from numa_pin.topology.cache import DEFAULT_MAX_AGE_S

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from numa_pin.admission.request import ContainerRequest
    from numa_pin.resources.node.runtime import RuntimeEdit
    from numa_pin.resources.runtime import RuntimeTarget


class ServiceBase(Node):
    """A :class:`~numa_pin.resources.node.base.Node` with its ledger, and the helpers its
    transactions share."""

    def __init__(self, config: Config, cache_dir: str | None = None, *,
                 topology_max_age: float = DEFAULT_MAX_AGE_S,
                 on_wait: Callable[[int | None], None] = report.lock_wait_notice) -> None:
        super().__init__(config, cache_dir, topology_max_age=topology_max_age, make_settings=settings_from_config)
        #: told the ledger lock holder's pid when an admission starts waiting for it
        self.on_wait = on_wait
        self.ledger = Ledger(config.state_dir, lock_timeout=config.lock_timeout_s)
        #: admissions of this service that waited for the ledger lock (``numa_pin_lock_waits_total``)
        self.lock_waits = 0

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
        ``reconcile`` and ``plan`` check them all."""
        return collect_needed(state, self._alive, self.boot_id, sample=sample)

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
