"""From OCI inputs to a :class:`~numa_pin.requests.request.ContainerRequest`."""

from __future__ import annotations

from numa_pin.config.schema import Config
from numa_pin.enforcer.owner import ContainerCgroup
from numa_pin.hook.oci import OciSpec, OciState, load_spec
from numa_pin.requests.request import ContainerRequest, request_from_oci


def request_from_spec(state: OciState, spec: OciSpec, config: Config) -> ContainerRequest:
    """Annotations from the state win over those in config.json (they are normally equal)."""
    annotations = {**spec.annotations, **state.annotations}
    request = request_from_oci(state.id, annotations, spec.env, spec.limits, inference=config.inference,
                               isolation=config.isolation, pod_limits=spec.pod_limits)
    from numa_pin.requests.request import with_memory_tier

    return with_spec_devices(with_memory_tier(request, config.memory_tiers), spec, config)


def with_spec_devices(request: ContainerRequest, spec: OciSpec, config: Config) -> ContainerRequest:
    """``request`` with the device nodes it already carries (``inference.device_nodes``): its
    ``linux.devices`` and the nodes of CDI names the device rules do not map, located on the
    host (:mod:`numa_pin.resources.node.devnodes`)."""
    if request.sandbox or not config.inference.device_nodes:
        return request
    from numa_pin.resources.cdi_map import NVIDIA_GPU_KIND

    mapped = (NVIDIA_GPU_KIND, *config.devices)
    if not spec.devices and all(d.kind in mapped for d in request.fixed_cdi):
        return request
    from numa_pin.resources.node.devnodes import with_device_nodes

    return with_device_nodes(request, spec.devices, sysfs_root=config.sysfs_root, dev_root=config.dev_root,
                             cdi_dirs=config.cdi_spec_dirs, mapped_kinds=mapped)


def request_for(state: OciState, config: Config) -> ContainerRequest:
    return request_from_spec(state, load_spec(state.bundle), config)


def admission_for(state: OciState, config: Config) -> tuple[ContainerRequest, ContainerCgroup, str | None]:
    """The request; what the bundle says the container's cgroup is (the state's pid must sit
    there: :func:`numa_pin.enforcer.owner.check_container_cgroup`); and the container's root
    filesystem (where granted GPU nodes go before pivot_root)."""
    spec = load_spec(state.bundle)
    return request_from_spec(state, spec, config), ContainerCgroup(state.id, spec.limits.cgroups_path), spec.root_path
