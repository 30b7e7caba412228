"""Isolation knobs that are one setting file each: quota, C-states, cpufreq governor (I/O half).

Each knob is a :class:`SettingKnob`: for every live grant that asks it (its
:class:`~numa_pin.requests.isolation.IsolationRequest`, kept in ``Grant.isolation``) it wants
some files to hold some values (:meth:`SettingKnob.targets`). What the ledger's grants want is
the whole truth; nothing else is counted:

* enforce: the grant's targets are written; before a file is first changed its original goes
  into the saved settings (:class:`~numa_pin.enforcer.saved.Saved`, durable, beside the
  ledger), and every write is in the admission's undo log, so a later failure puts it back. A
  target another live grant wants with a different value (two governors for one cpufreq
  policy) refuses the admission with one line, as does a node without the knob (no cpufreq, no
  PM QoS file, no quota file): nothing is half-applied;
* resize: the settings follow the CPUs in the same transaction: those of CPUs the grant gives
  back are restored (as on release), those of CPUs it takes are written, each with its undo;
* release: every saved setting of the knob that no live grant wants any more gets its original
  back and leaves the saved settings. A setting several grants share (a cpufreq policy over
  several CPUs, a pod's quota) is thus reference-counted by the ledger itself: it goes back
  when the last grant that wants it goes;
* repair (``reconcile``): the same clean-up (after a crash, the saved settings of grants that
  never committed or are gone), then every wanted value written again where it drifted.

The knobs: CFS quota off (``cpu.max`` ``max <period>`` on v2, ``cpu.cfs_quota_us`` ``-1`` on
v1, for the container's cgroup, the cgroups below it down to its process's, and a Kubernetes
pod's cgroup above it), the CPU's resume latency limit (``power/pm_qos_resume_latency_us``, as
CRI-O writes it) and the cpufreq governor of every
policy holding one of the grant's CPUs (``scaling_governor``, checked against
``scaling_available_governors``).
"""

from __future__ import annotations

import os

from numa_pin.base.cpuset import parse_list
from numa_pin.enforcer import cgroups as cg
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError, IsolationError
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.requests.isolation import of_grant
from numa_pin.resources.node.base import Admission, Node, NodeResource, Release

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from numa_pin.enforcer.saved import Saved
    from numa_pin.resources.node.runtime import RuntimeAsk, RuntimeEdit

#: bytes read of one setting file
MAX_VALUE = 4096


def read_setting(path: str) -> str:
    """The value of a sysfs or cgroup setting file (stripped). Raises EnforcementError naming it."""
    return cg.read_cgroup_file(path)[:MAX_VALUE]


def saved_settings(node: Node) -> Saved:
    from numa_pin.enforcer.saved import Saved

    return Saved(node.config.state_dir)


class SettingKnob(NodeResource):
    """One isolation knob whose targets are setting files (see the module's docstring)."""

    #: the :class:`IsolationRequest` field this knob reads
    knob = ""
    #: what a node lacking it is told (``targets`` raises with it)
    what = ""

    def asks(self, grant: Grant) -> bool:
        return bool(grant.cpus) and getattr(of_grant(grant), self.knob) is not None

    def targets(self, node: Node, grant: Grant) -> dict[str, str]:
        """``{file: value}`` the grant wants (each knob names its files; none here). Raises
        EnforcementError when the node lacks the knob."""
        return {}

    def same(self, current: str, value: str) -> bool:
        return current == value

    def wanted(self, node: Node, state: LedgerState, skip: str | None = None) -> dict[str, tuple[str, str]]:
        """``{file: (value, container id)}`` every live grant asking the knob wants (``skip`` left
        out); a grant whose targets cannot be found now (its cgroup gone) wants nothing."""
        out: dict[str, tuple[str, str]] = {}
        for cid, grant in sorted(state.grants.items()):
            if cid == skip or not self.asks(grant):
                continue
            try:
                targets = self.targets(node, grant)
            except EnforcementError:
                continue
            for path, value in targets.items():
                out.setdefault(path, (value, cid))
        return out

    def _apply(self, saved: Saved, path: str, value: str, undo: UndoLog, boot_id: str | None = None) -> bool:
        """Make ``path`` hold ``value``, the original saved first; True when something was written."""
        current = read_setting(path)
        if self.same(current, value):
            return False
        if saved.original(path, boot_id) is None:  # none yet, or an earlier boot's: this boot's value
            saved.save(path, {"knob": self.knob, "value": current, "boot": boot_id}, undo)
        cg.write_cgroup_file(path, value)
        undo.record(f"{path}: {value} (was {current})", lambda: cg.write_cgroup_file(path, current))
        return True

    def check(self, node: Node, admission: Admission) -> dict[str, str]:
        """The grant's targets, refused (IsolationError, one line) when the node lacks the knob
        or another live grant holds a shared one at another value; writes nothing."""
        grant = admission.grant
        if not self.asks(grant) or (admission.ref is None and self.needs_cgroup):
            return {}
        mine = self.targets(node, grant)
        others = self.wanted(node, admission.state, skip=grant.container_id)
        for path, value in sorted(mine.items()):
            theirs = others.get(path)
            if theirs is not None and not self.same(theirs[0], value):
                raise IsolationError(f"{grant.container_id} asks {self.knob.replace('_', '-')} {value!r} but "
                                     f"{theirs[1]} holds it at {theirs[0]!r} (a setting they share)", path=path)
        return mine

    def resized(self, admission: Admission) -> bool:
        """Whether ``admission`` changes the CPUs (or isolation) of a live grant that asks the knob
        (a resize): what the old form alone wanted goes back in the same transaction."""
        before = admission.before
        old = before.grants.get(admission.grant.container_id) if before is not None else None
        return (old is not None and self.asks(old)
                and (old.cpus, old.isolation) != (admission.grant.cpus, admission.grant.isolation))

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        # release --force or a resize: the settings of CPUs the grant no longer holds go back first
        if any(self.asks(g) for g in admission.dropped) or self.resized(admission):
            for problem in self._clean(node, admission.state, admission.undo):
                raise EnforcementError(problem)
        mine = self.check(node, admission)
        if not mine:
            return admission
        saved = saved_settings(node)
        for path, value in sorted(mine.items()):
            self._apply(saved, path, value, admission.undo, node.boot_id)
        return admission

    #: targets live in the container's cgroup (nothing to do before it has a pid)
    needs_cgroup = False

    def _clean(self, node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
        """Put back every saved setting of the knob no live grant wants; the lines of what could not."""
        saved = saved_settings(node)
        entries = saved.of_knob(self.knob)
        if not entries:
            return []
        from numa_pin.enforcer.saved import of_earlier_boot

        wanted = self.wanted(node, state)
        problems: list[str] = []
        for path, entry in sorted(entries.items()):
            if path in wanted:
                continue
            if of_earlier_boot(entry, node.boot_id):  # that boot's settings went with it: not written back
                saved.forget(path, undo)
                continue
            try:
                if os.path.exists(path):  # gone with its container (a cgroup) or a CPU: nothing to restore
                    original = str(entry.get("value", ""))
                    current = read_setting(path)
                    if not self.same(current, original):
                        cg.write_cgroup_file(path, original)
                        undo.record(f"{path}: {original} (was {current})", _writer(path, current))
                saved.forget(path, undo)
            except EnforcementError as exc:  # kept saved: the next reconcile tries again
                problems.append(f"{self.knob.replace('_', '-')} not restored: {exc}")
        return problems

    def release(self, node: Node, release: Release) -> list[str]:
        if not any(self.asks(g) for g in release.gone):
            return []
        return self._clean(node, release.after, release.undo)

    def collect(self, node: Node, before: LedgerState, after: LedgerState, gone: tuple[Grant, ...]) -> list[str]:
        """Grants found dead: what they alone wanted goes back (again harmlessly after a crash)."""
        if not any(self.asks(g) for g in gone):
            return []
        return self._clean(node, after, UndoLog())

    def repair(self, node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
        for problem in self._clean(node, state, undo):
            from numa_pin.reporting import report

            report.log_syslog(f"numa-pin: {problem}")
        saved = saved_settings(node)
        repaired: list[str] = []
        for path, (value, cid) in sorted(self.wanted(node, state).items()):
            if self._apply(saved, path, value, undo, node.boot_id) and cid not in repaired:
                repaired.append(cid)
        return repaired

    def preview(self, node: Node, state: LedgerState, grant: Grant, applied: bool) -> str | None:
        """One line for ``plan`` (``applied`` False: what it would do) and ``explain`` (what holds
        now); None when the grant does not ask this knob."""
        if not self.asks(grant):
            return None
        if self.needs_cgroup and not grant.cgroup:
            return "at the container's start (its cgroup)"
        try:
            targets = self.targets(node, grant)
        except EnforcementError as exc:
            return f"cannot: {exc}"
        others = self.wanted(node, state, skip=grant.container_id)
        clash = [f"{p} held at {others[p][0]!r} by {others[p][1]}" for p, v in sorted(targets.items())
                 if p in others and not self.same(others[p][0], v)]
        if clash:
            return "cannot: " + "; ".join(clash)
        if not applied:
            return f"sets {', '.join(f'{p}={v}' for p, v in sorted(targets.items()))}"
        drifted = []
        for path, value in sorted(targets.items()):
            try:
                current = read_setting(path)
            except EnforcementError:
                current = "(unreadable)"
            if not self.same(current, value):
                drifted.append(f"{path}={current} (wants {value})")
        return "drifted (reconcile repairs it): " + "; ".join(drifted) if drifted else f"held ({len(targets)} settings)"

    def describe(self, grant: Grant) -> list[str]:
        value = getattr(of_grant(grant), self.knob) if grant.cpus else None
        return [] if value is None else [f"{self.knob.replace('_', '-')}={value}"]


def _writer(path: str, text: str) -> Callable[[], None]:
    return lambda: cg.write_cgroup_file(path, text)


def _cpu_dir(node: Node, cpu: int) -> str:
    return os.path.join(node.config.sysfs_root, "devices", "system", "cpu", f"cpu{cpu}")


class CStatesNode(SettingKnob):
    """``cpu-c-states``: each exclusive CPU's ``power/pm_qos_resume_latency_us``."""

    name = "isolation.c-states"
    knob = "c_states"

    def targets(self, node: Node, grant: Grant) -> dict[str, str]:
        value = of_grant(grant).latency_us
        assert value is not None
        out = {}
        for cpu in sorted(grant.cpus):
            path = os.path.join(_cpu_dir(node, cpu), "power", "pm_qos_resume_latency_us")
            if not os.path.isfile(path):
                raise IsolationError(f"this node has no PM QoS resume latency for CPU {cpu} "
                                     "(cpu-c-states cannot be honoured)", path=path)
            out[path] = value
        return out


def cpufreq_policies(node: Node) -> dict[str, frozenset[int]]:
    """``{policy directory: its CPUs}`` (``related_cpus``, else ``affected_cpus``); none without cpufreq."""
    def compute() -> dict[str, frozenset[int]]:
        base = os.path.join(node.config.sysfs_root, "devices", "system", "cpu", "cpufreq")
        out: dict[str, frozenset[int]] = {}
        for d in cg.child_dirs(base):
            if not os.path.basename(d).startswith("policy"):
                continue
            for name in ("related_cpus", "affected_cpus"):
                try:
                    out[d] = parse_list(",".join(read_setting(os.path.join(d, name)).split()))
                    break
                except (EnforcementError, ValueError):
                    continue
        return out

    policies: dict[str, frozenset[int]] = node.memo("isolation.cpufreq", compute)
    return policies


class GovernorNode(SettingKnob):
    """``cpu-freq-governor``: the ``scaling_governor`` of every cpufreq policy holding one of the
    grant's CPUs. A policy over several CPUs is one setting for all of them: every grant on it
    must ask the same governor, and it goes back when the last of them goes."""

    name = "isolation.governor"
    knob = "governor"

    def targets(self, node: Node, grant: Grant) -> dict[str, str]:
        governor = of_grant(grant).governor
        assert governor is not None
        policies = cpufreq_policies(node)
        out: dict[str, str] = {}
        for cpu in sorted(grant.cpus):
            policy = next((d for d, cpus in sorted(policies.items()) if cpu in cpus), None)
            if policy is None:
                raise IsolationError(f"CPU {cpu} has no cpufreq policy (cpu-freq-governor cannot be honoured)",
                                     path=os.path.join(node.config.sysfs_root, "devices", "system", "cpu",
                                                       "cpufreq"))
            available = os.path.join(policy, "scaling_available_governors")
            if os.path.isfile(available) and governor not in read_setting(available).split():
                raise IsolationError(f"governor {governor!r} is not available for CPU {cpu} "
                                     f"(available: {read_setting(available)})", path=available)
            out[os.path.join(policy, "scaling_governor")] = governor
        return out


class QuotaNode(SettingKnob):
    """``cpu-quota``: no CFS quota on the container's cgroup, on every cgroup below it down to the
    one its process runs in (crun's ``<scope>/container`` holds the process and the spec's quota),
    and on the pod's cgroup above it for a Kubernetes pod (kubelet's pod cgroup carries the pod's
    limit too)."""

    name = "isolation.quota"
    knob = "quota"
    needs_cgroup = True

    def runtime(self, node: Node, ask: RuntimeAsk) -> RuntimeEdit | None:
        """Where the runtime applies the grant, no quota in its config either (-1), at creation
        and in every update, so the runtime never writes one back."""
        if not self.asks(ask.grant):
            return None
        from numa_pin.resources.node.runtime import RuntimeEdit

        return RuntimeEdit(cpu_quota=-1)

    def targets(self, node: Node, grant: Grant) -> dict[str, str]:
        if not grant.cgroup:
            raise IsolationError(f"{grant.container_id} has no cgroup (cpu-quota cannot be honoured)")
        where = node.layout().hierarchy_subdir("cpu")
        if where is None:
            raise IsolationError("no cgroup hierarchy carries the cpu controller (cpu-quota cannot be honoured)")
        version, subdir = where
        own = cg.hierarchy_dir(grant.cgroup, node.config.cgroup_root, subdir)
        if not os.path.isdir(own):
            raise EnforcementError("the container's cgroup is gone", path=own)
        dirs = [own, *_nested(node, grant, grant.cgroup, (version, subdir), own)]
        parent_rel = os.path.dirname(grant.cgroup.rstrip("/"))
        if "kubepods" in parent_rel and "pod" in os.path.basename(parent_rel).replace("kubepods", ""):
            dirs.insert(0, cg.hierarchy_dir(parent_rel, node.config.cgroup_root, subdir))
        out = {}
        for d in dirs:
            if version == 2:
                path = os.path.join(d, "cpu.max")
                if not os.path.isfile(path):
                    raise IsolationError("no cpu.max (the cpu controller is not enabled here; cpu-quota "
                                         "cannot be honoured)", path=d)
                out[path] = "max " + (read_setting(path).split() + ["100000"])[1]
            else:
                path = os.path.join(d, "cpu.cfs_quota_us")
                if not os.path.isfile(path):
                    raise IsolationError("no cpu.cfs_quota_us (cpu-quota cannot be honoured)", path=d)
                out[path] = "-1"
        return out


def _nested(node: Node, grant: Grant, top: str, where: tuple[int, str], own: str) -> list[str]:
    """The cgroup directories below the grant's own that hold its process: from its cgroup down
    to the one ``<proc_root>/<pid>/cgroup`` names, and a runtime's sub-cgroup (crun's
    ``container``) when the grant has no readable pid; none when the process sits in its own."""
    from numa_pin.enforcer.proccgroup import path_below, process_cgroup

    version, subdir = where
    at = None
    if grant.pid is not None:
        try:
            mount_root = node.layout().mount_root(version, "cpu")
            at = process_cgroup(grant.pid, node.config.proc_root, version, "cpu", mount_root)
        except EnforcementError:  # gone (its release follows) or not on this hierarchy
            pass
    if at is not None:
        rels = path_below(top, at)
    else:
        rels = [top.rstrip("/") + "/" + name for name in cg.RUNTIME_SUBGROUPS
                if os.path.isdir(os.path.join(own, name))]
    return [d for d in (cg.hierarchy_dir(rel, node.config.cgroup_root, subdir) for rel in rels) if os.path.isdir(d)]


def preview(node: Node, state: LedgerState, grant: Grant, applied: bool) -> dict[str, str]:
    """``{knob word: line}`` of every resource that can say what it isolates for ``grant``
    (a ``preview`` method: these knobs, the host services, the CPUs of a mixed container, and any
    other isolation resource; keyed by its ``preview_word``, else its name)."""
    out: dict[str, str] = {}
    for resource in node.resources:
        say = getattr(resource, "preview", None)
        if say is not None:
            line = say(node, state, grant, applied)
            if line is not None:
                out[getattr(resource, "preview_word", "") or resource.name.removeprefix("isolation.")] = line
    return out


def preflight(node: Node, admission: Admission) -> None:
    """Every setting knob's :meth:`SettingKnob.check` and the host services' check, before any
    resource writes (a container the node cannot isolate is refused before its cpuset is
    touched: on cgroup v2 a populated cgroup's cpuset cannot always be emptied again)."""
    from numa_pin.resources.node import host

    for resource in node.resources:
        if isinstance(resource, SettingKnob):
            resource.check(node, admission)
    host.preflight(node, admission)


class SettingsPreflight(NodeResource):
    """The first registered resource: :func:`preflight`; writes nothing."""

    name = "isolation-settings-preflight"

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        if admission.grant.isolation and admission.grant.cpus:
            preflight(node, admission)
        return admission


class IsolationStatus(NodeResource):
    """What ``status`` shows of isolation: the kernel's isolated CPUs and the saved originals."""

    name = "isolation"

    def status(self, node: Node, state: LedgerState) -> dict[str, Any]:
        from numa_pin.base.cpuset import format_list
        from numa_pin.topology.isolated import isolated_cpus

        isolated, nohz_full = isolated_cpus(node.config.sysfs_root)
        by_knob: dict[str, list[str]] = {}
        try:
            saved = saved_settings(node).entries()
        except EnforcementError as exc:
            saved, by_knob = {}, {"error": [str(exc)]}
        for path, entry in sorted(saved.items()):
            by_knob.setdefault(str(entry.get("knob")), []).append(f"{path} (was {entry.get('value')!s})")
        return {"isolated_cpus": format_list(isolated), "nohz_full": format_list(nohz_full),
                "isolated_cpus_mode": node.config.isolation.isolated_cpus, "isolation_saved": by_knob}


__all__ = ["CStatesNode", "GovernorNode", "IsolationStatus", "QuotaNode", "SettingKnob", "SettingsPreflight",
           "cpufreq_policies", "preflight", "preview", "read_setting"]
