"""Wall time of one Topology Manager decision as the NUMA node count grows.

Three providers answer with capacity families, as numa-pin's providers do: a CPU-like family
(free CPUs), a memory-like family with two dimensions (free memory, free 1Gi hugepages) and a
device-like family (free GPUs, one GPU on every other node). The machine is partly used
(seeded random usage); requests are realistic. Each row is the median of several runs of
``merge_hints``; the brute-force kubelet reference (``reference_merge``, materialized families,
full cross product) is timed once for small machines and skipped beyond.

Scenarios:

* ``fits-1-node``: 16 CPUs, 64 GiB + 8 hugepages, 1 GPU: one node of the empty machine fits
  everything (preferred path when a node still does);
* ``fragmented``: 40 CPUs, 300 GiB + 40 hugepages, 2 GPUs on a heavily used machine where no
  set of ``min_affinity`` nodes fits everything (forces the non-preferred search).

A second table times the **full admission decision** numa-pin makes for a container
(:func:`numa_pin.admission.decide.decide`: the real CPU, memory and device providers, the
merge and the allocators) on synthetic machines of 2..64 nodes (32 CPUs, 256 GiB and one GPU
per node, a quarter of the CPUs already granted), for a request of 8 exclusive CPUs, 16 GiB and
one GPU.

Run: ``.venv/bin/python bench/merge_scaling.py [--runs N] [--ref-max-nodes N]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from numa_pin.policy.hint import CapacityFamily
from numa_pin.policy.reference import reference_merge
from numa_pin.policy.registry import merge_hints

GIB = 1 << 30
CPUS_PER_NODE = 32
MEM_PER_NODE = 256 * GIB
HUGEPAGES_PER_NODE = 64
POLICIES = ("best-effort", "restricted", "single-numa-node")


@dataclass(frozen=True)
class Machine:
    nodes: tuple[int, ...]
    cpus: tuple[int, ...]
    mem: tuple[int, ...]
    hugepages: tuple[int, ...]
    gpus: tuple[int, ...]
    total_gpus: tuple[int, ...]
    distances: dict[int, list[int]]


def build_machine(n: int, used: float, seed: int) -> Machine:
    """``used`` is the mean fraction of each node already taken."""
    rng = random.Random(seed)

    def free(total: int) -> int:
        return max(0, total - int(total * min(1.0, max(0.0, rng.gauss(used, 0.15)))))

    nodes = tuple(range(n))
    total_gpus = tuple(1 if i % 2 == 0 else 0 for i in nodes)
    gpus = [g if rng.random() > used / 2 else 0 for g in total_gpus]
    # keep at least two GPUs free so that a 2-GPU request can be placed somewhere
    for i in range(0, n, 2):
        if sum(gpus) >= 2:
            break
        gpus[i] = total_gpus[i]
    # sockets of 4 nodes: 10 local, 12 same socket, 21 next socket, 32 far away
    distances = {
        a: [10 if a == b else 12 if a // 4 == b // 4 else 21 if abs(a // 4 - b // 4) == 1 else 32 for b in nodes]
        for a in nodes
    }
    return Machine(
        nodes=nodes,
        cpus=tuple(free(CPUS_PER_NODE) for _ in nodes),
        mem=tuple(free(MEM_PER_NODE) for _ in nodes),
        hugepages=tuple(free(HUGEPAGES_PER_NODE) for _ in nodes),
        gpus=tuple(gpus),
        total_gpus=total_gpus,
        distances=distances,
    )


def min_affinity(totals: list[tuple[int, ...]], need: tuple[int, ...]) -> int:
    """kubelet's minAffinitySize on the empty machine: fewest nodes whose capacity suffices."""
    best = sorted(range(len(totals)), key=lambda i: totals[i], reverse=True)
    acc = [0] * len(need)
    for count, i in enumerate(best, start=1):
        acc = [a + c for a, c in zip(acc, totals[i])]
        if all(a >= nd for a, nd in zip(acc, need)):
            return count
    return len(totals)


def providers(machine: Machine, cpus: int, mem_gib: int, hugepages: int, gpus: int) -> list[dict[str, object]]:
    n = len(machine.nodes)
    cpu = CapacityFamily(
        machine.nodes,
        tuple((c,) for c in machine.cpus),
        (cpus,),
        min_affinity([(CPUS_PER_NODE,)] * n, (cpus,)),
    )
    mem_need = (mem_gib * GIB, hugepages)
    memory = CapacityFamily(
        machine.nodes,
        tuple(zip(machine.mem, machine.hugepages)),
        mem_need,
        min_affinity([(MEM_PER_NODE, HUGEPAGES_PER_NODE)] * n, mem_need),
    )
    device = CapacityFamily(
        machine.nodes,
        tuple((g,) for g in machine.gpus),
        (gpus,),
        min_affinity([(g,) for g in machine.total_gpus], (gpus,)),
    )
    return [{"cpu": cpu}, {"memory": memory}, {"gpu": device}]


SCENARIOS: dict[str, tuple[float, tuple[int, int, int, int]]] = {
    "fits-1-node": (0.45, (16, 64, 8, 1)),
    "fragmented": (0.75, (40, 300, 40, 2)),
}


def median_time(fn: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (median)")
    parser.add_argument("--ref-max-nodes", type=int, default=8, help="largest machine timed with the reference")
    parser.add_argument("--closest", action="store_true", help="also time prefer-closest-numa-nodes")
    args = parser.parse_args()

    header = f"{'scenario':<12} {'nodes':>5} {'policy':<17} {'closest':<7} {'merge ms':>9} {'reference ms':>13}  result"
    print(header)
    print("-" * len(header))
    for scenario, (used, request) in SCENARIOS.items():
        for n in (2, 4, 8, 16, 32, 64):
            machine = build_machine(n, used, seed=n)
            hints = providers(machine, *request)
            for policy in POLICIES:
                for closest in (False, True) if args.closest else (False,):
                    def run(policy: str = policy, closest: bool = closest) -> object:
                        return merge_hints(policy, hints, machine.nodes, machine.distances, closest)

                    result = run()
                    ms = median_time(run, args.runs) * 1000
                    if n <= args.ref_max_nodes:
                        start = time.perf_counter()
                        expected = reference_merge(policy, hints, machine.nodes, machine.distances, closest)
                        ref = f"{(time.perf_counter() - start) * 1000:13.1f}"
                        if expected != result:
                            raise SystemExit(f"MISMATCH {scenario} {n} {policy}: {result} != {expected}")
                    else:
                        ref = f"{'skipped':>13}"
                    hint, admit = result  # type: ignore[misc]
                    print(
                        f"{scenario:<12} {n:>5} {policy:<17} {str(closest):<7} {ms:9.2f} {ref}  "
                        f"{hint} admit={admit}"
                    )
    print()
    full_decision(args.runs)


def synthetic_topology(n: int):
    """``n`` nodes, 4 per socket, 16 cores x 2 threads per node, 256 GiB, one GPU per node."""
    from numa_pin.topology.model import KIND_GPU, Cpu, HugePages, NumaNode, PciDevice, Topology

    cpus, nodes, gpus = {}, {}, []
    per = 32
    for node in range(n):
        ids = [node * 16 + c for c in range(16)] + [n * 16 + node * 16 + c for c in range(16)]
        for i, cpu in enumerate(ids):
            core = node * 16 + i % 16
            cpus[cpu] = Cpu(id=cpu, socket=node // 4, die=0, core=core, numa=node,
                            siblings=frozenset({core, n * 16 + core}), l3=node)
        row = tuple(10 if m == node else (12 if m // 4 == node // 4 else 32) for m in range(n))
        nodes[node] = NumaNode(node, frozenset(ids), MEM_PER_NODE // 1024, MEM_PER_NODE // 2048, row,
                               (HugePages(1048576, HUGEPAGES_PER_NODE, HUGEPAGES_PER_NODE),))
        gpus.append(PciDevice(address=f"0000:{node + 1:02x}:00.0", vendor="0x10de", device="0x20b2",
                              pci_class="0x030200", numa_node=node, driver="nvidia", kind=KIND_GPU))
    assert len(cpus) == n * per
    return Topology(nodes=nodes, cpus=cpus, pci_devices=tuple(gpus))


def full_decision(runs: int) -> None:
    from numa_pin.admission.decide import NodeSettings, decide
    from numa_pin.ledger.model import Grant, LedgerState
    from numa_pin.requests.request import request_from_oci

    header = f"{'full decision':<14} {'nodes':>5} {'policy':<17} {'ms':>8}  result"
    print(header)
    print("-" * len(header))
    request = request_from_oci("bench", {"numa-pin.io/cpus": "8", "numa-pin.io/memory": "16Gi",
                                         "numa-pin.io/devices": "nvidia.com/gpu=1"})
    for n in (2, 4, 8, 16, 32, 64):
        topo = synthetic_topology(n)
        rng = random.Random(n)
        used = frozenset(rng.sample(sorted(topo.cpu_ids - {0}), len(topo.cpus) // 4))
        state = LedgerState(grants={"busy": Grant("busy", "busy", "busy", "exclusive", cpus=used,
                                                   mems=frozenset(topo.nodes))})
        for policy in POLICIES:
            settings = NodeSettings(policy=policy, policy_options={"max-allowable-numa-nodes": str(max(8, n))})

            def run(settings: NodeSettings = settings) -> object:
                return decide(topo, state, request, settings)

            decision = run()
            ms = median_time(run, runs) * 1000
            verdict = f"cpus on nodes {sorted({topo.cpus[c].numa for c in decision.cpus})}" if decision.admit \
                else "rejected"
            print(f"{'':<14} {n:>5} {policy:<17} {ms:8.2f}  {verdict}")


if __name__ == "__main__":
    main()
