"""One request, one result on every path: prestart, podman's precreate and NRI, to the first process.

Each row of :data:`ROWS` is a request (its annotations) and what a user must see: the kind of the
grant, or the kind of the one-line refusal. Each row runs through every path on a node of its own
(:mod:`.every_path_world`), as far as the container's first process, the way each runtime calls
numa-pin:

* ``prestart``: the runtime makes the cgroups and runs ``numa-pin-hook prestart``;
* ``precreate``: podman runs ``numa-pin-hook precreate`` on the config it proposes (runtime-spec
  1.0.2, or a 1.3 one), applies the config that comes back as runc does, then the prestart hook;
* ``nri``: containerd sends ``CreateContainer``, applies the adjustment, starts the process and
  sends ``StartContainer``.

Where every path admits a row, every path must leave the same host behind, file by file: the
container's cpuset and quota, each CPU's PM QoS latency and governor, the IRQs' affinities, the
cpusets' load balancing (:func:`test_every_path_leaves_the_same_host`); and on the GPU node (the
rows of :data:`DEVICE_ROWS`: GPUs, an RDMA NIC, a vfio-bound VF, co-location) the container must
see the same device nodes and device rules and be told the same ``PCIDEVICE_*`` variables, whether
numa-pin made them at prestart or the runtime from the config or adjustment numa-pin handed it
(:mod:`.every_path_devices`); on the VF node (:data:`VF_ROWS`) the container's VFs must be in its
network namespace under the same names with the same PF-side settings, whoever moved them
(:mod:`.every_path_vfs`). A request a path cannot
carry (a memory policy or an exec CPU affinity at prestart, through NRI or to a runtime without
``linux.memoryPolicy`` or ``process.execCPUAffinity``) is refused on it with the same kind, and a
refusal comes at the runtime's first call on every path, with nothing kept. A resource added
behind the seam reaches both paths where the runtime applies the grant without a line changed in
either.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from numa_pin.base.cpuset import format_list
from numa_pin.config.schema import config_from_dict
from numa_pin.nri import messages as nri_messages
from numa_pin.resources.node.base import NodeResource
from numa_pin.resources.node.registry import register, unregister
from numa_pin.resources.node.runtime import RuntimeEdit
from numa_pin.service.node import NodeService
from numa_pin.testing import machine

from .every_path_devices import ENV_FILE
from .every_path_vfs import CONTAINER, VF_RES, VFS
from .every_path_world import (
    CDI_KIND,
    CID,
    DPDK,
    GPU_SHAPE,
    PATHS,
    RDMA,
    Asks,
    Outcome,
    config_file,
    hook,
    node_for,
    run_path,
)
from .fake_runtime import Connected, container, pod

MIB = 1 << 20
CPUS = "numa-pin.io/cpus"
DEVICES = "numa-pin.io/devices"
COLOCATE = "numa-pin.io/colocate"
VF_CONFIG = "numa-pin.io/vf-config"
_KIT = machine.expected_topology(GPU_SHAPE)
KIT_GPUS = {d.address: d for d in _KIT.pci_devices if d.gpu_minor is not None}
KIT_CPUS = {n: frozenset(node.cpus) for n, node in _KIT.nodes.items()}

#: (id, annotations, the cell per path where it differs from :data:`EXPECTED`)
ROWS = [
    ("two-cpus", {CPUS: "2"}, {}),
    ("memory-only", {"numa-pin.io/memory": "64Mi"}, {}),
    ("too-many-cpus", {CPUS: "64"}, {}),
    ("memory-policy", {CPUS: "1", "numa-pin.io/memory-policy": "interleave"}, {"precreate-1.3": "exclusive"}),
    ("memory-policy-bind", {CPUS: "1", "numa-pin.io/memory-policy": "bind"}, {"precreate-1.3": "exclusive"}),
    ("cpu-shared", {CPUS: "2", "numa-pin.io/cpu-shared": "true"}, {}),
    ("cpu-shared-no-cpus", {"numa-pin.io/memory": "64Mi", "numa-pin.io/cpu-shared": "true"}, {}),
    ("exec-affinity", {CPUS: "1", "numa-pin.io/exec-cpu-affinity": "first"}, {"precreate-1.3": "exclusive"}),
    ("hugepages", {CPUS: "1", "numa-pin.io/memory": "64Mi", "numa-pin.io/hugepages-2Mi": "4Mi"}, {}),
    ("hugepages-too-many", {CPUS: "1", "numa-pin.io/hugepages-2Mi": "64Mi"}, {}),
    ("pod-scope", {CPUS: "1", "numa-pin.io/scope": "pod"}, {}),
    ("bad-quantity", {CPUS: "two"}, {}),
    ("quota", {CPUS: "2", "cpu-quota.crio.io": "disable"}, {}),
    ("quota-numa-pin", {CPUS: "2", "numa-pin.io/cpu-quota": "disable"}, {}),
    ("quota-shared", {"numa-pin.io/memory": "64Mi", "cpu-quota.crio.io": "disable"}, {}),
    ("c-states-off", {CPUS: "2", "cpu-c-states.crio.io": "disable"}, {}),
    ("c-states-latency", {CPUS: "2", "numa-pin.io/cpu-c-states": "max_latency:10"}, {}),
    ("governor", {CPUS: "2", "cpu-freq-governor.crio.io": "performance"}, {}),
    ("governor-unknown", {CPUS: "2", "cpu-freq-governor.crio.io": "turbo"}, {}),
    ("load-balancing", {CPUS: "2", "cpu-load-balancing.crio.io": "disable"}, {}),
    ("load-balancing-root-balances", {CPUS: "2", "numa-pin.io/cpu-load-balancing": "disable"}, {}),
    ("irq", {CPUS: "2", "irq-load-balancing.crio.io": "disable"}, {}),
    ("irq-housekeeping", {CPUS: "4", "numa-pin.io/irq-load-balancing": "housekeeping"}, {}),
    ("gpu", {CPUS: "2", DEVICES: "nvidia.com/gpu=1"}, {}),
    ("gpu-env", {CPUS: "2"}, {}),
    ("gpu-env-cdi", {CPUS: "2"}, {}),
    ("gpu-env-cdi-claim", {CPUS: "2"}, {}),
    ("gpu-env-cdi-claim-unknown", {CPUS: "2"}, {}),
    ("gpu-cdi", {CPUS: "2", "cdi.k8s.io/gpu": "nvidia.com/gpu=3"}, {}),
    ("gpu-cdi-claim", {CPUS: "2", "cdi.k8s.io/claim": f"{CDI_KIND}=gpu3"}, {}),
    ("gpu-cdi-unknown", {CPUS: "2", "cdi.k8s.io/gpu": "nvidia.com/gpu=9"}, {}),
    ("gpu-cdi-claim-unknown", {CPUS: "2", "cdi.k8s.io/claim": f"{CDI_KIND}=nope"}, {}),
    ("gpu-linux-devices", {CPUS: "2"}, {}),
    ("gpu-too-many", {CPUS: "2", DEVICES: "nvidia.com/gpu=3"}, {}),
    ("rdma", {CPUS: "2", DEVICES: f"{RDMA}=1"}, {}),
    ("vfio", {CPUS: "2", DEVICES: f"{DPDK}=1"}, {}),
    ("colocate", {CPUS: "2", DEVICES: f"nvidia.com/gpu=1,{RDMA}=1", COLOCATE: f"pcie-root:nvidia.com/gpu,{RDMA}"}, {}),
    ("colocate-apart", {CPUS: "2", DEVICES: f"{DPDK}=1,{RDMA}=1", COLOCATE: f"pcie-root:{DPDK},{RDMA}"}, {}),
    ("vf", {CPUS: "2", DEVICES: f"{VF_RES}=1"}, {}),
    ("vf-config", {CPUS: "2", DEVICES: f"{VF_RES}=1", VF_CONFIG: "vlan=100,vlanQoS=3,trust=on,spoofchk=off"}, {}),
    ("vf-config-bad", {CPUS: "2", DEVICES: f"{VF_RES}=1", VF_CONFIG: "vlan=5000"}, {}),
    ("vf-too-many", {CPUS: "2", DEVICES: f"{VF_RES}=4"}, {}),
]
EXPECTED = {"two-cpus": "exclusive", "memory-only": "shared", "too-many-cpus": "TopologyAffinityError",
            "memory-policy": "PathLimitError", "memory-policy-bind": "PathLimitError", "cpu-shared": "mixed",
            "cpu-shared-no-cpus": "RequestError", "exec-affinity": "PathLimitError", "hugepages": "exclusive",
            "hugepages-too-many": "TopologyAffinityError", "pod-scope": "exclusive", "bad-quantity": "RequestError",
            "quota": "exclusive", "quota-numa-pin": "exclusive", "quota-shared": "RequestError",
            "c-states-off": "exclusive", "c-states-latency": "exclusive", "governor": "exclusive",
            "governor-unknown": "IsolationError", "load-balancing": "exclusive",
            "load-balancing-root-balances": "IsolationError", "irq": "exclusive", "irq-housekeeping": "exclusive",
            "gpu": "exclusive", "gpu-env": "exclusive", "gpu-cdi": "exclusive", "gpu-cdi-claim": "exclusive",
            "gpu-env-cdi": "exclusive", "gpu-env-cdi-claim": "exclusive", "gpu-env-cdi-claim-unknown": "exclusive",
            "gpu-cdi-unknown": "RequestError", "gpu-cdi-claim-unknown": "exclusive",
            "gpu-linux-devices": "exclusive", "gpu-too-many": "TopologyAffinityError", "rdma": "exclusive",
            "vfio": "exclusive", "colocate": "exclusive", "colocate-apart": "AllocationError",
            "vf": "exclusive", "vf-config": "exclusive", "vf-config-bad": "RequestError", "vf-too-many": "TopologyAffinityError"}
#: what a row asks besides its annotations (the device plugin's variables, ``linux.devices``)
ASKS = {"gpu-env": Asks(env={"NVIDIA_VISIBLE_DEVICES": "3"}),
        "gpu-env-cdi": Asks(env={"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=5"}),
        "gpu-env-cdi-claim": Asks(env={"NVIDIA_VISIBLE_DEVICES": f"{CDI_KIND}=gpu6"}),
        "gpu-env-cdi-claim-unknown": Asks(env={"NVIDIA_VISIBLE_DEVICES": f"{CDI_KIND}=nope"}),
        "gpu-linux-devices": Asks(devices=(("/dev/nvidia3", "c", 195, 3),))}
#: the rows of the GPU node, and the GPU minors each may get (a GPU it names; the GPUs that share
#: a PCIe root with the RDMA NIC); None: any. A CDI name no spec file names aligns nothing (the
#: grant's notes say why) and gives no device
DEVICE_ROWS = {"gpu": None, "gpu-env": {3}, "gpu-env-cdi": {5}, "gpu-env-cdi-claim": {6},
               "gpu-env-cdi-claim-unknown": None, "gpu-cdi": {3}, "gpu-cdi-claim": {3},
               "gpu-cdi-unknown": None, "gpu-cdi-claim-unknown": None, "gpu-linux-devices": {3},
               "gpu-too-many": None, "rdma": None, "vfio": None, "colocate": {2, 3}, "colocate-apart": None,
               "vf": None, "vf-config": None, "vf-config-bad": None, "vf-too-many": None}
#: rows run on a node set up otherwise than the matrix's default
#: the VF rows (a VF node: :mod:`.every_path_vfs`), and the PF-side state each VF granted must
#: end with, as the netlink fake keeps it (``numa-pin.io/vf-config``'s ``vlan``, ``vlanQoS``,
#: ``trust``, ``spoofchk``; a VF asked without settings keeps its state: nothing on the PF changes)
VF_ROWS = {"vf": {}, "vf-config": {"vlan": 100, "qos": 3, "trust": 1, "spoofchk": 0}, "vf-config-bad": {},
           "vf-too-many": {}}
NODES = {"load-balancing-root-balances": "balancing_root", **dict.fromkeys(DEVICE_ROWS, "gpus"),
         **dict.fromkeys(VF_ROWS, "vfs")}
#: the rows the guests run through containerd 1.7 and 2.x (tests/vm/test_vm_nri.py), on their own
#: node: cgroup v2 under systemd, no hugepages reserved, and no cpufreq under TCG (so a governor
#: is refused there, :data:`GUEST_CELLS`); the v1 root that balances has no v2 counterpart. A row
#: costs a guest about 17 s, so rows another row already stands for stay on the fake node (a second
#: memory policy, a second C-state, the refusals of a malformed request, the quota a BestEffort pod
#: never had). The guests have one device: qemu's ``edu`` function on node 1, behind an emulated
#: IOMMU, bound to vfio-pci and selected as the GPU node selects its vfio-bound VF (every_path_world.GPU_RESOURCES)
GUEST_ROWS = ("two-cpus", "memory-only", "too-many-cpus", "memory-policy", "cpu-shared", "cpu-shared-no-cpus",
              "exec-affinity", "pod-scope", "c-states-off", "governor", "load-balancing", "irq", "vfio")
GUEST_CELLS = {"governor": "IsolationError"}
#: what the guests read on the host while the row's container runs (tests/vm/nri_guest.py's matrix)
GUEST_EFFECTS = {"c-states-off": ("pm_qos", "n/a"), "load-balancing": ("partition", "isolated"),
                 "irq": ("irq_default", "off the grant")}
#: what each isolation row must change on the host (a file named as :meth:`MatrixNode.files` names it)
EFFECTS = {
    "quota": {"cgroup/cpu,cpuacct/<container>/cpu.cfs_quota_us": "-1"},
    "quota-numa-pin": {"cgroup/cpu,cpuacct/<container>/cpu.cfs_quota_us": "-1"},
    "c-states-off": {"sys/cpu/cpu{c}/power/pm_qos_resume_latency_us": "n/a"},
    "c-states-latency": {"sys/cpu/cpu{c}/power/pm_qos_resume_latency_us": "10"},
    "governor": {"sys/cpu/cpufreq/policy{c}/scaling_governor": "performance"},
    "load-balancing": {"cgroup/cpuset/<container>/cpuset.sched_load_balance": "0"},
    "irq": {"proc/irq/9/smp_affinity_list": "{others}"},
    "irq-housekeeping": {"proc/irq/9/smp_affinity_list": "{housekeeping}"},
}


@pytest.fixture
def machines(tmp_path_factory):
    """Where the GPU node's machine is built, once for the session."""
    return tmp_path_factory.getbasetemp() / "every-path-machines"


def _run(path: str, tmp_path, monkeypatch, capsys, row: str, annotations: dict[str, str], machines) -> Outcome:
    return run_path(path, tmp_path, monkeypatch, capsys, annotations, setup=NODES.get(row), asks=ASKS.get(row),
                    machines=machines)


def _cell(out: Outcome) -> str:
    """The matrix cell of one outcome: the grant's kind, or the refusal's kind (with the stage
    that refused, where it was not the runtime's first call)."""
    if out.grant is not None and out.cpus is not None:
        mixed = out.grant.kind == "exclusive" and dict(out.grant.isolation).get("shared")
        return "mixed" if mixed else out.grant.kind
    kind = m.group(1) if (m := re.search(r": ([A-Za-z]+Error): ", out.text)) else out.text
    return kind + (f" at {out.stage}" if out.stage else "")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("row, annotations, per_path", ROWS, ids=[r[0] for r in ROWS])
def test_one_request_one_result_on_every_path(tmp_path, monkeypatch, capsys, machines, row, annotations, per_path,
                                              path):
    out = _run(path, tmp_path, monkeypatch, capsys, row, annotations, machines)
    want = per_path.get(path, EXPECTED[row])
    assert _cell(out) == want, out.text
    if want not in ("exclusive", "shared", "mixed"):
        assert out.grant is None, "a refused container keeps nothing"
        assert out.text.startswith("numa-pin: ") and "\n" not in out.text, out.text
        if want == "PathLimitError":
            asked = next(k for k in annotations if k != CPUS)
            assert asked in out.text and f"on the {path.split('-')[0]} path" in out.text
        return
    assert out.grant is not None and out.cpus is not None
    every = out.pool
    if want == "exclusive":
        assert out.cpus == out.grant.cpus and len(out.grant.cpus) == int(annotations[CPUS])
    elif want == "shared":
        assert not out.grant.cpus and out.cpus == every, "a shared container gets the pool"
    else:  # mixed: its exclusive CPUs, held as exclusive, and every CPU no grant holds
        assert len(out.grant.cpus) == int(annotations[CPUS]) and out.cpus == every
    for name, value in EFFECTS.get(row, {}).items():
        _assert_effect(out, name, value)
    if row in DEVICE_ROWS:
        _assert_devices(out, DEVICE_ROWS[row], machines)
    if row in VF_ROWS:
        _assert_vfs(out, VF_ROWS[row], path)
    if path != "prestart":  # the device plugin's variables reach the container as it wrote them, where
        asked = ASKS.get(row, Asks()).env  # numa-pin keeps the devices they name (a CDI name stays one)
        assert {k: out.env.get(k) for k in asked} == asked, out.env
    if row in ("gpu-cdi-claim-unknown", "gpu-env-cdi-claim-unknown"):
        assert not out.grant.devices and any("no CDI spec file" in n for n in out.grant.notes), out.grant.notes


def _numbers(dev_file: Path) -> tuple[int, int]:
    major, minor = dev_file.read_text().strip().split(":")
    return int(major), int(minor)


def _assert_devices(out: Outcome, minors: frozenset[int] | None, machines: Path) -> None:
    """The container got the nodes of the devices granted to it and nothing else, each allowed in
    its devices cgroup, and its CPUs and memory are their NUMA node's. Oracles: the kit's
    description of the machine (each GPU's device minor and node, the ``nvidia-uvm`` major of its
    ``/proc/devices``) and its sysfs tree as the kernel lays it out (the ``dev`` files of a verbs
    device, of ``rdma_cm`` and of a VFIO group)."""
    assert out.grant is not None
    sysfs = machine.build_once(GPU_SHAPE, machines).sysfs_root
    want: set[tuple[str, int, int]] = set()
    for address in (a for ids in out.grant.devices.values() for a in ids):
        dev = _KIT.device(address)
        assert dev is not None and out.grant.mems == {dev.numa_node} and out.grant.cpus <= KIT_CPUS[dev.numa_node]
        if dev.gpu_minor is not None:
            assert minors is None or dev.gpu_minor in minors, "the GPU the request named"
            want |= {(f"/dev/nvidia{dev.gpu_minor}", 195, dev.gpu_minor), ("/dev/nvidiactl", 195, 255),
                     ("/dev/nvidia-uvm", 507, 0), ("/dev/nvidia-uvm-tools", 507, 1)}
        for verbs in (sysfs / "bus" / "pci" / "devices" / address).glob("infiniband_verbs/uverbs*"):
            want |= {(f"/dev/infiniband/{verbs.name}", *_numbers(verbs / "dev")),
                     ("/dev/infiniband/rdma_cm", *_numbers(sysfs / "class" / "misc" / "rdma_cm" / "dev"))}
        if dev.driver == "vfio-pci":
            group = sysfs / "class" / "vfio" / str(dev.iommu_group) / "dev"
            want |= {(f"/dev/vfio/{dev.iommu_group}", *_numbers(group)), ("/dev/vfio/vfio", 10, 196)}
    assert out.devices == {(p, "c", a, b) for p, a, b in want}
    assert out.rules == {f"c {a}:{b} rwm" for _, a, b in want}


def _assert_vfs(out: Outcome, settings: dict[str, int], path: str) -> None:
    """Every VF granted is in the container's network namespace as ``net1``, ``net2``, ... in
    grant order, with ``settings`` on its PF (nothing else changed there), and precreate and NRI
    tell the container its address in ``PCIDEVICE_*`` as sriov-network-device-plugin does. Oracle:
    the kit's VFs of ``ens2f0`` (VF n is 0000:32:01.n) and the request's settings."""
    assert out.grant is not None
    granted = out.grant.devices[VF_RES]
    assert out.vfs == {vf: (CONTAINER, f"net{i}") for i, vf in enumerate(granted, 1)}
    assert set(out.pf) == ({VFS.index(vf) for vf in granted} if settings else set())
    assert all({k: out.pf[VFS.index(vf)][k] for k in settings} == settings for vf in granted if settings), out.pf
    if path != "prestart":
        assert out.env.get("PCIDEVICE_EXAMPLE_COM_VF") == ",".join(granted), out.env


def _assert_effect(out: Outcome, name: str, value: str) -> None:
    """``name``/``value`` with ``{c}`` each granted CPU, ``{others}`` the CPUs not granted and
    ``{housekeeping}`` those and the grant's first core (the laptop's CPU c has sibling c + 4)."""
    assert out.grant is not None
    every = frozenset(range(8))
    first = min(out.grant.cpus) % 4
    values = {"others": format_list(every - out.grant.cpus),
              "housekeeping": format_list(every - (out.grant.cpus - {first, first + 4}))}
    for cpu in sorted(out.grant.cpus) if "{c}" in name else [None]:
        key = name.format(c=cpu)
        assert out.changed.get(key) == value.format(**values), (key, out.changed)


@pytest.mark.parametrize("row", [r for r, *_ in ROWS if all(
    next(o for i, _, o in ROWS if i == r).get(p, EXPECTED[r]) in ("exclusive", "shared", "mixed") for p in PATHS)])
def test_every_path_leaves_the_same_host(tmp_path, monkeypatch, capsys, machines, row):
    """The same grant and, file by file, the same host on every path (the container's cgroups
    named ``<container>`` wherever its runtime put them); the runtime-set variables the same on
    the paths where the runtime sets them (prestart cannot: the process exists already); on the VF
    node, the same VFs in the container's network namespace under the same names with the same
    state on their PF, whoever moved them."""
    annotations = dict(next(a for r, a, _ in ROWS if r == row))
    outs = {path: _run(path, tmp_path / path, monkeypatch, capsys, row, annotations, machines) for path in PATHS}
    grants = {path: (o.grant.kind, o.grant.cpus, o.grant.mems, tuple(sorted(o.grant.devices.items())))
              for path, o in outs.items() if o.grant}
    assert len(grants) == len(PATHS) and len(set(grants.values())) == 1, grants
    changed = {path: o.changed for path, o in outs.items()}
    assert all(c == changed["prestart"] for c in changed.values()), changed
    envs = {path: o.env for path, o in outs.items() if path != "prestart"}
    assert len({json.dumps(e, sort_keys=True) for e in envs.values()}) == 1, envs
    devices = {path: (o.devices, o.rules) for path, o in outs.items()}
    assert all(d == devices["prestart"] for d in devices.values()), devices
    vfs = {path: (o.vfs, o.pf) for path, o in outs.items()}
    assert all(v == vfs["prestart"] for v in vfs.values()), vfs
    assert _env_file(outs["prestart"]) == {k: v for k, v in envs["nri"].items() if k.startswith("PCIDEVICE_")}


def _env_file(out: Outcome) -> dict[str, str]:
    """What prestart wrote into the container's ``devices.env``: what precreate and NRI put in
    the environment as ``PCIDEVICE_*``."""
    return dict(line.split("=", 1) for line in out.files.get(ENV_FILE, "").splitlines())


def test_prestart_tells_a_vf_container_its_address(tmp_path, monkeypatch, capsys, machines):
    """precreate and NRI set ``PCIDEVICE_EXAMPLE_COM_VF`` to the VF granted; prestart, which
    cannot set a variable, must list it in the container's ``devices.env`` as it does an RDMA or
    vfio function's."""
    annotations = dict(next(a for r, a, _ in ROWS if r == "vf"))
    out = _run("prestart", tmp_path, monkeypatch, capsys, "vf", annotations, machines)
    assert out.grant is not None, out.text
    assert _env_file(out) == {"PCIDEVICE_EXAMPLE_COM_VF": ",".join(out.grant.devices[VF_RES])}


@pytest.mark.parametrize("path", ["precreate-1.0", "precreate-1.3", "nri"])
def test_a_mixed_container_is_told_its_exclusive_and_shared_cpus_where_the_runtime_sets_variables(
        tmp_path, monkeypatch, capsys, machines, path):
    out = _run(path, tmp_path, monkeypatch, capsys, "cpu-shared", dict(next(a for r, a, _ in ROWS if r == "cpu-shared")),
               machines)
    assert out.grant is not None and out.cpus is not None, out.text
    exclusive, shared = format_list(out.grant.cpus), format_list(out.cpus - out.grant.cpus)
    assert {k: out.env.get(k) for k in ("OPENSHIFT_ISOLATED_CPUS", "NUMA_PIN_EXCLUSIVE_CPUS")} == dict.fromkeys(
        ("OPENSHIFT_ISOLATED_CPUS", "NUMA_PIN_EXCLUSIVE_CPUS"), exclusive)
    assert out.env["OPENSHIFT_SHARED_CPUS"] == out.env["NUMA_PIN_SHARED_CPUS"] == shared


class Tag(NodeResource):
    """A resource added behind the seam: the runtime sets ``EXAMPLE_TAG`` in new containers."""

    name = "example.com/tag"

    def runtime(self, node, ask):
        return RuntimeEdit(env={"EXAMPLE_TAG": ask.grant.container_id}) if ask.request is not None else None


@pytest.fixture
def tag():
    resource = Tag()
    register(resource)
    yield resource
    unregister(resource)


def test_a_resource_added_behind_the_seam_reaches_precreate_and_nri(tmp_path, monkeypatch, tag):
    fake = node_for(tmp_path, "precreate")
    doc = {"ociVersion": "1.0.2-dev", "process": {"env": []}, "annotations": {"numa-pin.io/cpus": "1"},
           "linux": {"cgroupsPath": f"/libpod_parent/libpod-{CID}", "resources": {}}}
    rc, out = hook(config_file(fake, monkeypatch, tmp_path), "precreate", json.dumps(doc).encode())
    assert rc == 0
    assert f"EXAMPLE_TAG={CID}" in json.loads(out)["process"]["env"]

    fake = node_for(tmp_path, "nri")
    m = nri_messages.load()
    conn = Connected(NodeService(config_from_dict(fake.config_dict(policy="restricted"))), m)
    try:
        conn.runtime.configure()
        p = pod(m, "u1", "p", "")
        code, text, reply = conn.runtime.create(p, container(m, p, CID, cpu_milli=1000, limit_milli=1000,
                                                             memory=64 * MIB))
    finally:
        conn.close()
    assert code == 0, text
    assert {kv.key: kv.value for kv in reply.adjust.env}["EXAMPLE_TAG"] == CID


DOC = Path(__file__).resolve().parents[2] / "docs" / "paths.md"
DOC_PATHS = {"prestart": "prestart", "precreate (runtime-spec 1.0)": "precreate-1.0",
             "precreate (runtime-spec 1.3)": "precreate-1.3", "nri": "nri"}


def _doc_matrix() -> dict[str, dict[str, str]]:
    """``{request text: {path: cell}}`` from the table between the matrix markers of docs/paths.md."""
    text = DOC.read_text()
    table = text[text.index("<!-- matrix"):text.index("<!-- end matrix")].splitlines()[1:]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table if line.startswith("|")]
    header, body = rows[0], rows[2:]
    return {row[0]: {DOC_PATHS[h]: cell for h, cell in zip(header[1:], row[1:])} for row in body}


#: how the docs table names a row's node where it is not the matrix's default
NODE_TEXT = {"balancing_root": " (the root cpuset balances)", "gpus": " (GPU node)", "vfs": " (VF node)"}


def _request_text(row: str, annotations: dict[str, str]) -> str:
    node = NODE_TEXT[NODES[row]] if row in NODES else ""
    asks = ASKS.get(row, Asks())
    parts = [*(f"`{k}: {v}`" for k, v in annotations.items()), *(f"`{kv}`" for kv in asks.env_list()),
             *(f"`linux.devices: {p} ({t} {a}:{b})`" for p, t, a, b in asks.devices)]
    return ", ".join(parts) + node


def test_the_docs_table_is_the_matrix():
    documented = _doc_matrix()
    tested = {_request_text(row, a): {p: per.get(p, EXPECTED[row]) for p in PATHS} for row, a, per in ROWS}
    assert documented == tested
    assert all(re.fullmatch(r"exclusive|shared|mixed|[A-Za-z]+Error( at [a-z]+)?", c) for cells in documented.values()
               for c in cells.values())
