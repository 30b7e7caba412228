"""What the runtime applies for a grant, whatever path applies it (the records; no I/O).

Every resource answers a :class:`RuntimeAsk` with a :class:`RuntimeEdit`
(``NodeResource.runtime``); :func:`merge_edits` makes one edit of them, which the path's encoder
writes (:func:`numa_pin.hook.precreate.edit_spec`, :func:`numa_pin.nri.convert.fill_adjustment`).
They sit beside the I/O half of the seam because an edit carries device nodes
(:class:`~numa_pin.enforcer.devnodes.DeviceNode`).
"""

from __future__ import annotations

from numa_pin.base.record import field, record, replace

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from numa_pin.enforcer.devnodes import DeviceNode
    from numa_pin.ledger.model import Grant, LedgerState
    from numa_pin.requests.request import ContainerRequest
    from numa_pin.resources.runtime import RuntimeTarget


@record
class RuntimeAsk:
    """One question to the resources: what must the runtime on ``target`` apply for ``grant``?
    ``request``: the request it was admitted for (None: an update of a grant made earlier, which
    carries the cpuset only); ``state``: the ledger the grant lives in."""

    grant: Grant
    request: ContainerRequest | None
    target: RuntimeTarget
    state: LedgerState


@record
class RuntimeEdit:
    """What the runtime must apply for one grant: the cpuset (``cpus``, ``mems``; None: leave
    it), the CFS quota (``cpu_quota``: -1 for none; None: leave it), device nodes with their
    allow rules, environment variables, the memory policy (an OCI ``linux.memoryPolicy``
    object; ``policy_default``: only where the config has none), netdevs to move in (host
    name -> name in the container) and where the processes a runtime execs into the container
    run (``exec_cpus``: ``process.execCPUAffinity``'s ``final``; None: leave it)."""

    cpus: frozenset[int] | None = None
    mems: frozenset[int] | None = None
    cpu_quota: int | None = None
    devices: tuple[DeviceNode, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    memory_policy: Mapping[str, str] | None = None
    policy_default: bool = False
    net_devices: Mapping[str, str] = field(default_factory=dict)
    exec_cpus: frozenset[int] | None = None

    @property
    def empty(self) -> bool:
        return self == RuntimeEdit()


def merge_edits(edits: Sequence[RuntimeEdit | None]) -> RuntimeEdit:
    """One edit from the resources' edits, in order: a later resource's cpuset, memory policy
    and exec CPUs win, device nodes are added once per path, variables and netdevs merge."""
    out = RuntimeEdit()
    for edit in edits:
        if edit is None:
            continue
        paths = {d.path for d in out.devices}
        out = replace(
            out,
            cpus=edit.cpus if edit.cpus is not None else out.cpus,
            mems=edit.mems if edit.mems is not None else out.mems,
            cpu_quota=edit.cpu_quota if edit.cpu_quota is not None else out.cpu_quota,
            devices=out.devices + tuple(d for d in edit.devices if d.path not in paths),
            env={**out.env, **edit.env},
            memory_policy=edit.memory_policy if edit.memory_policy is not None else out.memory_policy,
            policy_default=edit.policy_default if edit.memory_policy is not None else out.policy_default,
            net_devices={**out.net_devices, **edit.net_devices},
            exec_cpus=edit.exec_cpus if edit.exec_cpus is not None else out.exec_cpus,
        )
    return out


__all__ = ["RuntimeAsk", "RuntimeEdit", "merge_edits"]
