"""NRI's container and the hook's ``config.json`` carry the same ``linux.devices``, so a device node
the runtime makes (``podman --device``, an RDMA plugin's verbs node, a DPDK job's VFIO group)
aligns the container on NRI as on prestart and precreate (the every-path matrix's
``gpu-linux-devices`` row runs it to the first process). Oracle: the hook's own reading of the
same entries in ``config.json``.
"""

from __future__ import annotations

import json

import pytest

from numa_pin.errors import RequestError
from numa_pin.hook.oci import MAX_DEVICES, parse_spec
from numa_pin.nri import messages as nri_messages
from numa_pin.nri.convert import spec_of

from .fake_runtime import container, pod

CASES = [
    ("gpu", [("/dev/nvidia3", "c", 195, 3)]),
    ("gpu-and-control", [("/dev/nvidiactl", "c", 195, 255), ("/dev/nvidia0", "c", 195, 0)]),
    ("vfio-group", [("/dev/vfio/42", "c", 243, 0), ("/dev/vfio/vfio", "c", 10, 196)]),
    ("unbuffered-and-block", [("/dev/infiniband/uverbs0", "u", 231, 192), ("/dev/nvme0n1", "b", 259, 0)]),
    ("fifo-is-no-device", [("/dev/fifo", "p", 0, 0), ("/dev/nvidia1", "c", 195, 1)]),
    ("none", []),
]


def _nri(entries):
    m = nri_messages.load()
    p = pod(m, "u1", "p", "burstable")
    msg = container(m, p, "c1", cpu_milli=100)
    for path, kind, major, minor in entries:
        dev = msg.linux.devices.add()
        dev.path, dev.type, dev.major, dev.minor = path, kind, major, minor
    return p, msg


@pytest.mark.parametrize("entries", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_nri_reads_linux_devices_as_the_hook_reads_config_json(entries):
    doc = {"linux": {"devices": [{"path": p, "type": t, "major": a, "minor": b} for p, t, a, b in entries]}}
    want = parse_spec(json.dumps(doc), "/bundle").devices
    assert spec_of(*_nri(entries)).devices == want
    assert len(want) == sum(1 for e in entries if e[1] != "p")


def test_more_devices_than_the_hook_reads_are_refused():
    p, msg = _nri([(f"/dev/d{i}", "c", 1, i % 256) for i in range(MAX_DEVICES + 1)])
    with pytest.raises(RequestError, match="linux.devices"):
        spec_of(p, msg)
