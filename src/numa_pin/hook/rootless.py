"""The hook under a rootless runtime (rootless podman runs hooks.d files too: they say ``always``).

Without root numa-pin can neither lock the node ledger nor write the cgroups, so:

* a container that asks for nothing passes: exit 0, nothing read but the request, and at
  ``precreate`` the proposed config comes back unchanged. Asking means a ``numa-pin.io/*``
  annotation; what numa-pin would otherwise infer (CPU quota, hugepage limits, GPUs a device
  plugin or CDI chose) is no ask, since a rootless container cannot be aligned anyway;
* a container that asks gets one line saying what it needs (:func:`refusal`);
* ``poststop`` has nothing to release (nothing was ever recorded).

"Rootless" means the hook is not root in the initial user namespace: its effective uid is not 0,
or it runs in a user namespace that does not map the whole uid range (rootless podman's
``0 1000 1`` map), where uid 0 is only the user's own.
"""

from __future__ import annotations

import os

from numa_pin.base.boundedio import UnsafeInput, read_regular_file
from numa_pin.errors import RootlessError

TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable

    from numa_pin.config.schema import Config

#: annotations that ask numa-pin for something
REQUEST_PREFIX = "numa-pin.io/"

#: ``/proc/self/uid_map`` of the initial user namespace
_INITIAL_MAP = ("0", "0", "4294967295")
#: largest ``uid_map`` read (the kernel takes at most 340 lines)
_MAX_MAP_BYTES = 32 << 10


def is_rootless(proc_root: str = "/proc", euid: int | None = None) -> bool:
    """True when this process is not root of the initial user namespace (see the module doc).

    A missing ``uid_map`` (no user namespaces in the kernel) counts as the initial namespace.
    """
    if (os.geteuid() if euid is None else euid) != 0:
        return True
    try:  # bytes decoded here: a text-mode open costs the hook a codec import
        text = read_regular_file(os.path.join(proc_root, "self", "uid_map"), _MAX_MAP_BYTES).decode("ascii", "replace")
    except (OSError, UnsafeInput):
        return False
    lines = [line.split() for line in text.splitlines() if line.strip()]
    return lines != [list(_INITIAL_MAP)]


def refusal(container_id: str, asked: str, euid: int | None = None) -> RootlessError:
    """The error a rootless container that asked for ``asked`` gets (one line)."""
    uid = os.geteuid() if euid is None else euid
    return RootlessError(
        f"numa-pin needs a root runtime to pin CPUs, memory and devices, but container {container_id} "
        f"runs rootless (hook uid {uid}) and asked for {asked}; run it with root podman (sudo podman run ...), "
        "or drop the numa-pin.io annotations and device requests"
    )


def describe_request(request) -> str:
    """A short account of what a request asks for (``numa-pin.io/cpus=2, GPU GPU-1``)."""
    parts: list[str] = []
    for label, amounts in (("", request.amounts), ("pod ", request.pod_amounts)):
        if amounts is None:
            continue
        if amounts.cpus:
            parts.append(f"{label}{amounts.cpus} exclusive CPUs")
        for res, size in sorted(amounts.memory_resources.items()):
            parts.append(f"{label}{res} {size} bytes")
        for res, count in sorted(amounts.devices.items()):
            if count:
                parts.append(f"{label}{res}={count}")
    parts += [f"GPU {g}" for g in request.fixed_gpus]
    parts += [f"PCIDEVICE_{k}" for k in sorted(request.fixed_pci)]
    parts += [f"CDI {d}" for d in request.fixed_cdi]
    parts += [f"device {n.label}" for n in request.placeable_nodes]
    return ", ".join(parts) or "resources"


def run_rootless(stage: str, container_id: str, data: bytes | None, state, load_config: Callable[[], Config],
                 stdout) -> int:
    """The whole hook for a rootless runtime: pass what asks for nothing, refuse the rest.

    ``data`` is the proposed config (precreate) or None; ``state`` the OCI state (other stages);
    ``load_config`` the hook's config loader (:func:`numa_pin.config.load.entry_config` with
    ``or_defaults``: an unreadable node config must not refuse a container that asks nothing).
    Never touches the ledger or cgroups. Raises RootlessError for a container that asked, and
    HookInputError / RequestError for an input that cannot be read.
    """
    if stage == "poststop":
        return 0
    from numa_pin.hook.admit import request_from_spec
    from numa_pin.hook.oci import OciState, load_spec, parse_spec
    from numa_pin.hook.precreate import asks_nothing

    config = load_config()
    if data is not None:
        spec = parse_spec(data, "/", source="proposed config on stdin")
        state = OciState(id=container_id, status="precreate", pid=None, bundle="/")
    else:
        spec = load_spec(state.bundle)
    annotations = {**spec.annotations, **state.annotations}
    if not any(key.startswith(REQUEST_PREFIX) for key in annotations):
        pass  # inferred requests (quota, hugepages, device-plugin env, CDI) are not asks of numa-pin
    else:
        request = request_from_spec(state, spec, config)
        if not asks_nothing(request):
            raise refusal(container_id, describe_request(request))
    if data is not None:
        stdout.write(data)
        stdout.flush()
    return 0


__all__ = ["describe_request", "is_rootless", "refusal", "run_rootless"]
