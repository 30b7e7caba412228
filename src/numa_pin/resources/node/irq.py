"""Device interrupts off exclusive CPUs on the machine: the I/O half of the IRQ knob.

Every movable IRQ's affinity (``<proc>/irq/<n>/smp_affinity_list``) and the affinity new IRQs
get (``<proc>/irq/default_smp_affinity``, a hex mask) are a function of the live grants (see
:mod:`numa_pin.resources.irq`): its *baseline* minus :func:`~numa_pin.resources.irq.banned_cpus`
of the grants the ledger holds. So:

* enforce (a grant that asks, or dropped grants that asked) and release (grants that asked
  go) recompute and write every IRQ whose affinity differs; each write goes into the undo log
  after it succeeds;
* the baselines are taken, before the first write, when no grant asked yet, and kept in the
  node's IRQ and partition journal (:mod:`numa_pin.resources.node.journal`); when no live grant asks any
  more every IRQ gets its baseline back and the journal forgets them;
* ``reconcile`` does the same against the ledger: it re-asserts an affinity an outside writer
  changed, and after a crash (the journal holds baselines, the ledger no grant that asks) it
  puts the baselines back;
* IRQs the kernel refuses to move (``EIO``, or ``EPERM`` on newer kernels, for per-CPU and
  kernel-managed IRQs; ``EINVAL``) are no failure: they are kept in the journal and shown by ``explain`` and ``status``;
* a running irqbalance is told the banned CPUs (:mod:`numa_pin.resources.node.irqbalance`);
  when it cannot be told, the container is rejected before any IRQ is written.
"""

from __future__ import annotations

import errno
import os

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.errors import EnforcementError, IsolationError
from numa_pin.resources.irq import (
    IrqResource,
    banned_cpus,
    format_mask,
    irq_key,
    irq_mode,
    mask_digits,
    parse_mask,
    target_affinity,
)
from numa_pin.resources.node.base import Admission, Node, NodeResource, Release

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from numa_pin.config.schema import Config
    from numa_pin.enforcer.undo import UndoLog
    from numa_pin.ledger.model import Grant, LedgerState

AFFINITY = "smp_affinity_list"
DEFAULT = "default_smp_affinity"
#: the errors with which the kernel refuses to move an IRQ (managed, per-CPU, chip limits):
#: Linux 6.1 answers EIO for the timer's IRQ 0 where 6.12 answers EPERM (seen in the NRI guests)
UNMOVABLE = (errno.EIO, errno.EINVAL, errno.EPERM)
#: the most IRQs looked at (a large machine has a few thousand)
MAX_IRQS = 1 << 16


def irq_dir(node: Node) -> str:
    return os.path.join(node.config.proc_root, "irq")


def list_irqs(proc_irq: str) -> list[str]:
    """The IRQ numbers that have an affinity file, ascending."""
    try:
        names = [n for n in os.listdir(proc_irq) if n.isdigit()][:MAX_IRQS]
    except FileNotFoundError:
        return []
    return [n for n in sorted(names, key=int) if os.path.isfile(os.path.join(proc_irq, n, AFFINITY))]


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("ascii", "replace").strip()
    except OSError as exc:
        raise EnforcementError(f"cannot read: {exc.strerror or exc}", path=path) from exc


def _write(path: str, text: str) -> None:
    """One ``write(2)``; OSError reaches the caller (EIO/EINVAL: the kernel will not move it)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, (text + "\n").encode("ascii"))
    finally:
        os.close(fd)


def read_affinities(proc_irq: str) -> tuple[dict[str, frozenset[int]], int]:
    """``{irq: affinity}`` of every IRQ, plus ``"default"``: the default affinity; and how many
    hex digits the kernel prints the default mask with."""
    out: dict[str, frozenset[int]] = {}
    for irq in list_irqs(proc_irq):
        try:
            out[irq] = parse_list(_read(os.path.join(proc_irq, irq, AFFINITY)))
        except (EnforcementError, ValueError):
            continue  # gone meanwhile, or nothing we can parse: not ours to move
    digits = 8
    default = os.path.join(proc_irq, DEFAULT)
    if os.path.isfile(default):
        text = _read(default)
        out["default"], digits = parse_mask(text), mask_digits(text)
    return out, digits


def apply(node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
    """Make every IRQ's affinity what the live grants of ``state`` ask. Returns the IRQs it
    wrote. Raises EnforcementError (before any IRQ write) when irqbalance cannot be told."""
    from numa_pin.resources.node import journal

    cfg, topo = node.config, node.topology
    banned = banned_cpus(state.grants.values(), topo)
    doc = journal.read(cfg.state_dir, node.boot_id)
    old: dict[str, Any] = dict(doc.get("irq") or {})
    if not banned and not old:
        return []
    proc_irq = irq_dir(node)
    now, digits = read_affinities(proc_irq)
    base = {k: parse_list(v) for k, v in (old.get("base") or {}).items()}
    if banned:  # an IRQ seen for the first time (or new since) has its own affinity as baseline
        base.update({k: v for k, v in now.items() if k not in base})
    record: dict[str, Any] = {}
    balance = _tell_irqbalance(node, banned, old)  # first: a refusal leaves nothing written
    if banned:
        record = {"base": {k: format_list(v) for k, v in sorted(base.items())}, **balance,
                  "unmovable": old.get("unmovable") or {}}
    # the journal before any IRQ write: a crash after one leaves the baselines to put back
    _journal(node, doc, old, record, undo)
    unmovable: dict[str, str] = {}
    written: list[str] = []
    for irq, current in sorted(now.items()):
        want = target_affinity(base.get(irq, current), banned, topo.cpu_ids)
        if want == current:
            continue
        default = irq == "default"
        path = os.path.join(proc_irq, DEFAULT) if default else os.path.join(proc_irq, irq, AFFINITY)
        text, back = ((format_mask(want, digits), format_mask(current, digits)) if default
                      else (format_list(want), format_list(current)))
        try:
            _write(path, text)
        except OSError as exc:
            if exc.errno in UNMOVABLE:
                unmovable[irq] = f"{exc.strerror or exc}"
                continue
            if exc.errno == errno.ENOENT:
                continue  # the IRQ went away meanwhile
            raise EnforcementError(f"writing {text!r} failed: {exc.strerror or exc}", path=path) from exc
        undo.record(f"IRQ {irq} affinity {back}", _writer(path, back))
        written.append(irq)
    if record:
        _journal(node, journal.read(cfg.state_dir, node.boot_id), record, {**record, "unmovable": unmovable}, undo)
    return written


def _writer(path: str, text: str) -> Callable[[], None]:
    return lambda: _write(path, text)


def _journal(node: Node, doc: dict[str, Any], old: dict[str, Any], new: dict[str, Any], undo: UndoLog) -> None:
    """The journal's ``irq`` record becomes ``new`` (written only when it changes)."""
    from numa_pin.resources.node import journal

    if new != old:
        journal.write(node.config.state_dir, node.boot_id, {**doc, "irq": new}, undo)


def _tell_irqbalance(node: Node, banned: frozenset[int], record: dict[str, Any]) -> dict[str, Any]:
    """Tell a running irqbalance to keep IRQs off ``banned`` (nothing: back to its own rules).
    Returns what the journal keeps of it. Raises IsolationError when it cannot be told."""
    from numa_pin.resources.node import irqbalance

    told = record.get("irqbalance")
    found = irqbalance.find(node.config.proc_root)
    if found is None:
        return {}
    if found.env_banned is not None and banned <= found.env_banned and not told:
        return {}
    if found.socket is None:
        if banned:
            raise IsolationError(irqbalance.unreachable_message(found, banned))
        return {}
    if not banned:
        irqbalance.ban(found.socket, None)
        return {}
    own = parse_list(told["own"]) if told and told.get("pid") == found.pid else irqbalance.banned_now(found.socket)
    want = own | banned
    if not (told and told.get("pid") == found.pid and told.get("sent") == format_list(want)):
        irqbalance.ban(found.socket, want)
    return {"irqbalance": {"pid": found.pid, "own": format_list(own), "sent": format_list(want)}}


def preflight(node: Node, admission: Admission) -> None:
    """Refuse, before any resource writes, a grant that asks while a running irqbalance can be
    neither left alone (its environment bans the CPUs) nor told (its socket)."""
    if irq_mode(admission.grant) is None:
        return
    from numa_pin.resources.node import irqbalance

    found = irqbalance.find(node.config.proc_root)
    banned = banned_cpus(admission.state.grants.values(), node.topology)
    if found is not None and found.socket is None and not (found.env_banned is not None
                                                            and banned <= found.env_banned):
        raise IsolationError(irqbalance.unreachable_message(found, banned))


def _asks(grants: tuple[Grant, ...] | list[Grant]) -> bool:
    return any(irq_mode(g) for g in grants)


class IrqNode(IrqResource, NodeResource):
    """The IRQ knob: enforce, release and repair all recompute from the ledger."""

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        if _asks([admission.grant]) or _asks(admission.dropped):
            apply(node, admission.state, admission.undo)
        return admission

    def release(self, node: Node, release: Release) -> list[str]:
        if _asks(release.gone):
            apply(node, release.after, release.undo)
        return []

    def collect(self, node: Node, before: LedgerState, after: LedgerState, gone: tuple[Grant, ...]) -> list[str]:
        """Grants found dead (or of an earlier boot): the IRQs they kept off their CPUs come back
        now, not at the next write; a journal of an earlier boot is dropped, never restored."""
        if not _asks(gone):
            return []
        from numa_pin.enforcer.undo import UndoLog
        from numa_pin.resources.node import journal

        try:
            journal.drop_earlier_boot(node.config.state_dir, node.boot_id)
            apply(node, after, UndoLog())
        except EnforcementError as exc:  # the next reconcile tries again
            return [f"IRQs not given back: {exc}"]
        return []

    def repair(self, node: Node, state: LedgerState, undo: UndoLog) -> list[str]:
        if not apply(node, state, undo):
            return []
        return sorted(g.container_id for g in state.grants.values() if irq_mode(g))

    def status(self, node: Node, state: LedgerState) -> dict[str, Any]:
        banned = banned_cpus(state.grants.values(), node.topology)
        if not banned:
            return {}
        return {"irq": {"kept_off_cpus": format_list(banned), "unmovable": sorted(unmovable(node), key=irq_key)}}


def unmovable(node: Node) -> dict[str, str]:
    """The IRQs the kernel refused to move at the last write, with its reason."""
    return _unmovable(node.config.state_dir, node.boot_id)


def _unmovable(state_dir: str, boot_id: str | None) -> dict[str, str]:
    from numa_pin.resources.node import journal

    doc = journal.read(state_dir, boot_id)
    return dict((doc.get("irq") or {}).get("unmovable") or {})


def explain(config: Config, grant: Grant) -> dict[str, Any]:
    """What ``numa-pin explain`` says of a grant's IRQs: what it asked, the CPUs kept free of
    IRQs, and the IRQs the kernel would not move off them (with its reason)."""
    mode = irq_mode(grant)
    if mode is None:
        return {}
    from numa_pin.ledger.liveness import read_boot_id

    stuck = _unmovable(config.state_dir, read_boot_id(config.proc_root))
    return {"irq": mode, "irq_unmovable": {k: stuck[k] for k in sorted(stuck, key=irq_key)}}


__all__ = [
    "AFFINITY", "DEFAULT", "IrqNode", "apply", "explain", "list_irqs", "preflight", "read_affinities", "unmovable",
]
