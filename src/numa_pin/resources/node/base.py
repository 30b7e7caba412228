"""The seam every resource implements: its I/O half, and the node it works on.

:class:`NodeResource` adds to the pure :class:`~numa_pin.resources.base.Resource` what numa-pin
does after the decision, on one node:

=====================================  =====================================================
``enforce(node, admission, decided)``  make the grant true on the machine; every write is
                                       recorded in ``admission.undo`` right after it succeeds;
                                       returns the admission, updated with any undo record of
                                       its own that the grant keeps
``collect(node, before, after, gone)`` grants whose container died went out of the ledger:
                                       give back what outlives a container (a pod's VFs)
``release(node, release)``             grants that go (a release, or found dead there):
                                       take back what they hold, undoably (``release.undo``)
``give_back(node, release)``           what cannot be undone (devices going home): once the
                                       ledger no longer records the grants (after the commit)
``repair(node, state, undo)``          re-assert what drifted (``reconcile``); the ids of the
                                       containers it repaired
``conflicts(node, state)``             grants the current config contradicts (one line each)
``status(node, state)``                what ``numa-pin status`` shows of this resource
``runtime(node, ask)``                 what the runtime must apply for a grant on a path
                                       where the runtime applies it (podman's precreate, NRI):
                                       a :class:`~numa_pin.resources.node.runtime.RuntimeEdit`
``applied(grant, edit)``               the grant, noting what the runtime now applies itself
                                       (so no later stage does it again)
=====================================  =====================================================

Problems that must not stop the work (a VF that could not go home) are returned as lines,
which the service logs; an :class:`~numa_pin.errors.EnforcementError` stops it and the
service rolls back the undo log. :class:`Node` is what the resources get to work with: the
config's roots, the topology and the cgroup layout, read once per node service, and the
agent child's :class:`~numa_pin.resources.node.warm.WarmState` where there is one.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from numa_pin.base.record import record, replace
from numa_pin.config.schema import Config
from numa_pin.enforcer import cgroups as cg
from numa_pin.enforcer.mounts import CgroupLayout, detect_layout
from numa_pin.enforcer.systemd import Systemd
from numa_pin.enforcer.systemd import detect as detect_systemd
from numa_pin.enforcer.undo import UndoLog
from numa_pin.ledger.derived import of_earlier_boot
from numa_pin.ledger.liveness import BootTimes, is_alive, pending_abandoned, pending_age, read_boot_id
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.resources.base import NodeSettings, Resource
from numa_pin.topology.cache import DEFAULT_MAX_AGE_S, cached_discover
from numa_pin.topology.model import Topology

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from typing import Any

    from numa_pin.resources.node.runtime import RuntimeAsk, RuntimeEdit
    from numa_pin.resources.node.warm import WarmState

#: how long a grant made before its container exists (podman precreate: no pid yet, the cgroup
#: named in the config not created yet) counts as alive without its cgroup
PENDING_GRACE_S = 120.0
#: how long after precreate an expected cgroup that exists but holds no process shows the
#: runtime gave the container up (:func:`~numa_pin.ledger.liveness.pending_abandoned`)
PENDING_SETTLE_S = 5.0


class Node:
    """One node's facts, rooted at the config's sysfs, proc, cgroup and state roots; each is
    read once, when first needed."""

    def __init__(self, config: Config, cache_dir: str | None, *, topology_max_age: float = DEFAULT_MAX_AGE_S,
                 make_settings: Callable[[Config], NodeSettings], warm_state: WarmState | None = None) -> None:
        self.config = config
        #: what the agent's child keeps for the request it serves (None: cold, a hook or the CLI)
        self.warm_state = warm_state
        self._make_settings = make_settings
        self.cache_dir = cache_dir
        #: a cached topology older than this many seconds is discovered again
        self.topology_max_age = topology_max_age
        self._topology: Topology | None = None
        self._settings: NodeSettings | None = None
        self._cgroup_layout: CgroupLayout | None = None
        #: what a resource computes once per node (``memo``)
        self._memo: dict[str, Any] = {}
        self._systemd: tuple[Systemd | None] | None = None  # None: not looked for yet
        #: this boot (a grant of another one is dead, whatever its pid or cgroup say)
        self.boot_id = read_boot_id(config.proc_root)
        #: the proc root's boot time, read at most once a second by the liveness checks (the
        #: agent child's services share its warm state's)
        self.boot_times = BootTimes() if warm_state is None else warm_state.boot_times

    @property
    def topology(self) -> Topology:
        if self._topology is None:
            self._topology = cached_discover(self.config.sysfs_root, self.config.proc_root, self.cache_dir,
                                             max_age=self.topology_max_age)
        return self._topology

    @property
    def settings(self) -> NodeSettings:
        """The decision's settings, with every registered resource."""
        if self._settings is None:
            self._settings = self._make_settings(self.config)
        return self._settings

    @property
    def resources(self) -> tuple[NodeResource, ...]:
        """The registered resources, in the order they enforce (release goes the other way)."""
        return tuple(r for r in self.settings.resources if isinstance(r, NodeResource))

    def memo(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``, computed once per node under ``key``."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def _alive(self, grant: Grant) -> bool:
        """:func:`is_alive`, plus: a pid-less grant with an expected cgroup (made at precreate) is
        alive for :data:`PENDING_GRACE_S` before the runtime creates that cgroup. So a container
        the runtime never started (podman then runs no poststop) does not keep its grant, and
        one the runtime clearly gave up (:func:`pending_abandoned`: its root filesystem removed,
        or its cgroup made and emptied) is dead at once. A grant of an earlier boot is dead."""
        if of_earlier_boot(grant, self.boot_id):
            return False
        if is_alive(grant, self.config.proc_root, self.config.cgroup_root, boot_times=self.boot_times):
            return True
        return (grant.pid is None and grant.cgroup is not None and pending_age(grant) < PENDING_GRACE_S
                and not pending_abandoned(grant, self.config.cgroup_root, PENDING_SETTLE_S))

    def alive(self, grant: Grant) -> bool:
        return self._alive(grant)

    def running(self, grant: Grant) -> bool:
        """Whether the grant's process or cgroup is there now (no grace: what ``status`` shows
        as running; whether the grant lives is :meth:`alive`'s)."""
        return not of_earlier_boot(grant, self.boot_id) and is_alive(grant, self.config.proc_root,
                                                                       self.config.cgroup_root,
                                                                       boot_times=self.boot_times)

    def _layout(self) -> CgroupLayout:
        """How cgroups are mounted (read once per node from mountinfo)."""
        if self._cgroup_layout is None:
            self._cgroup_layout = detect_layout(self.config.proc_root)
        return self._cgroup_layout

    def layout(self) -> CgroupLayout:
        return self._layout()

    def systemd(self) -> Systemd | None:
        """systemd, when it is init under the proc root: units it owns get their cpusets through it."""
        if self._systemd is None:
            self._systemd = (detect_systemd(self.config.proc_root),)
        return self._systemd[0]

    def cgroup_ref(self, grant: Grant) -> cg.CgroupRef | None:
        """The cgroup recorded for ``grant`` (None: it has none)."""
        if not grant.cgroup:
            return None
        return cg.ref_from_path(grant.cgroup, self.config.cgroup_root, self._layout())

    def escaped(self, grant: Grant, why: str) -> None:
        """``grant``'s recorded cgroup was found to leave the cgroup root (``why``): nothing is
        written to it (a service sets the grant aside)."""

    def live_cgroup_ref(self, grant: Grant) -> cg.CgroupRef | None:
        """:meth:`cgroup_ref` while that cgroup exists (None: none recorded, or gone)."""
        ref = self.cgroup_ref(grant)
        return ref if ref is not None and os.path.isdir(ref.cpuset_dir) else None


@record
class Admission:
    """One admission's enforcement: the grant and the ledger as they will be committed, where
    every write's undo goes, and the facts of the container. A resource that keeps an undo
    record of its own returns an :meth:`updated` copy from :meth:`NodeResource.enforce`."""

    grant: Grant
    state: LedgerState
    undo: UndoLog
    ref: cg.CgroupRef | None  # the container's cgroup (None: no pid yet)
    pid: int | None
    rootfs: str | None  # the spec's ``root.path``: where device nodes go before pivot_root
    dropped: tuple[Grant, ...]  # grants this transaction found dead (their resources are free again)
    started: bool  # the container's process runs for the first time under this grant
    before: LedgerState | None = None  # the ledger as the transaction read it (None: not known)
    real_dirs: dict[str, str] | None = None  # a batch's memo of real paths (cgroups.realpath)

    def devices_pending(self, decided: Grant) -> bool:
        """Whether the devices of ``decided`` (the grant before any resource enforced it) still
        need their I/O: the container's first start with a pid, and no VF recorded as moved
        already (by numa-pin, or by the runtime at precreate)."""
        return self.started and bool(decided.devices) and not decided.netdevs

    def updated(self, **fields: Any) -> Admission:
        """A copy whose grant (and ledger with it) has ``fields`` changed."""
        grant = replace(self.grant, **fields)
        return replace(self, grant=grant, state=self.state.with_grant(grant))


@record
class Release:
    """Grants that go in one transaction: ``grant`` released by hand (None: none), ``gone`` it
    and every grant found dead there; ``before`` and ``after`` are the ledger around it."""

    before: LedgerState
    after: LedgerState
    grant: Grant | None
    gone: tuple[Grant, ...]
    undo: UndoLog
    #: what can wait is left for :meth:`NodeResource.settle`, after the hook has its answer
    later: bool = False


class NodeResource(Resource):
    """A resource with its I/O half (see the module's table); every method defaults to nothing."""

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        """``decided``: the grant as the decision made it, before any resource enforced it."""
        return admission

    def collect(self, node: Node, before: LedgerState, after: LedgerState, gone: tuple[Grant, ...]) -> list[str]:
        return []

    def release(self, node: Node, release: Release) -> list[str]:
        return []

    def give_back(self, node: Node, release: Release) -> list[str]:
        return []

    def settle(self, node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
        """Do what a release with ``later`` left (under the lock, ``state`` as it is now)."""
        return []

    def repair(self, node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
        return []

    def conflicts(self, node: Node, state: LedgerState) -> list[str]:
        return []

    def status(self, node: Node, state: LedgerState) -> dict[str, Any]:
        return {}

    def runtime(self, node: Node, ask: RuntimeAsk) -> RuntimeEdit | None:
        """What the runtime on ``ask.target`` must apply of ``ask.grant`` (None: nothing)."""
        return None

    def applied(self, grant: Grant, edit: RuntimeEdit) -> Grant:
        """``grant`` noting what of ``edit`` the runtime applies itself (the ledger keeps it)."""
        return grant


__all__ = ["PENDING_GRACE_S", "PENDING_SETTLE_S", "Admission", "Node", "NodeResource", "Release"]
