"""The paths into numa-pin and what each can carry to the container (pure: no I/O).

Two paths leave the grant to the runtime: podman's ``precreate`` hook edits the proposed OCI
config, and the NRI plugin answers ``CreateContainer`` with an adjustment (and ``UpdateContainer``
and ``Synchronize`` with updates). On both, every resource says what it needs applied as one
:class:`~numa_pin.resources.node.runtime.RuntimeEdit` (``NodeResource.runtime``), the service
merges them, and a thin encoder writes the merged edit in the path's format
(:mod:`numa_pin.hook.specedit`, :mod:`numa_pin.nri.convert`). Neither encoder names a resource.

A path is a :class:`RuntimeTarget`: its name and what it can carry. A request that asks for
something its path cannot carry is refused before anything is decided
(``Resource.refusal``), in one line naming the path and one that can; it is never admitted and
then silently ignored.
"""

from __future__ import annotations

from numa_pin.base.record import record


@record
class RuntimeTarget:
    """One path into numa-pin and what it can carry to the container.

    ``applies``: the runtime applies a config numa-pin writes (precreate, NRI), instead of
    numa-pin writing the container's cgroup itself (prestart, ``run``). ``memory_policy`` and
    ``net_devices``: the path can set the container's memory policy and move netdevs into it.
    ``mixed_cpus``: a container there can run on its exclusive CPUs and the shared pool together.
    ``exec_affinity``: it can write ``process.execCPUAffinity``, the CPUs of the processes a
    runtime execs into the container later; ``no_exec_affinity`` says why it cannot.
    ``instead``: what a user whose request this path cannot carry should use."""

    name: str
    applies: bool = False
    memory_policy: bool = False
    net_devices: bool = False
    instead: str = ""
    mixed_cpus: bool = True
    exec_affinity: bool = False
    no_exec_affinity: str = ""

    def cannot(self, what: str) -> str:
        """One line: ``what`` cannot be carried on this path, and what can."""
        tail = f"; {self.instead}" if self.instead else ""
        return f"{what} cannot be applied on the {self.name} path{tail}"

    def cannot_exec(self, what: str) -> str:
        """One line: ``what`` (an exec CPU affinity) cannot be carried on this path, and why."""
        tail = f": {self.no_exec_affinity}" if self.no_exec_affinity else ""
        return f"{what} cannot be applied on the {self.name} path{tail}"


#: the OCI prestart/createRuntime hook: the container's process exists already, so its memory
#: policy cannot be set any more (runc, crun, CRI-O, containerd's base spec)
PRESTART = RuntimeTarget(
    "prestart", memory_policy=False, net_devices=True,
    instead="use podman's precreate hook with a runtime of runtime-spec 1.3 or later, or `numa-pin run`",
    no_exec_affinity="the runtime has read config.json before a prestart hook runs, and no hook runs when "
                     "a process is exec'd later; use podman's precreate hook with runc 1.3 or later")
#: ``numa-pin run``: the child sets its own memory policy before exec
RUN = RuntimeTarget("run", memory_policy=True, net_devices=True, mixed_cpus=False,
                    instead="ask a container runtime's path (prestart, precreate, nri)",
                    no_exec_affinity="`numa-pin run` runs one command and nothing execs into it")
#: NRI as the runtimes that numa-pin is tested with carry it (containerd 1.7 and 2.x)
NRI = RuntimeTarget(
    "nri", applies=True,
    instead="use podman's precreate hook with a runtime of runtime-spec 1.3 or later, or `numa-pin run`",
    no_exec_affinity="NRI's ContainerAdjustment (v0.12) has no field for process.execCPUAffinity; use "
                     "podman's precreate hook with runc 1.3 or later")


def precreate_target(memory_policy: bool, net_devices: bool, exec_affinity: bool = False) -> RuntimeTarget:
    """podman's precreate: the config's runtime-spec version says what its runtime applies."""
    return RuntimeTarget("precreate", applies=True, memory_policy=memory_policy, net_devices=net_devices,
                         instead="the config's runtime-spec has no linux.memoryPolicy (1.3 or later), "
                                 "nor linux.netDevices; `numa-pin run` applies it",
                         exec_affinity=exec_affinity,
                         no_exec_affinity="the config's runtime-spec has no process.execCPUAffinity (1.2 or "
                                          "later), so its runtime ignores it")


__all__ = ["NRI", "PRESTART", "RUN", "RuntimeTarget", "precreate_target"]
