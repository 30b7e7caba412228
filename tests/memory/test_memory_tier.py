"""CPU-less memory nodes (CXL, HBM) as a declared tier: ``memory_tiers`` in the config and
``numa-pin.io/memory-tier`` in the request (issue 26, section 4).

Oracle: the kit's ``cpuless-memory-node`` machine, whose node 2 has memory and no CPU; no CPU
alignment ever picks it, so it is in the grant's memory nodes only when the tier asks for it.
"""

from __future__ import annotations

import pytest

from numa_pin.admission.decide import NodeSettings, decide
from numa_pin.config import config_from_dict
from numa_pin.errors import ConfigError, RequestError
from numa_pin.ledger.model import LedgerState
from numa_pin.requests.request import request_from_oci, with_memory_tier
from numa_pin.testing import machine, shapes

TOPO = machine.expected_topology(shapes.SHAPES["cpuless-memory-node"]())
CPULESS = frozenset(n for n, node in TOPO.nodes.items() if not node.cpus)
TIERS = config_from_dict({"memory_tiers": {"cxl": ",".join(map(str, sorted(CPULESS)))}}).memory_tiers


def ask(tier=None, policy="single-numa-node"):
    ann = {"numa-pin.io/cpus": "2", "numa-pin.io/memory": "1Gi"}
    if tier:
        ann["numa-pin.io/memory-tier"] = tier
    req = with_memory_tier(request_from_oci("c", ann), TIERS)
    return decide(TOPO, LedgerState(), req, NodeSettings(policy=policy))


@pytest.mark.parametrize("policy", ["single-numa-node", "best-effort"])
def test_the_tier_joins_the_memory_nodes(policy):
    assert CPULESS, "the kit machine has a CPU-less node"
    plain, tiered = ask(policy=policy), ask("cxl", policy)
    assert plain.admit and tiered.admit
    assert not plain.mems & CPULESS
    assert tiered.mems == plain.mems | CPULESS and tiered.cpus == plain.cpus


def test_an_unknown_tier_names_the_annotation_and_the_known_ones():
    with pytest.raises(RequestError, match=r"numa-pin.io/memory-tier: no memory tier 'hbm' \(memory_tiers: cxl\)"):
        ask("hbm")


def test_a_tier_of_nodes_the_machine_lacks_is_refused():
    req = with_memory_tier(request_from_oci("c", {"numa-pin.io/cpus": "1", "numa-pin.io/memory-tier": "far"}),
                           {"far": frozenset({9})})
    with pytest.raises(RequestError, match=r"memory tier far names NUMA node\(s\) \[9\]"):
        decide(TOPO, LedgerState(), req, NodeSettings())


@pytest.mark.parametrize("value, match", [({"": "2"}, "tier name"), ({"cxl": ""}, "must not be empty"),
                                          ({"cxl": "x"}, "bad cpulist"), ("2", "mapping")],
                         ids=["empty-name", "empty-nodes", "garbage", "not-a-mapping"])
def test_bad_tiers_in_the_config(value, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict({"memory_tiers": value})
