"""A pod's request at pod scope from its containers' requests (pure): what the memory and device
providers both take from kubelet's pod resource helpers (``getPodRequestedResources``,
``getPodDeviceRequest``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping


def pod_request(
    init_containers: Iterable[tuple[Mapping[str, int], bool]],
    app_containers: Iterable[Mapping[str, int]],
    check: Callable[[Mapping[str, int]], Mapping[str, int]],
    keep_init_only: bool,
) -> dict[str, int]:
    """Per resource, ``max(sum of app containers + sum of sidecars, peak)``.

    ``init_containers`` are ``(request, restartable)`` in spec order. A restartable (sidecar)
    init container keeps its resources for the pod's whole life: it adds to a running sum that
    every later init container sees still held. The peak is the largest running sum plus the
    request of the init container that runs then. ``check`` validates one container's request
    (raising :class:`~numa_pin.errors.RequestError`) and returns it. Resources only init
    containers ask for are kept with ``keep_init_only`` (devices), else dropped (memory).
    """
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for request, restartable in init_containers:
        for resource, amount in check(request).items():
            held = sidecars.get(resource, 0) + amount
            if restartable:
                sidecars[resource] = held
            peak[resource] = max(peak.get(resource, 0), held)
    apps: dict[str, int] = {}
    for request in app_containers:
        for resource, amount in check(request).items():
            apps[resource] = apps.get(resource, 0) + amount
    names = {**dict.fromkeys(sidecars), **dict.fromkeys(apps), **dict.fromkeys(peak)} if keep_init_only else apps
    return {r: max(apps.get(r, 0) + sidecars.get(r, 0), peak.get(r, 0)) for r in names}
