"""From OCI inputs to a :class:`~numa_pin.admission.request.ContainerRequest`."""

from __future__ import annotations

from numa_pin.admission.request import ContainerRequest, request_from_oci
from numa_pin.config.schema import Config
from numa_pin.enforcer.owner import ContainerCgroup
from numa_pin.hook.oci import OciSpec, OciState, load_spec


def request_from_spec(state: OciState, spec: OciSpec, config: Config) -> ContainerRequest:
    """Annotations from the state win over those in config.json (they are normally equal)."""
    annotations = {**spec.annotations, **state.annotations}
    return request_from_oci(
        state.id,
        annotations,
        spec.env,
        cpu_quota=spec.cpu_quota,
        cpu_period=spec.cpu_period,
        memory_limit=spec.memory_limit,
        hugepage_limits=spec.hugepage_limits,
        cpuset=spec.cpuset_cpus,
        cpu_shares=spec.cpu_shares,
        cgroups_path=spec.cgroups_path,
        inference=config.inference,
        isolation=config.isolation,
    )


def request_for(state: OciState, config: Config) -> ContainerRequest:
    return request_from_spec(state, load_spec(state.bundle), config)


def admission_for(state: OciState, config: Config) -> tuple[ContainerRequest, ContainerCgroup, str | None]:
    """The request; what the bundle says the container's cgroup is (the state's pid must sit
    there: :func:`numa_pin.enforcer.owner.check_container_cgroup`); and the container's root
    filesystem (where granted GPU nodes go before pivot_root)."""
    spec = load_spec(state.bundle)
    return request_from_spec(state, spec, config), ContainerCgroup(state.id, spec.cgroups_path), spec.root_path
