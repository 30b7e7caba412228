"""A node and the runtimes of every path, for the every-path matrix (tests/nri/test_every_path.py).

:class:`MatrixNode` is the kit's ``laptop`` (8 CPUs, one NUMA node) with the files every
isolation knob writes: each CPU's PM QoS latency, cpufreq policies, a fake ``/proc/irq``, a
cgroup v1 ``cpu`` hierarchy beside the ``cpuset`` one, and a root cpuset that balances nothing
(where ``cpu-load-balancing`` can take effect on cgroup v1). Each path gets a node of its own.
A GPU node (:meth:`MatrixNode.gpus`) is the kit's ``gpudirect`` machine (``gpu8-sriov`` with an
RDMA NIC and a vfio-bound VF) with the NVIDIA driver's files, a CDI spec and a cgroup v1
``devices`` hierarchy (:mod:`.every_path_devices`). A VF node (:meth:`MatrixNode.vfs`) is that node
with SR-IOV VFs as a resource and a netlink fake holding them (:mod:`.every_path_vfs`).

:func:`run_path` runs one request through a path the way its runtime does, to the container's
first process:

* ``prestart``: the runtime makes the container's cgroup (and the config's devices) and starts
  ``numa-pin-hook prestart``;
* ``precreate-1.0``/``precreate-1.3``: podman runs ``numa-pin-hook precreate`` with the config it
  proposes (runtime-spec 1.0.2 or 1.3), applies the config that comes back (the container's
  cpuset and CFS quota, its device nodes and rules, as runc writes them), then runs the prestart
  hook with that config as the bundle's ``config.json``;
* ``nri``: containerd sends ``CreateContainer``, applies the adjustment the same way, starts the
  process and sends ``StartContainer``.

A request is its annotations and, in :class:`Asks`, what else its config carries (the device
plugin's variables, ``linux.devices``). What a user sees is returned as an :class:`Outcome`: the
grant the ledger keeps, the one line said, the variables the runtime sets, every host file that
changed (the container's cgroup named ``<container>``), and on a GPU node the container's device
nodes and device rules, and on a VF node where its VFs are and their PF-side state, so two paths
can be compared file by file.
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.entry import hook as hook_main
from numa_pin.ledger.model import Grant
from numa_pin.ledger.store import Ledger
from numa_pin.nri import messages as nri_messages
from numa_pin.service.node import NodeService
from numa_pin.testing import devtree, machine
from numa_pin.testing.node import FakeNode
from numa_pin.testing.spec import MachineSpec

from .every_path_devices import ContainerDevices, Node, kernel
from .every_path_vfs import VF_RESOURCES, runtime_moves, seen, world
from .fake_runtime import Connected, container, pod

SHAPE = "laptop"
#: the GPU node's machine: ``gpu8-sriov`` with device nodes, a ConnectX NIC with RDMA verbs behind
#: node 1's GPU switch and an E810 VF bound to vfio-pci (:func:`numa_pin.testing.devtree.gpudirect`)
GPU_SHAPE = devtree.gpudirect()
#: the GPU node's device resources besides the GPUs: the switch's RDMA NIC, the vfio-bound VF
RDMA, DPDK = "example.com/rdma", "example.com/dpdk"
GPU_RESOURCES = {"nvidia.com/gpu": [{"vendors": ["0x10de"], "classes": ["0x0302"]}],
                 RDMA: [{"addresses": [devtree.SWITCH_NIC]}], DPDK: [{"drivers": ["vfio-pci"]}]}
#: the kind of the CDI spec a GPU node's DRA driver wrote
CDI_KIND = "k8s.gpu.nvidia.com/claim"
CID = "0f2a83a2d618ece3563383e4d2c110bfc35717b71b479661529c6d7a83acaedb"
PID = 4242
PATHS = ["prestart", "precreate-1.0", "precreate-1.3", "nri"]
#: where each path's runtime puts the container's cgroup (under the cpuset and cpu hierarchies)
PARENTS = {"prestart": "ctr", "precreate": "libpod_parent", "nri": "kubepods/burstable/podu1"}
CPU_V1 = "cpu,cpuacct"
IRQS = {0: "0-7", 9: "0-7", 24: "0-7", 25: "2-3"}
#: cpufreq policies: CPUs 2 and 3 share one
POLICIES = {"policy0": "0", "policy1": "1", "policy2": "2-3", "policy4": "4", "policy5": "5", "policy6": "6",
            "policy7": "7"}


@dataclass
class Outcome:
    """What one path gave one request: ``grant`` None when refused (``text`` is then the line)."""

    grant: Grant | None
    text: str
    cpus: frozenset[int] | None  # the container's cpuset as the process runs (None: never started)
    env: dict[str, str] = field(default_factory=dict)
    changed: dict[str, str] = field(default_factory=dict)  # host file -> its text after, if it changed
    stage: str = ""  # a refusal's: "" the runtime's first call (precreate, CreateContainer), else the later one
    pool: frozenset[int] = frozenset()  # the node's CPUs (a shared container's cpuset)
    #: on a GPU node: the container's device nodes (path, type, major, minor) and the rules of
    #: its devices cgroup beside runc's defaults, whoever made them (:mod:`.every_path_devices`)
    devices: frozenset[Node] = frozenset()
    rules: frozenset[str] = frozenset()
    files: dict[str, str] = field(default_factory=dict)  # what numa-pin wrote into the container
    #: on a VF node: where each VF's interface is away from the host (``<container>``: the
    #: container's network namespace) and its name there, and the PF-side state of each VF that
    #: changed (:mod:`.every_path_vfs`)
    vfs: dict[str, tuple[str, str]] = field(default_factory=dict)
    pf: dict[int, dict[str, Any]] = field(default_factory=dict)


class MatrixNode(FakeNode):
    """The laptop (or another kit ``shape``) with every isolation knob's files; ``parent`` is
    where containers' cgroups go."""

    devices: ContainerDevices | None = None  # a GPU node's container devices (:meth:`gpus`)
    net: Any = None  # a VF node's netlink world (:meth:`vfs`)

    def __init__(self, root: Path, parent: str, shape: str | MachineSpec = SHAPE, machines: Path | None = None) -> None:
        super().__init__(root, shape, machines=machines or root / "machines", parent=parent)
        self.machines = machines or root / "machines"
        self.shape = shape
        (self.proc_root / "devices").write_text("Character devices:\n  1 mem\n\nBlock devices:\n")
        self.cpu_dir = self.sysfs_root / "devices" / "system" / "cpu"
        for n in parse_list(self.cpus):
            (self.cpu_dir / f"cpu{n}" / "power").mkdir(exist_ok=True)
            (self.cpu_dir / f"cpu{n}" / "power" / "pm_qos_resume_latency_us").write_text("0\n")
        for name, cpus in POLICIES.items():
            d = self.cpu_dir / "cpufreq" / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "related_cpus").write_text(" ".join(str(c) for c in sorted(parse_list(cpus))) + "\n")
            (d / "scaling_governor").write_text("powersave\n")
            (d / "scaling_available_governors").write_text("performance powersave\n")
        (self.cpu_dir / "isolated").write_text("\n")
        irq = self.proc_root / "irq"
        for n, cpus in IRQS.items():
            (irq / str(n)).mkdir(parents=True)
            (irq / str(n) / "smp_affinity_list").write_text(cpus + "\n")
        (irq / "default_smp_affinity").write_text("ff\n")
        with open(self.proc_root / "self" / "mountinfo", "a") as f:
            f.write(f"36 25 0:31 / {self.cgroup_root}/{CPU_V1} rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n")
        (self.cgroup_root / "cpuset" / "cpuset.sched_load_balance").write_text("0\n")
        if shape == SHAPE:
            pages = self.sysfs_root / "devices/system/node/node0/hugepages/hugepages-2048kB"
            pages.mkdir(parents=True, exist_ok=True)
            for leaf, count in (("nr_hugepages", 16), ("free_hugepages", 16), ("surplus_hugepages", 0)):
                (pages / leaf).write_text(f"{count}\n")

    def gpus(self) -> None:
        """A GPU node (:data:`GPU_SHAPE`: node ``n`` has GPUs ``2n`` and ``2n + 1``): the NVIDIA driver's
        ``/proc`` files and majors, a CDI spec naming each GPU as a DRA driver does
        (``k8s.gpu.nvidia.com/claim=gpu<minor>``, in ``cdi_spec_dirs``), and a
        cgroup v1 ``devices`` hierarchy whose container's rules and ``/dev`` are
        :attr:`devices`."""
        assert self.shape == GPU_SHAPE
        built = machine.build_once(GPU_SHAPE, self.machines)
        shutil.copytree(built.proc_root / "driver", self.proc_root / "driver")
        (self.proc_root / "devices").write_text(
            "Character devices:\n  1 mem\n195 nvidia\n507 nvidia-uvm\n\nBlock devices:\n")
        gpus = {d.gpu_minor: d for d in machine.expected_topology(GPU_SHAPE).pci_devices
                if d.gpu_minor is not None}
        devtree.write_cdi_spec(self.root / "cdi", CDI_KIND, {
            f"gpu{i}": [(f"/dev/nvidia{i}", 195, i)] for i in sorted(gpus)}, shared=[("/dev/nvidiactl", 195, 255)])
        with open(self.proc_root / "self" / "mountinfo", "a") as f:
            f.write(f"37 25 0:32 / {self.cgroup_root}/devices rw,nosuid - cgroup cgroup rw,devices\n")
        (self.cgroup_root / "devices").mkdir()
        self.devices = ContainerDevices(self.cgroup_root / "devices" / self.parent / "_")

    def vfs(self) -> None:
        """A VF node: the GPU node whose E810 PF's VFs with a network interface are a resource,
        with the netlink fake's PF and VFs (:mod:`.every_path_vfs`); each container gets a
        network namespace of its own."""
        self.gpus()
        self.net = world(self.proc_root)

    def config_dict(self, **extra: object) -> dict[str, object]:
        resources = {**GPU_RESOURCES, **(VF_RESOURCES if self.net is not None else {})}
        cdi = {"cdi_spec_dirs": [str(self.root / "cdi")], "devices": resources} if self.devices is not None else {}
        return super().config_dict(**cdi, **extra)

    def balancing_root(self) -> None:
        """The root cpuset balances load, as a node does until someone turns it off."""
        (self.cgroup_root / "cpuset" / "cpuset.sched_load_balance").write_text("1\n")

    def add_container(self, name: str, pid: int, cpus: str | None = None, *, netns: str | None = None) -> int:
        """The cgroups a runtime makes before the first hook: cpuset (with its balancing flag on,
        as the kernel makes it) and cpu (kubelet's or podman's quota), and ``proc/<pid>``."""
        super().add_container(name, pid, cpus, netns=netns)
        top, here = self.cgroup_root / "cpuset", self.cgroup_root / CPU_V1
        for part in [*Path(self.parent).parts, name]:  # its parents are balanced and have no quota
            top, here = top / part, here / part
            here.mkdir(parents=True, exist_ok=True)
            (here / "cpu.cfs_period_us").write_text("100000\n")
            (here / "cpu.cfs_quota_us").write_text("-1\n")
            if not (top / "cpuset.cpus").exists():
                self._write_cpuset(top, self.cpus)
            (top / "cpuset.sched_load_balance").write_text("1\n")
        (here / "cpu.cfs_quota_us").write_text("50000\n")  # the container's own limit
        rel = "/".join(p for p in (self.parent, name) if p)
        lines = f"4:cpuset:/{rel}\n3:cpu,cpuacct:/{rel}\n"
        if self.devices is not None:
            self.devices.directory = self.cgroup_root / "devices" / rel
            self.devices.directory.mkdir(parents=True)
            for leaf in ("devices.allow", "devices.deny"):
                (self.devices.directory / leaf).write_text("")
            lines += f"2:devices:/{rel}\n"
        (self.proc_root / str(pid) / "cgroup").write_text(lines)
        if self.net is not None:
            self.net.add_netns(pid)
        return pid

    def oci_state(self, container_id: str, pid: int, annotations: dict[str, str] | None = None,
                  spec: dict[str, Any] | None = None) -> bytes:
        """As the kit's, with the bundle's ``config.json`` the whole ``spec`` when given."""
        state = super().oci_state(container_id, pid, annotations)
        if spec is not None:
            bundle = self.root / "bundles" / container_id
            (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, **spec}))
        return state

    def cpu_cgroup(self, name: str) -> Path:
        return self.cgroup_root / CPU_V1 / self.parent / name

    def apply(self, name: str, cpus: str, mems: str, quota: int | None) -> None:
        """What runc writes from the config a runtime hands it: the cpuset and the CFS quota."""
        d = self.cgroup_dir(name)
        if cpus:
            (d / "cpuset.cpus").write_text(cpus + "\n")
        if mems:
            (d / "cpuset.mems").write_text(mems + "\n")
        if quota is not None:
            (self.cpu_cgroup(name) / "cpu.cfs_quota_us").write_text(f"{quota}\n")

    def files(self, name: str) -> dict[str, str]:
        """Every host file a grant may change, named from the node's roots. The container's own
        cgroups are ``<container>`` and the cgroups between them and the root ``<parent>``,
        whatever the runtime called them."""
        out: dict[str, str] = {}
        for top, label in ((self.cpu_dir, "sys/cpu"), (self.proc_root / "irq", "proc/irq"),
                           (self.cgroup_root, "cgroup")):
            for path in sorted(p for p in top.rglob("*") if p.is_file() and not p.name.startswith("devices.")):
                rel = path.relative_to(top).parts
                if label == "cgroup":
                    rel = (rel[0], *self._cgroup_name(list(rel[1:-1]), name), rel[-1])
                out["/".join((label, *rel))] = path.read_text().strip()
        return out

    def _cgroup_name(self, dirs: list[str], name: str) -> list[str]:
        parents = list(Path(self.parent).parts)
        if dirs[:len(parents) + 1] == [*parents, name]:
            return ["<container>", *dirs[len(parents) + 1:]]
        if dirs and dirs == parents[:len(dirs)]:
            return ["<parent>"]
        return dirs


def node_for(tmp_path: Path, path: str, setup: str | None = None, machines: Path | None = None) -> MatrixNode:
    """A fresh node for ``path``; ``setup`` names a :class:`MatrixNode` method that changes it.
    ``gpus`` is a node of :data:`GPU_SHAPE` whose sysfs tree, built once in ``machines``,
    every GPU node shares (its rows set no isolation knob, so none writes there)."""
    gpus = setup in ("gpus", "vfs")
    node = MatrixNode(tmp_path / path, PARENTS[path.split("-")[0]], GPU_SHAPE if gpus else SHAPE,
                      machines if gpus else None)
    if setup is not None:
        getattr(node, setup)()
    return node


def config_file(node: MatrixNode, monkeypatch: Any, tmp_path: Path) -> Path:
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return node.write_config(node.root / "config.yaml", policy="restricted")


def hook(cfg: Path, stage: str, stdin: bytes) -> tuple[int, bytes]:
    out = io.BytesIO()
    return hook_main.run(["--config", str(cfg), stage], io.BytesIO(stdin), out), out.getvalue()


@dataclass
class Asks:
    """What a request carries besides its annotations: the device plugin's variables
    (``process.env``) and the device nodes the runtime was told to make (``linux.devices``,
    each with its allow rule in ``linux.resources.devices``, as ``podman --device`` writes them)."""

    env: dict[str, str] = field(default_factory=dict)
    devices: tuple[Node, ...] = ()

    def env_list(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.env.items()]

    def linux_devices(self) -> list[dict[str, Any]]:
        return [{"path": p, "type": t, "major": a, "minor": b} for p, t, a, b in self.devices]

    def rules(self) -> list[dict[str, Any]]:
        return [{"allow": True, "type": t, "major": a, "minor": b, "access": "rwm"} for _, t, a, b in self.devices]


def _spec_devices(linux: dict[str, Any]) -> tuple[list[Node], list[dict[str, Any]]]:
    """The device nodes and rules of a config's ``linux``, as a runtime reads them."""
    nodes = [(d["path"], d.get("type", "c"), d["major"], d["minor"]) for d in linux.get("devices", [])]
    return nodes, linux.get("resources", {}).get("devices", [])


def _prestart(node: MatrixNode, cfg: Path, annotations: dict[str, str], spec: dict[str, Any]) -> bool:
    """The runtime's prestart hook for the container, its cgroup made and its process ``PID``;
    ``spec`` is the rest of its ``config.json``."""
    rc, _ = hook(cfg, "prestart", node.oci_state(CID, PID, annotations, spec))
    return rc == 0


def _plain_prestart(node: MatrixNode, cfg: Path, annotations: dict[str, str], asks: Asks) -> bool:
    """runc: the config's devices made and allowed, then the prestart hook."""
    spec = {"annotations": annotations, "process": {"env": asks.env_list()},
            "linux": {"devices": asks.linux_devices(), "resources": {"devices": asks.rules()}}}
    node.add_container(CID, PID)
    if node.devices is not None:
        node.devices.runtime(list(asks.devices), asks.rules())
    return _prestart(node, cfg, annotations, spec)


def _precreate(node: MatrixNode, cfg: Path, annotations: dict[str, str], version: str,
               env: dict[str, str], asks: Asks) -> str | None:
    """None when the process runs; else the stage that refused ("" the first)."""
    name = f"libpod-{CID}"
    doc = {"ociVersion": version, "process": {"args": ["sh"], "env": ["PATH=/usr/bin", *asks.env_list()]},
           "annotations": {"io.container.manager": "libpod", **annotations},
           "linux": {"cgroupsPath": f"/{node.parent}/{name}", "devices": asks.linux_devices(),
                     "resources": {"devices": asks.rules()}}}
    rc, out = hook(cfg, "precreate", json.dumps(doc).encode())
    if rc != 0:
        return ""
    spec = json.loads(out)
    env.update(kv.split("=", 1) for kv in spec["process"]["env"] if kv != "PATH=/usr/bin")
    cpu = spec["linux"]["resources"].get("cpu", {})
    node.add_container(name, PID)
    node.apply(name, cpu.get("cpus", ""), cpu.get("mems", ""), cpu.get("quota"))
    if node.devices is not None:
        node.devices.runtime(*_spec_devices(spec["linux"]))
    if node.net is not None:
        runtime_moves(node.net, PID, {host: d["name"] for host, d in spec["linux"].get("netDevices", {}).items()})
    return None if _prestart(node, cfg, spec["annotations"], spec) else "prestart"


def _nri_container(m: Any, p: Any, annotations: dict[str, str], asks: Asks, **started: int) -> Any:
    msg = container(m, p, CID, cpu_milli=100, annotations=annotations, **started)
    msg.env.extend(asks.env_list())
    for path, kind, major, minor in asks.devices:
        dev = msg.linux.devices.add()
        dev.path, dev.type, dev.major, dev.minor = path, kind, major, minor
        rule = msg.linux.resources.devices.add()
        rule.allow, rule.type, rule.access = True, kind, "rwm"
        rule.major.value, rule.minor.value = major, minor
    return msg


def _nri(node: MatrixNode, annotations: dict[str, str], env: dict[str, str], asks: Asks) -> tuple[str | None, str]:
    m = nri_messages.load()
    conn = Connected(NodeService(config_from_dict(node.config_dict(policy="restricted"))), m)
    try:
        conn.runtime.configure()
        conn.runtime.synchronize([], [])
        p = pod(m, "u1", "p", "burstable")
        code, text, reply = conn.runtime.create(p, _nri_container(m, p, annotations, asks))
        if code != 0:
            return "", text
        adjust = reply.adjust
        env.update({**asks.env, **{kv.key: kv.value for kv in adjust.env}})
        cpu = adjust.linux.resources.cpu
        node.add_container(CID, PID)
        node.apply(CID, cpu.cpus, cpu.mems, cpu.quota.value if cpu.HasField("quota") else None)
        if node.devices is not None:  # containerd: the container's devices, then the adjustment's
            nodes = [*asks.devices, *((d.path, d.type, d.major, d.minor) for d in adjust.linux.devices)]
            rules = [*asks.rules(), *({"allow": r.allow, "type": r.type, "access": r.access,
                                       "major": r.major.value if r.HasField("major") else None,
                                       "minor": r.minor.value if r.HasField("minor") else None}
                                      for r in adjust.linux.resources.devices)]
            node.devices.runtime(nodes, rules)
        if node.net is not None:
            runtime_moves(node.net, PID, {host: d.name for host, d in adjust.linux.net_devices.items()})
        code, text, _ = conn.runtime.start(p, _nri_container(m, p, annotations, asks, pid=PID, state=1))
        return (None if code == 0 else "start"), text
    finally:
        conn.close()


def run_path(path: str, tmp_path: Path, monkeypatch: Any, capsys: Any, annotations: dict[str, str],
             setup: str | None = None, asks: Asks | None = None, machines: Path | None = None) -> Outcome:
    """One request through ``path`` on a fresh node (see :func:`node_for`), to the container's first process."""
    asks = asks or Asks()
    node = node_for(tmp_path, path, setup, machines)
    cfg = config_file(node, monkeypatch, tmp_path)
    names = {"prestart": CID, "precreate": f"libpod-{CID}", "nri": CID}
    name = names[path.split("-")[0]]
    twin = node_for(tmp_path / "twin", path, setup, machines)  # the same node, its runtime's container and no numa-pin
    twin.add_container(name, PID)
    before = twin.files(name)
    if node.devices is not None:
        kernel(monkeypatch, node.devices, PID)
    if node.net is not None:
        node.net.install(monkeypatch)
    pf_before = {n: dict(state) for n, state in node.net.vfs.items()} if node.net is not None else {}
    env: dict[str, str] = {}
    text = ""
    if path == "prestart":
        stage = None if _plain_prestart(node, cfg, annotations, asks) else ""
    elif path.startswith("precreate"):
        stage = _precreate(node, cfg, annotations, "1.0.2-dev" if path == "precreate-1.0" else "1.3.0", env, asks)
    else:
        stage, text = _nri(node, annotations, env, asks)
    text = text or capsys.readouterr().err.strip()
    grant = Ledger(str(node.state_dir)).read().grants.get(CID)
    after = node.files(name)
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    cpus = parse_list(node.cpuset(name)[0]) if stage is None else None
    devices = frozenset(node.devices.nodes.values()) if node.devices is not None else frozenset()
    rules = node.devices.rules() if node.devices is not None and stage is None else frozenset()
    files = dict(node.devices.lists) if node.devices is not None else {}
    vfs, pf = seen(node.net, PID, pf_before) if node.net is not None else ({}, {})
    return Outcome(grant, text, cpus, env, changed, stage or "", frozenset(parse_list(node.cpus)), devices, rules,
                   files, vfs, pf)


__all__ = ["CID", "PATHS", "Asks", "MatrixNode", "Outcome", "config_file", "hook", "node_for", "run_path"]
