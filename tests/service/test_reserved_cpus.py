"""Reserved CPUs through the whole node service (issue 23): a ``reserved_cpus`` list with the
default ``num_reserved_cpus`` admits, and ``strict-cpu-reservation`` keeps the reserved CPUs out
of the shared pool that shared containers run on, as kubelet's default cpuset does.

The machine is the kit's ``intel-2s-ht`` (32 CPUs, 2 nodes); cgroups are a small fake v1 tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

RESERVED = frozenset({0, 16})  # CPU 0 and its sibling


def _node(tmp_path: Path, strict: bool) -> tuple[FakeNode, NodeService]:
    node = FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path / "machines", cpus="0-31", mems="0-1")
    options = {"strict-cpu-reservation": True} if strict else {}
    # num_reserved_cpus stays at its default (1): the list's size is what counts
    config = config_from_dict(node.config_dict(policy="single-numa-node", cpu_manager={
        "reserved_cpus": "0,16", "options": options}))
    return node, NodeService(config)


@pytest.mark.parametrize("strict", [False, True], ids=["reserved-in-pool", "strict-cpu-reservation"])
def test_shared_containers_and_the_reserved_cpus(tmp_path: Path, strict: bool) -> None:
    node, agent = _node(tmp_path, strict)
    assert cpu_node.reserved(agent) == RESERVED
    agent.admit(request_from_oci("s", {}), node.add_container("s", 40001))
    shared = parse_list(node.cpuset("s")[0])
    every = frozenset(range(32))
    assert shared == (every - RESERVED if strict else every)

    agent.admit(request_from_oci("x", {"numa-pin.io/cpus": "4"}), node.add_container("x", 40002))
    exclusive = agent.ledger.read().grants["x"].cpus
    assert len(exclusive) == 4 and not exclusive & RESERVED
    shrunk = parse_list(node.cpuset("s")[0])
    assert shrunk == (every - exclusive - RESERVED if strict else every - exclusive)
    assert cpu_node.shared_pool(agent, agent.ledger.read()) == shrunk

    agent.release("x")
    assert parse_list(node.cpuset("s")[0]) == shared
