"""What one agent child keeps for the request it serves (:class:`WarmState`).

The agent's spare rehearses before a hook connects (:mod:`numa_pin.agent.spare`): it checks the
shared containers' cgroup paths and opens their ``cpuset.cpus`` for writing
(:func:`numa_pin.resources.node.cpu.warm`), so that the admission it then runs checks only the
containers that came since and writes through held descriptors. The child also leaves what can
wait (the shared containers growing back after a release, the shared grants' turn at liveness)
until the hook has its answer. Both live in one :class:`WarmState`, made by the child and given
to every :class:`~numa_pin.service.node.NodeService` it builds (``warm_state``); a service without one
(a hook in its own process, the CLI, the NRI plugin) is *cold*: it checks every path, opens
every file by path and does everything before it returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from numa_pin.enforcer.cgroups import close_handles
from numa_pin.ledger.liveness import BootTimes
from numa_pin.ledger.reader import ReadCache

if TYPE_CHECKING:
    from collections.abc import Callable

    from numa_pin.enforcer.cgroups import CgroupRef
    from numa_pin.ledger.model import Grant


class WarmState:
    """The caches an agent child's rehearsal warmed and the work its request left for after the
    reply. Only speed rides on the caches: a cold one (every field None) changes no outcome."""

    def __init__(self) -> None:
        #: the shared containers' cgroups as checked in this process, by cgroup root, then recorded
        #: path (None: not warmed, every call checks every path)
        self.refs: dict[str, dict[str, CgroupRef]] | None = None
        #: the shared containers' cgroups that had no cgroup below them when the rehearsal looked
        #: (:func:`~numa_pin.enforcer.pool.resize_shared`'s ``leaves``)
        self.leaves: frozenset[str] | None = None
        #: those leaves' ``cpuset.cpus`` held open for writing, by path
        #: (:func:`~numa_pin.enforcer.pool.resize_shared`'s ``handles``)
        self.handles: dict[str, tuple[int, bool]] | None = None
        #: the shared grants the CPU resource last listed cgroups for (held, so compared by
        #: identity), its cgroup root and its answer
        self.last: tuple[tuple[Grant, ...], str, tuple[tuple[str, CgroupRef], ...]] | None = None
        #: what admissions and releases left until the hook has its answer (None: nothing waits)
        self.deferred: list[Callable[[], None]] | None = None
        #: the ledger files the rehearsal read, kept open for the services' ledgers
        #: (:class:`~numa_pin.ledger.reader.ReadCache`): an unchanged ledger is not read again
        self.ledger = ReadCache()
        #: the proc root's boot time as the rehearsal's liveness checks read it (at most once a second)
        self.boot_times = BootTimes()

    def forget(self) -> None:
        """Close the held cgroup descriptors and forget the cgroup caches (cold again); deferred
        work stays, and so do :attr:`ledger`, which checks itself at every read, and
        :attr:`boot_times`, which reads again after a second."""
        close_handles(self.handles)
        self.refs, self.leaves, self.handles, self.last = None, None, None, None

    def defer(self) -> None:
        """From now on the services given this state leave what can wait to :meth:`settle`."""
        self.deferred = []

    def after_reply(self, work: Callable[[], None]) -> None:
        """Leave ``work`` to :meth:`settle` (once) while this state defers; else nothing."""
        if self.deferred is not None and work not in self.deferred:
            self.deferred.append(work)

    def settle(self) -> None:
        """Run what was left (in the order it was left); nothing waits afterwards."""
        pending, self.deferred = self.deferred or [], None
        for work in pending:
            work()


__all__ = ["WarmState"]
