"""Which GPUs a device plugin's ``NVIDIA_VISIBLE_DEVICES`` names (issue 34): every index, UUID
and CDI name there resolved as the allocation resolves it, whatever the name's kind.

A name of NVIDIA's kind maps by index or UUID, one of a configured resource's kind into that
resource's devices, and any other kind (a DRA claim) through the device nodes its CDI spec file
gives it, read by the same edge the allocation reads them with
(:func:`numa_pin.resources.node.devnodes.with_device_nodes`). Where one of them resolves to no
device the answer is None: the runtime then gets the granted GPUs' UUIDs. Oracles: the kit's
description of ``gpu8-sriov`` (each GPU's device minor and UUID; NVML's index is the position in
PCI address order) and the spec file the test writes (claim ``gpu<m>`` is ``/dev/nvidia<m>``).
"""

from __future__ import annotations

import pytest

from numa_pin.devices.model import DeviceInfo
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node.devnodes import with_device_nodes
from numa_pin.resources.nvidia import gpus_in_env
from numa_pin.testing import devtree, machine, shapes

GPU8 = machine.expected_topology(shapes.SHAPES["gpu8-sriov"]())
KIT_GPUS = sorted((d for d in GPU8.pci_devices if d.gpu_minor is not None), key=lambda d: d.address)
BY_MINOR = {d.gpu_minor: d.address for d in KIT_GPUS}
CLAIM = "k8s.gpu.nvidia.com/claim"
#: a configured device resource of two GPUs (minors 7 and 2), whose CDI names index them in address order
OWN = "example.com/gpu"
OWN_GPUS = sorted((BY_MINOR[7], BY_MINOR[2]))


@pytest.mark.parametrize("value, want", [
    ("3", {KIT_GPUS[3].address}),
    (KIT_GPUS[1].gpu_uuid, {KIT_GPUS[1].address}),
    ("nvidia.com/gpu=5", {KIT_GPUS[5].address}),
    (f"{CLAIM}=gpu6", {BY_MINOR[6]}),
    (f"{CLAIM}=gpu6,2", {BY_MINOR[6], KIT_GPUS[2].address}),
    (f"{CLAIM}=gpu1,nvidia.com/gpu=4", {BY_MINOR[1], KIT_GPUS[4].address}),
    (f"{CLAIM}=gpu0,{CLAIM}=gpu0", {BY_MINOR[0]}),
    (f"{OWN}=1", {OWN_GPUS[1]}),
    (f"{OWN}=1,{CLAIM}=gpu3", {OWN_GPUS[1], BY_MINOR[3]}),
    (f"{CLAIM}=nope", None),
    (f"{CLAIM}=nope,3", None),
    (f"{CLAIM}=gpu6,9", None),
    (f"{OWN}=2", None),
    ("nvidia.com/gpu=9", None),
    ("", None),
], ids=["index", "uuid", "nvidia-cdi", "claim", "claim-and-index", "claim-and-nvidia-cdi", "claim-twice",
        "configured-kind", "configured-kind-and-claim", "claim-no-spec-names", "unknown-claim-and-index",
        "claim-and-unknown-index", "configured-kind-unknown", "nvidia-cdi-unknown", "nothing"])
def test_the_variable_names_the_gpus_its_names_resolve_to(tmp_path, value, want):
    devtree.write_cdi_spec(tmp_path / "cdi", CLAIM, {f"gpu{m}": [(f"/dev/nvidia{m}", 195, m)] for m in BY_MINOR},
                           shared=[("/dev/nvidiactl", 195, 255)])
    request = request_from_oci("c", {}, {"NVIDIA_VISIBLE_DEVICES": value})
    request = with_device_nodes(request, (), sysfs_root=str(tmp_path / "sys"), dev_root=str(tmp_path / "dev"),
                                cdi_dirs=[str(tmp_path / "cdi")], mapped_kinds=("nvidia.com/gpu", OWN))
    devices = {OWN: tuple(DeviceInfo(a, (), True) for a in OWN_GPUS)}
    got = gpus_in_env(request.fixed_gpus, request.fixed_cdi, GPU8, request.fixed_nodes, devices)
    assert got == (frozenset(want) if want is not None else None)


def test_a_claim_whose_nodes_the_request_does_not_carry_names_nothing():
    """With ``inference.device_nodes`` off the allocation aligns nothing to a claim, and neither
    does the variable: its spec file is not read, so the claim resolves to no GPU."""
    request = request_from_oci("c", {}, {"NVIDIA_VISIBLE_DEVICES": f"{CLAIM}=gpu6"})
    assert gpus_in_env(request.fixed_gpus, request.fixed_cdi, GPU8) is None
