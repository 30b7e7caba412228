"""The machine a device test module describes (its module-level ``SPEC``), built once per
module from the kit, and its topology as numa-pin discovers it."""

from __future__ import annotations

import pytest

from numa_pin.testing import machine
from numa_pin.topology.discover import discover


@pytest.fixture(scope="module")
def built(request, tmp_path_factory):
    return machine.build_once(request.module.SPEC, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def topo(built):
    return discover(built.sysfs_root, built.proc_root)
