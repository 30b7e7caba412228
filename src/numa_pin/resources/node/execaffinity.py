"""``numa-pin.io/exec-cpu-affinity``: where the processes exec'd into a container run.

A probe or ``kubectl exec``/``podman exec`` joins the container's cgroup, so it runs on the
container's CPUs: for a container with exclusive CPUs, on any of them, beside the workload.
CRI-O's ``exec_cpu_affinity = "first"`` keeps such processes on one CPU, and so does ``first``
here: the runtime's config gets ``process.execCPUAffinity`` with ``final`` = the first (lowest)
of the grant's exclusive CPUs. The runtime sets that affinity on every exec'd process right after
it joins the container's cgroup (runc 1.3 and later; crun 1.19 and later, from the exec's own
process document only). It cannot be the shared pool: the kernel bounds a task's affinity by its
cgroup's cpuset, and a ``final`` without any of the container's CPUs fails every exec (EINVAL).
Nor is ``initial`` written: it is the affinity of the runtime's own helper before it joins the
cgroup, where a CPU outside the runtime's cgroup (host services kept off exclusive CPUs) would
fail the exec too. ``docs/exec-affinity.md`` says which path and runtime honour it.

Only a path whose runtime reads the config after numa-pin wrote it carries the field
(:attr:`~numa_pin.resources.runtime.RuntimeTarget.exec_affinity`: podman's precreate with a
runtime-spec 1.2 config). An annotation asking ``first`` on any other path is refused in one
line (:meth:`ExecAffinityNode.refusal`); the node default (the config's
``isolation.exec_cpu_affinity``) applies where it can be carried and asks nothing elsewhere.
"""

from __future__ import annotations

from numa_pin.config.parse import EXEC_FIRST
from numa_pin.resources.node.base import Node, NodeResource

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from numa_pin.requests.request import ContainerRequest
    from numa_pin.resources.node.runtime import RuntimeAsk, RuntimeEdit
    from numa_pin.resources.runtime import RuntimeTarget

#: the annotation that asks it of one container
ANNOTATION = "numa-pin.io/exec-cpu-affinity"


def exec_cpus(cpus: frozenset[int]) -> frozenset[int]:
    """The CPUs exec'd processes of a container with exclusive ``cpus`` run on: the first."""
    return frozenset((min(cpus),))


class ExecAffinityNode(NodeResource):
    """``process.execCPUAffinity`` for a container with exclusive CPUs; writes nothing itself."""

    name = "isolation.exec-cpu-affinity"

    def refusal(self, request: ContainerRequest, target: RuntimeTarget) -> str:
        """An annotation asking ``first`` needs a path that writes the runtime's config."""
        asked = request.isolation.exec_cpu_affinity
        if asked == EXEC_FIRST and not target.exec_affinity:
            return target.cannot_exec(f"{ANNOTATION} {asked!r}")
        return ""

    def runtime(self, node: Node, ask: RuntimeAsk) -> RuntimeEdit | None:
        """At creation of a container with exclusive CPUs, on a path that carries it: the exec
        CPUs, when the annotation (or, without one, the node default) asks ``first``."""
        if ask.request is None or not ask.grant.cpus or not ask.target.exec_affinity:
            return None
        asked = ask.request.isolation.exec_cpu_affinity or node.config.isolation.exec_cpu_affinity
        if asked != EXEC_FIRST:
            return None
        from numa_pin.resources.node.runtime import RuntimeEdit

        return RuntimeEdit(exec_cpus=exec_cpus(ask.grant.cpus))


__all__ = ["ANNOTATION", "ExecAffinityNode", "exec_cpus"]
