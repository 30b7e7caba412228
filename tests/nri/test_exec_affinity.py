"""The exec CPU affinity through NRI: its ``ContainerAdjustment`` (v0.12) has no field for
``process.execCPUAffinity``, so an annotation asking it is refused in one line
(``tests/nri/test_every_path.py``), the node default asks nothing, and the encoder refuses an
edit carrying it rather than drop it."""

from __future__ import annotations

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.errors import PathLimitError
from numa_pin.nri import messages as nri_messages
from numa_pin.nri.convert import fill_adjustment
from numa_pin.resources.node.runtime import RuntimeEdit
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

from .fake_runtime import Connected, container, pod

CID = "0f2a83a2d618ece3563383e4d2c110bfc35717b71b479661529c6d7a83acaedb"


def test_the_adjustment_has_no_field_for_it():
    """The oracle is NRI's own message descriptor: no field anywhere in the adjustment names it."""
    m = nri_messages.load()
    names: set[str] = set()
    seen: set[str] = set()
    todo = [m.api("ContainerAdjustment").DESCRIPTOR]
    while todo:
        desc = todo.pop()
        if desc.full_name in seen:
            continue
        seen.add(desc.full_name)
        for f in desc.fields:
            names.add(f.name.lower())
            if f.message_type is not None:
                todo.append(f.message_type)
    assert "linux" in names and "memory_policy" in names, "the walk reaches the linux adjustment"
    assert not any("affinity" in n or n.startswith("exec") for n in names)


def test_an_edit_with_exec_cpus_is_refused_not_dropped():
    m = nri_messages.load()
    adjust = m.api("ContainerAdjustment")()
    with pytest.raises(PathLimitError, match="cannot be applied on the nri path: NRI's ContainerAdjustment"):
        fill_adjustment(adjust, RuntimeEdit(cpus=frozenset({1}), exec_cpus=frozenset({1})))


@pytest.mark.parametrize("annotations, admitted", [({}, True), ({"numa-pin.io/exec-cpu-affinity": "first"}, False)],
                         ids=["node-default-asks-nothing", "annotation-refused"])
def test_create_container_with_the_node_default(tmp_path, annotations, admitted):
    fake = FakeNode(tmp_path, "laptop")
    service = NodeService(config_from_dict(fake.config_dict(policy="restricted",
                                                            isolation={"exec_cpu_affinity": "first"})))
    m = nri_messages.load()
    conn = Connected(service, m)
    try:
        conn.runtime.configure()
        conn.runtime.synchronize([], [])
        p = pod(m, "u1", "p", "")
        got, text, reply = conn.runtime.create(p, container(m, p, CID, cpu_milli=1000, limit_milli=1000,
                                                            memory=64 << 20, annotations=annotations))
    finally:
        conn.close()
    assert (got == 0) is admitted, text
    if admitted:
        assert parse_list(reply.adjust.linux.resources.cpu.cpus), "the exclusive CPU is adjusted"
    else:
        assert "PathLimitError" in text and "nri path" in text and "\n" not in text
