"""``numa-pin run --ranks N``: the grant's CPUs split into N shares as ``hwloc-distrib`` splits them.

Oracle: hwloc's own ``hwloc-distrib --input <kit root> --restrict <cpus> N`` on every kit
machine shape (hwloc reads the kit's sysfs tree as it reads a real one), for the whole machine,
its first half and a scattered third, and a range of N. Three shapes are there for this (issue
37): ``opteron-6276``, whose ``core_id`` names neither a core nor a compute unit (hwloc's cores
are the thread siblings); ``uv-blades``, whose SLIT makes hwloc group the nodes above the
packages; and ``power7-lpar``, whose packages are its cores (``core_siblings`` is one core,
``physical_package_id`` -1; hwloc reads no device tree, so the ``ibm,chip-id`` there changes
nothing) and whose SLIT groups its chips by two.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from numa_pin.allocators.distrib import distribute
from numa_pin.testing.machine import build_once
from numa_pin.testing.shapes import SHAPES, shape
from numa_pin.topology.discover import discover
from numa_pin.topology.model import Topology

pytestmark = pytest.mark.lstopo
COUNTS = (1, 2, 3, 5, 8, 16)
HWLOC_DISTRIB = shutil.which("hwloc-distrib")


def hwloc_mask(cpus: frozenset[int]) -> str:
    """hwloc's bitmap text: 32-bit words, highest first, comma-separated."""
    value, words = sum(1 << c for c in cpus), []
    while True:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        if not value:
            break
    return ",".join(f"0x{w:08x}" for w in reversed(words))


def parse_hwloc_mask(text: str) -> frozenset[int]:
    value = 0
    for word in text.split(","):
        value = (value << 32) | (int(word, 16) if word else 0)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def _machine(name: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Topology, str]:
    built = build_once(shape(name), tmp_path_factory.getbasetemp() / "machines")
    return discover(built.sysfs_root, built.proc_root), str(Path(built.sysfs_root).parent)


def _subsets(topology: Topology) -> dict[str, frozenset[int]]:
    cpus = sorted(topology.cpu_ids)
    return {"all": frozenset(cpus), "first-half": frozenset(cpus[: max(1, len(cpus) // 2)]),
            "scattered-third": frozenset(random.Random(len(cpus)).sample(cpus, max(1, len(cpus) // 3)))}


@pytest.mark.skipif(HWLOC_DISTRIB is None, reason="hwloc-distrib is not installed")
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shares_are_hwloc_distribs(name, tmp_path_factory):
    distrib = HWLOC_DISTRIB
    assert distrib is not None
    topology, root = _machine(name, tmp_path_factory)
    for label, cpus in _subsets(topology).items():
        for n in COUNTS:
            done = subprocess.run([distrib, "--input", root, "--restrict", hwloc_mask(cpus), str(n)],
                                  capture_output=True, text=True, timeout=60, check=True)
            want = [parse_hwloc_mask(t) for t in done.stdout.split()]
            assert distribute(topology, cpus, n) == want, (label, n)


@pytest.mark.parametrize("name", ["intel-2s-ht", "amd-nps4-8node", "hybrid-pe"])
def test_every_cpu_is_in_some_share_and_counts_match(name, tmp_path_factory):
    topology, _ = _machine(name, tmp_path_factory)
    cpus = frozenset(topology.cpu_ids)
    for n in (1, 2, 3, 7, len(cpus), 2 * len(cpus)):
        shares = distribute(topology, cpus, n)
        assert len(shares) == n
        assert frozenset().union(*shares) == cpus
        if n <= len({topology.cpus[c].core_key for c in cpus}):
            assert all(not a & b for i, a in enumerate(shares) for b in shares[i + 1:]), n


@pytest.mark.parametrize("n, cpus, message", [(0, {0}, "positive"), (2, set(), "no CPUs"), (1, {10_000}, "online")],
                         ids=["zero-shares", "no-cpus", "offline-cpu"])
def test_bad_arguments(n, cpus, message, tmp_path_factory):
    topology, _ = _machine("laptop", tmp_path_factory)
    with pytest.raises(ValueError, match=message):
        distribute(topology, frozenset(cpus), n)
