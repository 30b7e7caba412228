"""Hypothesis properties of the CPU allocators and of Allocate on random machines.

* a result never holds more CPUs than were asked for, is a subset of what was available, and
  has exactly the requested size (or the request fails with kubelet's over-request text);
* with an affinity whose nodes hold enough CPUs, Allocate stays inside those nodes.
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from numa_pin.allocators.cpu import allocate_cpus, take_cpus
from numa_pin.config.cpu_options import CpuOptions
from numa_pin.errors import AllocationError
from numa_pin.topology.cpus import CpuInfo, CpuTopology


@st.composite
def topologies(draw):
    """1-4 sockets; 1-3 NUMA nodes per socket or 2 sockets per node; 1-6 cores per node with
    1-4 threads (uniform, or ragged to model hybrid/offline machines); 1-3 L3 per node."""
    sockets = draw(st.integers(1, 4))
    layout = draw(st.sampled_from(["numa-per-socket", "sockets-per-numa"]))
    per_socket = draw(st.integers(1, 3)) if layout == "numa-per-socket" else 1
    ragged = draw(st.booleans())
    smt = draw(st.integers(1, 4))
    infos, cpu = [], 0
    cores = []  # (socket, numa, uncore, threads)
    for s in range(sockets):
        for k in range(per_socket):
            numa = s * per_socket + k if layout == "numa-per-socket" else s // 2
            l3s = draw(st.integers(1, 3))
            for c in range(draw(st.integers(1, 6))):
                threads = draw(st.integers(1, 4)) if ragged else smt
                cores.append((s, numa, numa * 3 + c % l3s, threads))
    # thread ids interleave like Linux: first threads of all cores, then the second ones...
    ids: dict[int, list[int]] = {i: [] for i in range(len(cores))}
    for t in range(4):
        for i, (_s, _n, _u, threads) in enumerate(cores):
            if t < threads:
                ids[i].append(cpu)
                cpu += 1
    for i, (s, numa, uncore, _threads) in enumerate(cores):
        for c in ids[i]:
            infos.append(CpuInfo(c, s, numa, min(ids[i]), uncore))
    declared_zero = draw(st.booleans())
    return CpuTopology.from_cpus(infos, num_numa_nodes=0 if declared_zero else None)


@st.composite
def requests(draw):
    topo = draw(topologies())
    avail = draw(st.sets(st.sampled_from(sorted(topo.cpu_ids))))
    count = draw(st.integers(0, len(avail) + 1))
    return topo, frozenset(avail), count


KNOBS = st.fixed_dictionaries(
    {
        "strategy": st.sampled_from(["packed", "spread"]),
        "prefer_uncore": st.booleans(),
        "distribute_across_numa": st.booleans(),
        "group_size": st.integers(1, 4),
    }
)


@settings(max_examples=400, deadline=None)
@given(requests(), KNOBS)
def test_take_cpus_exact_subset_or_kubelet_error(request_, knobs):
    topo, avail, count = request_
    if count > len(avail):
        try:
            take_cpus(topo, avail, count, **knobs)
        except AllocationError as err:
            assert str(err) == (
                f"not enough cpus available to satisfy request: requested={count}, available={len(avail)}"
            )
        else:
            raise AssertionError("over-request must fail")
        return
    got = take_cpus(topo, avail, count, **knobs)
    assert got <= avail
    assert len(got) == count


@settings(max_examples=300, deadline=None)
@given(requests(), st.data())
def test_allocate_stays_inside_the_hint_when_it_can(request_, data):
    topo, avail, count = request_
    assume(count <= len(avail))
    nodes = frozenset(data.draw(st.sets(st.sampled_from(sorted(topo.numa_nodes())), min_size=1)))
    options = data.draw(
        st.sampled_from(
            [CpuOptions(), CpuOptions(distribute_cpus_across_cores=True),
             CpuOptions(prefer_align_cpus_by_uncorecache=True), CpuOptions(distribute_cpus_across_numa=True)]
        )
    )
    reusable = frozenset(data.draw(st.sets(st.sampled_from(sorted(topo.cpu_ids - avail)), max_size=2))
                         if topo.cpu_ids - avail else ())
    got = allocate_cpus(topo, options, avail, reusable, count, nodes)
    pool = avail | reusable
    assert got <= pool and len(got) == count
    inside = pool & topo.cpus_in_numa_nodes(*nodes)
    if len(inside) >= count:
        assert got <= inside
    else:
        assert inside <= got  # every aligned CPU is used before spilling


@settings(max_examples=200, deadline=None)
@given(requests())
def test_allocate_without_hint_is_take_by_topology(request_):
    topo, avail, count = request_
    assume(count <= len(avail))
    assert allocate_cpus(topo, CpuOptions(), avail, (), count, None) == take_cpus(topo, avail, count)
