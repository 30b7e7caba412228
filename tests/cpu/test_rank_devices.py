"""``numa-pin run --ranks N --bind-devices closest``: each rank gets the granted GPUs and NICs
nearest its CPUs, shared out evenly (issue 40).

Oracle for nearness: the kit machine's sysfs files, read here directly: a device's node is its
``numa_node`` or, when that is -1, the node whose ``cpulist`` is its ``local_cpulist``; a
rank's nodes are the nodes whose ``cpulist`` holds one of its CPUs. The shares come from
``distribute`` (proved against ``hwloc-distrib`` in ``test_rank_shares.py``). The exact rounds
of the rule (``numa_pin.allocators.devbind``'s doc) are worked by hand in ``EXACT``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from numa_pin.allocators.devbind import bind_closest
from numa_pin.allocators.distrib import distribute
from numa_pin.base.cpuset import parse_list
from numa_pin.base.record import replace
from numa_pin.cli.main import main
from numa_pin.cli.run_grant import rank_env
from numa_pin.ledger.model import Grant
from numa_pin.testing.machine import build, build_once
from numa_pin.testing.node import FakeNode
from numa_pin.testing.pci_spec import CLASS_3D, CLASS_ETHERNET, CLASS_PCI_BRIDGE, PciSpec
from numa_pin.testing.shapes import shape
from numa_pin.testing.spec import MachineSpec
from numa_pin.topology.discover import discover
from numa_pin.topology.model import Topology

GPU_RES, VF_RES = "nvidia.com/gpu", "intel.com/sriov_vf"


class Machine:
    """A built kit shape: its topology (the code under test's view) and its sysfs tree."""

    def __init__(self, name: str | MachineSpec, base: Path) -> None:
        built = build_once(shape(name), base) if isinstance(name, str) else build(name, base)
        self.sysfs, self.proc = Path(built.sysfs_root), Path(built.proc_root)
        self.topology: Topology = discover(built.sysfs_root, built.proc_root)

    def read(self, *parts: str) -> str:
        return self.sysfs.joinpath(*parts).read_text().strip("\0\n ")

    def node_cpus(self) -> dict[int, frozenset[int]]:
        root = self.sysfs / "devices" / "system" / "node"
        return {int(d.name[4:]): parse_list(self.read("devices", "system", "node", d.name, "cpulist"))
                for d in root.iterdir() if d.name.startswith("node") and d.name[4:].isdigit()}

    def device_node(self, address: str) -> int | None:
        node = int(self.read("bus", "pci", "devices", address, "numa_node"))
        if node >= 0:
            return node
        local = parse_list(self.read("bus", "pci", "devices", address, "local_cpulist"))
        matches = [n for n, cpus in self.node_cpus().items() if cpus == local]
        return matches[0] if len(matches) == 1 else None

    def gpus(self) -> list[str]:
        root = self.sysfs / "bus" / "pci" / "devices"
        return sorted(a.name for a in root.iterdir() if self.read("bus", "pci", "devices", a.name, "class")
                      == CLASS_3D)

    def vfs(self) -> list[str]:
        root = self.sysfs / "bus" / "pci" / "devices"
        return sorted(a.name for a in root.iterdir() if (a / "physfn").exists())

    def uuid(self, address: str) -> str:
        text = (self.proc / "driver" / "nvidia" / "gpus" / address / "information").read_text()
        return next(v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines()) if k.strip() == "GPU UUID")


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    base = tmp_path_factory.getbasetemp() / "machines"
    cache: dict[str, Machine] = {}

    def get(name: str) -> Machine:
        if name not in cache:
            cache[name] = Machine(name, base)
        return cache[name]
    return get


def _cpus(m: Machine, nodes: tuple[int, ...] | None) -> frozenset[int]:
    table = m.node_cpus()
    return frozenset().union(*(table[n] for n in (nodes if nodes is not None else table)))


def _gpus(m: Machine, nodes: tuple[int, ...] | None) -> tuple[str, ...]:
    return tuple(a for a in m.gpus() if nodes is None or m.device_node(a) in nodes)


# (shape, NUMA nodes of the granted CPUs, nodes of the granted GPUs; None: all)
GRANTS = [
    ("gpu8-sriov", None, None),
    ("gpu8-sriov", None, (0, 1)),
    ("gpu8-sriov", None, (2,)),
    ("gpu8-sriov", (0, 1), None),
    ("gpu8-sriov", (1, 2, 3), (0, 3)),
    ("pci-numa-node-unknown", None, None),
]
COUNTS = (2, 3, 4, 5, 8, 16)


@pytest.mark.parametrize("ranks", COUNTS, ids=[f"{n}-ranks" for n in COUNTS])
@pytest.mark.parametrize("name, cpu_nodes, gpu_nodes", GRANTS,
                         ids=["gpu8-all", "gpu8-gpus-of-0-1", "gpu8-gpus-of-2", "gpu8-cpus-of-0-1",
                              "gpu8-cpus-1-3-gpus-0-3", "node-unknown"])
def test_ranks_get_the_gpus_of_their_node_and_even_shares(machines, name, cpu_nodes, gpu_nodes, ranks):
    m = machines(name)
    gpus = _gpus(m, gpu_nodes)
    assert gpus, "the grant under test holds GPUs"
    shares = distribute(m.topology, _cpus(m, cpu_nodes), ranks)
    bound = [b[GPU_RES] for b in bind_closest(m.topology, shares, {GPU_RES: gpus})]
    node_cpus = m.node_cpus()
    rank_nodes = [{n for n, cpus in node_cpus.items() if cpus & share} for share in shares]
    local = [{g for g in gpus if m.device_node(g) in nodes} for nodes in rank_nodes]
    holders = {g: {r for r, got in enumerate(bound) if g in got} for g in gpus}
    for r, got in enumerate(bound):
        if set(got) - local[r] or not set(got) & local[r]:
            # a remote GPU (or none of its own) only when those of its nodes went to ranks on their node
            for g in local[r]:
                assert all(m.device_node(g) in rank_nodes[h] for h in holders[g]), (r, g, holders[g])
    for n in node_cpus:  # as many ranks of one node hold one of its GPUs as there are of either
        ranks_on = [r for r, nodes in enumerate(rank_nodes) if nodes == {n}]
        gpus_on = {g for g in gpus if m.device_node(g) == n}
        served = [r for r in ranks_on if set(bound[r]) & gpus_on]
        assert len(served) >= min(len(ranks_on), len(gpus_on)), (n, ranks_on, gpus_on, bound)
    counts = sorted(len(got) for got in bound)
    if len(gpus) >= ranks:
        assert sorted(g for got in bound for g in got) == sorted(gpus), "every GPU goes to exactly one rank"
        assert counts[0] == len(gpus) // ranks and counts[-1] == -(-len(gpus) // ranks)
    else:
        assert counts == [1] * ranks
        loads = sorted(len(h) for h in holders.values())
        assert loads[0] == ranks // len(gpus) and loads[-1] == -(-ranks // len(gpus))


# worked by hand from the rule: gpu8-sriov's GPUs, in PCI order, are 2 per node (0, 1 on node 0)
EXACT = [
    # as many GPUs as ranks, one rank per GPU: rank i, GPU i (torchrun's mapping)
    (None, None, 8, [[i] for i in range(8)]),
    # 16 ranks, 4 per node: round 1 gives each GPU the lowest rank of its node, round 2 the next
    (None, None, 16, [[2 * (i // 4) + i % 2] for i in range(16)]),
    # 3 ranks on nodes 0 | 1 | 2-3: two rounds of one each; the last 2 (node 3's) go to rank 2
    # (10.5 away) and then rank 0 (21 away, ties to the lower rank)
    (None, None, 3, [[0, 1, 7], [2, 3], [4, 5, 6]]),
    # node 0's 2 GPUs, 4 ranks (nodes 0 | 1 | 2 | 3): each serves 2 ranks, nearest first
    (None, (0,), 4, [[0], [1], [0], [1]]),
]


@pytest.mark.parametrize("cpu_nodes, gpu_nodes, ranks, want", EXACT,
                         ids=["one-each", "ranks-outnumber", "gpus-outnumber", "balance-over-nearness"])
def test_the_exact_rule(machines, cpu_nodes, gpu_nodes, ranks, want):
    m = machines("gpu8-sriov")
    everything = m.gpus()
    shares = distribute(m.topology, _cpus(m, cpu_nodes), ranks)
    got = bind_closest(m.topology, shares, {GPU_RES: _gpus(m, gpu_nodes)})
    assert [[everything.index(a) for a in b[GPU_RES]] for b in got] == want


def test_each_rank_is_told_its_gpus_and_vfs(machines):
    """Per rank, ``CUDA_VISIBLE_DEVICES`` is its GPUs' UUIDs (the driver's files) and
    ``PCIDEVICE_*`` its VFs; VFs (E810's on node 0, ConnectX-6's on node 3) follow the CPUs."""
    m = machines("gpu8-sriov")
    vfs = m.vfs()
    grant = Grant("job-1", "", "job-1", "process", cpus=_cpus(m, None),
                  devices={GPU_RES: tuple(m.gpus()), VF_RES: tuple(vfs)})
    shares = distribute(m.topology, grant.cpus, 4)
    for r, devs in enumerate(bind_closest(m.topology, shares, grant.devices)):
        env = rank_env(shares[r], r, 4, m.topology, replace(grant, devices=devs))
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(m.uuid(a) for a in devs[GPU_RES])
        assert env["PCIDEVICE_INTEL_COM_SRIOV_VF"] == ",".join(devs[VF_RES])
        assert (env["NUMA_PIN_RANK"], env["NUMA_PIN_RANKS"]) == (str(r), "4")
        rank_node = {n for n, cpus in m.node_cpus().items() if cpus & shares[r]}
        assert {m.device_node(a) for a in devs[GPU_RES]} == rank_node
        if rank_node & {0, 3}:
            assert {m.device_node(a) for a in devs[VF_RES]} == rank_node


def test_the_grant_file_names_each_ranks_devices(machines):
    from numa_pin.cli.cmd_run import _payload

    m = machines("gpu8-sriov")
    grant = Grant("job-1", "", "job-1", "process", cpus=_cpus(m, None), devices={GPU_RES: tuple(m.gpus())})

    class Service:
        topology = m.topology

    payload, path, _ = _payload(Service(), grant, 2, "closest")
    try:
        doc = json.loads(Path(path).read_text())
    finally:
        os.unlink(path)
    halves = [m.gpus()[:4], m.gpus()[4:]]
    assert [r["devices"] for r in doc["ranks"]] == [{GPU_RES: h} for h in halves]
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in payload["ranks"]] == [
        ",".join(m.uuid(a) for a in h) for h in halves]
    plain, path, _ = _payload(Service(), grant, 2)
    os.unlink(path)
    assert all("CUDA_VISIBLE_DEVICES" not in r["env"] for r in plain["ranks"]), "none: every rank sees every GPU"


def test_closest_without_devices_is_refused_in_one_line(tmp_path, tmp_path_factory, monkeypatch, capsys):
    node = FakeNode(tmp_path / "node", "gpu8-sriov", machines=tmp_path_factory.getbasetemp() / "machines")
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    config = str(node.write_config(policy="restricted", kubelet_root=str(node.root / "no-kubelet")))
    marker = tmp_path / "ran"
    code = main(["run", "--config", config, "--cpus", "4", "--ranks", "2", "--bind-devices", "closest",
                 "--", "touch", str(marker)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "RequestError" in err and "--bind-devices" in err and "--devices" in err
    assert not marker.exists()


def _paired_machine() -> MachineSpec:
    """One node; GPU ``0000:11:00.0`` on root bus 0x10, whose other root port leads to NIC
    ``0000:95:00.0``; GPU ``0000:81:00.0`` on root bus 0x80, whose other root port leads to NIC
    ``0000:85:00.0``: by address the NICs would pair the other way round."""
    pci = []
    for root, gpu_bus, nic_bus in ((0x10, 0x11, 0x95), (0x80, 0x81, 0x85)):
        pci += [PciSpec(f"0000:{root:02x}:01.0", "0x8086", "0x347a", CLASS_PCI_BRIDGE, 0, driver="pcieport"),
                PciSpec(f"0000:{gpu_bus:02x}:00.0", "0x10de", "0x20b2", CLASS_3D, 0, driver="nvidia",
                        parent=f"0000:{root:02x}:01.0"),
                PciSpec(f"0000:{root:02x}:02.0", "0x8086", "0x347a", CLASS_PCI_BRIDGE, 0, driver="pcieport"),
                PciSpec(f"0000:{nic_bus:02x}:00.0", "0x8086", "0x1592", CLASS_ETHERNET, 0, driver="ice",
                        netdevs=(f"ens{nic_bus}",), parent=f"0000:{root:02x}:02.0")]
    return MachineSpec(name="gpu-nic-pairs", sockets=1, cores_per_node=4, threads_per_core=1, pci=tuple(pci))


def test_a_nic_goes_with_the_rank_whose_gpu_shares_its_pcie_root(tmp_path):
    """Equally near by NUMA, a NIC goes to the rank whose GPU it shares more of the PCIe tree
    with. Oracle: the sysfs device paths (``/sys/devices/pci<root>/...``), the longest common
    path between the NIC and the rank's GPU."""
    m = Machine(_paired_machine(), tmp_path)
    gpus = m.gpus()
    nics = sorted(a for a in os.listdir(m.sysfs / "bus" / "pci" / "devices")
                  if m.read("bus", "pci", "devices", a, "class") == CLASS_ETHERNET)
    shares = distribute(m.topology, _cpus(m, None), 2)
    bound = bind_closest(m.topology, shares, {"example.com/nic": tuple(nics), GPU_RES: tuple(gpus)})
    path = {a: os.path.realpath(m.sysfs / "bus" / "pci" / "devices" / a).split(os.sep) for a in [*gpus, *nics]}

    def shared(a: str, b: str) -> int:
        return len(os.path.commonprefix([path[a], path[b]]))
    for devs in bound:
        (gpu,), (nic,) = devs[GPU_RES], devs["example.com/nic"]
        assert shared(nic, gpu) == max(shared(n, gpu) for n in nics) > min(shared(n, gpu) for n in nics)
    assert [d["example.com/nic"] for d in bound] != [(n,) for n in nics], "not merely the address order"
