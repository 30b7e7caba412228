"""``numa-pin.io/hugepages-spread``: hugepages taken evenly over the granted nodes (issue 26,
section 4; kubelet closed this request as not planned, so its order, lowest node first, is the
default and the oracle for the unspread case).

Oracle: the kit's declared free hugepages per node (``gpu8-sriov``: 2048 free 2 MiB pages on
each node) and whole-page arithmetic.
"""

from __future__ import annotations

import pytest

from numa_pin.admission.decide import NodeSettings, decide
from numa_pin.allocators.memory import allocate_memory
from numa_pin.errors import RequestError
from numa_pin.ledger.model import LedgerState
from numa_pin.requests.request import request_from_oci
from numa_pin.testing import machine, shapes
from numa_pin.topology.memory import build_memory_state

TOPO = machine.expected_topology(shapes.SHAPES["gpu8-sriov"]())
MIB = 1 << 20
PAGE = 2 * MIB
HUGE = "hugepages-2Mi"


def ask(size, spread):
    ann = {"numa-pin.io/cpus": "20", "numa-pin.io/hugepages-2Mi": f"{size // MIB}Mi"}  # 20 CPUs span two nodes
    if spread is not None:
        ann["numa-pin.io/hugepages-spread"] = spread
    return request_from_oci("c", ann)


@pytest.mark.parametrize("pages, spread, want", [(32, "true", (16, 16)), (33, "true", (17, 16)),
                                                  (32, "false", (32, 0)), (32, None, (32, 0))],
                         ids=["even", "odd-page-to-the-lower-node", "off", "default-off"])
def test_hugepages_over_the_granted_nodes(pages, spread, want):
    d = decide(TOPO, LedgerState(), ask(pages * PAGE, spread), NodeSettings(policy="best-effort"))
    assert d.admit and len(d.mems) == 2, d.reason
    per = d.memory[HUGE]
    assert tuple(per[n] // PAGE for n in sorted(d.mems)) == want


def test_a_short_node_gives_what_it_has_and_the_others_the_rest():
    nodes = sorted(TOPO.node_ids)[:2]
    free0 = (next(h for h in TOPO.nodes[nodes[0]].hugepages if h.size_kb == 2048).free - 10) * PAGE
    # another container of the same two-node group holds all but 10 pages of the first node
    state = build_memory_state(TOPO, None, [("other", {HUGE: {nodes[0]: free0, nodes[1]: 0}}, frozenset(nodes))])
    grant = allocate_memory(state, {HUGE: 40 * PAGE}, nodes, spread=frozenset({HUGE}))
    assert {n: b // PAGE for n, b in grant.per_resource[HUGE].items()} == {nodes[0]: 10, nodes[1]: 30}


def test_a_bad_value_is_named():
    with pytest.raises(RequestError, match="numa-pin.io/hugepages-spread"):
        request_from_oci("c", {"numa-pin.io/hugepages-spread": "yes"})
