"""Devices chosen by someone else: CDI names of any kind and the container's ``linux.devices``
align CPUs and memory to the PCI functions behind them (issue 26, section 1).

Oracles: the kit's machine declaration (GPU ``i`` has device minor ``i`` and render node
``226:128+i``; the ConnectX-6 PF carries ``uverbs0``; which node each sits on), written as a
kernel-shaped sysfs tree and read back by discovery; CDI spec files written the way nvidia-ctk
and the DRA drivers write them, in YAML and JSON and several ``cdiVersion``s; real character
device nodes (``mknod``) where a spec gives no numbers.
"""

from __future__ import annotations

import json
import os

import pytest

from numa_pin.admission.decide import NodeSettings, decide
from numa_pin.config.schema import Config
from numa_pin.devices.cdi_spec import SpecError, spec_devices
from numa_pin.devices.devnode import DeviceNode
from numa_pin.errors import RequestError
from numa_pin.hook.admit import request_from_spec
from numa_pin.hook.oci import OciState, parse_spec
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.resources.base import grant_from
from numa_pin.resources.devices import ASSIGNED
from numa_pin.resources.node.devnodes import cdi_devices
from numa_pin.testing import devtree

SNN = NodeSettings(policy="single-numa-node")
CLAIM = "k8s.gpu.nvidia.com/claim"
UID = "6f1c3c1e-7b2a-4d1e-9b1e-0c7f9d2a4e11"
SPEC = devtree.gpu8_devnodes()
KIT_GPUS = sorted((p for p in SPEC.pci if p.gpu_minor is not None), key=lambda p: p.gpu_minor)


def node_of(topo, address):
    return topo.device(address).numa_node


def cpu_nodes(topo, cpus):
    return {topo.cpus[c].numa for c in cpus}


def config(built, tmp_path, **inference):
    return Config(sysfs_root=str(built.sysfs_root), proc_root=str(built.proc_root), dev_root=str(tmp_path / "dev"),
                  cdi_spec_dirs=(str(tmp_path / "etc-cdi"), str(tmp_path / "run-cdi")),
                  inference=Config().inference.__class__(**inference))


def request(cfg, annotations=None, devices=(), env=()):
    doc = {"ociVersion": "1.2.0", "process": {"env": list(env)}, "annotations": annotations or {},
           "linux": {"devices": list(devices)}}
    spec = parse_spec(json.dumps(doc), "/", source="config.json")
    return request_from_spec(OciState("c1", "creating", None, "/"), spec, cfg)


# ---- CDI names of any kind ---------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, version, numbers, where",
    [("yaml", "0.3.0", True, "etc"), ("json", "0.5.0", True, "run"), ("yaml", "0.6.0", False, "run"),
     ("json", "0.8.0", False, "etc"), ("yaml", "0.7.0", True, "both"), ("json", "1.0.0", True, "run"),
     ("yaml", "1.1.0", False, "etc"), ("yaml", "v0.6.0", True, "run")],
    ids=["yaml-0.3-numbers", "json-0.5-numbers", "yaml-0.6-dev-node", "json-0.8-dev-node", "run-wins-over-etc",
         "json-1.0-numbers", "yaml-1.1-dev-node", "v-spelling"],
)
def test_a_dra_gpu_claim_aligns_cpus_and_memory_to_its_gpu(built, topo, tmp_path, fmt, version, numbers, where):
    gpu = KIT_GPUS[5]
    name = f"{UID}-gpu-0"
    nodes = [(f"/dev/nvidia{gpu.gpu_minor}", 195, gpu.gpu_minor)]
    shared = [("/dev/nvidiactl", 195, 255)]
    if not numbers:
        devtree.make_dev_nodes(tmp_path / "dev", nodes + shared)
        nodes, shared = [(p, None, None) for p, _, _ in nodes], [(p, None, None) for p, _, _ in shared]
    if where == "both":  # the same name in /etc/cdi says another GPU: /var/run/cdi wins
        devtree.write_cdi_spec(tmp_path / "etc-cdi", CLAIM, {name: [("/dev/nvidia1", 195, 1)]}, version=version,
                               fmt=fmt)
    devtree.write_cdi_spec(tmp_path / ("etc-cdi" if where == "etc" else "run-cdi"), CLAIM, {name: nodes},
                           shared=shared, version=version, fmt=fmt)
    req = request(config(built, tmp_path), {"numa-pin.io/cpus": "4", "numa-pin.io/memory": "1Gi",
                                            "cdi.k8s.io/gpu": f"{CLAIM}={name}"})
    d = decide(topo, LedgerState(), req, SNN)
    assert d.admit, d.reason
    assert dict(d.devices) == {"nvidia.com/gpu": (gpu.address,)}
    assert cpu_nodes(topo, d.cpus) == {gpu.numa_node} and d.mems == frozenset({gpu.numa_node})
    assert not d.notes


def test_a_claim_no_spec_names_is_admitted_without_a_hint_and_explained(built, topo, tmp_path):
    req = request(config(built, tmp_path), {"numa-pin.io/cpus": "2", "cdi.k8s.io/gpu": f"{CLAIM}={UID}-gpu-9"})
    d = decide(topo, LedgerState(), req, SNN)
    assert d.admit and not d.devices
    assert len(d.notes) == 1 and f"{CLAIM}={UID}-gpu-9" in d.notes[0] and "no CDI spec file" in d.notes[0]
    grant = grant_from(req, d, pid=None, start_time=None, cgroup=None, kind=None, created=0.0)
    assert Grant.from_dict(json.loads(json.dumps(grant.to_dict()))).notes == d.notes


def test_strict_handling_rejects_a_device_it_cannot_place_in_one_line(built, topo, tmp_path):
    req = request(config(built, tmp_path, strict_devices=True), {"cdi.k8s.io/gpu": f"{CLAIM}={UID}-gpu-9"})
    with pytest.raises(RequestError, match=r"inference.strict_devices.*cannot place .*no CDI spec file") as exc:
        decide(topo, LedgerState(), req, SNN)
    assert "\n" not in str(exc.value)


def test_a_broken_spec_file_is_skipped_and_named(built, topo, tmp_path):
    good = KIT_GPUS[2]
    devtree.write_cdi_spec(tmp_path / "run-cdi", CLAIM, {"a": [(f"/dev/nvidia{good.gpu_minor}", 195, good.gpu_minor)]})
    (tmp_path / "run-cdi" / "broken.json").write_text('{"cdiVersion": "0.6.0", "kind": "x.com/y", "devices": 3}')
    (tmp_path / "run-cdi" / "huge.yaml").write_bytes(b"#" * (2 << 20))
    found, problems = cdi_devices([str(tmp_path / "etc-cdi"), str(tmp_path / "run-cdi")])
    assert list(found) == [f"{CLAIM}=a"]
    assert len(problems) == 2 and any("broken.json" in p for p in problems) and any("huge.yaml" in p for p in problems)
    req = request(config(built, tmp_path), {"cdi.k8s.io/gpu": f"{CLAIM}=b"})
    d = decide(topo, LedgerState(), req, SNN)
    assert d.admit and "broken.json" in d.notes[0]


def _reference_shaped(version: str) -> dict:
    """A spec shaped as the CDI reference library's schema/testdata/good/spec-example.json is (a
    device with a hostPath node and one without, spec-level env, a shared node with uid/gid,
    mounts and hooks), plus the edits each later version added (1.1.0: netDevices, intelRdt
    schemata and monitoring)."""
    doc: dict = {
        "cdiVersion": version, "kind": "vendor.com/device",
        "devices": [{"name": "myDevice", "containerEdits": {"deviceNodes": [
            {"hostPath": "/vendorroot/dev/card1", "path": "/dev/card1"}, {"path": "/dev/card2"}]}}],
        "containerEdits": {
            "env": ["FOO=CDI_SPEC", "BAR=BARVALUE1"],
            "deviceNodes": [{"path": "/dev/vendorctl", "uid": 1000, "gid": 1000}],
            "mounts": [{"hostPath": "/bin/vendorBin", "containerPath": "/bin/vendorBin"}],
            "hooks": [{"hookName": "createContainer", "path": "/bin/vendor-hook"}],
        },
    }
    if version.lstrip("v") >= "0.7.0":
        doc["containerEdits"]["additionalGIDs"] = [5]
    if version.lstrip("v") >= "1.1.0":
        doc["devices"][0]["containerEdits"]["netDevices"] = [{"hostInterfaceName": "eth1", "name": "net1"}]
        doc["containerEdits"]["intelRdt"] = {"closID": "gold", "schemata": ["L3:0=ff"], "enableMonitoring": True}
    return doc


#: what the reference library's ValidateVersion accepts (specs-go/version.go and its tests): the
#: released versions from 0.3.0 on, each with or without one leading "v"
ACCEPTED = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0", "v0.6.0", "v1.1.0"]
#: and what it refuses: 0.1.0 and 0.2.0 ("must be at least v0.3.0"), unknown and malformed ones
REFUSED = ["0.1.0", "v0.2.0", "1.2.0", "not-a-version", "V1.1.0", "vv1.1.0", "1.1", "", None, 1.1]


@pytest.mark.parametrize("version", ACCEPTED)
def test_every_version_the_reference_accepts_is_read(version):
    if version.lstrip("v") < "0.5.0":  # no hostPath before 0.5.0: testdata's minimal.json shape
        doc = {"cdiVersion": version, "kind": "vendor.com/device",
               "devices": [{"name": "myDevice", "containerEdits": {"deviceNodes": [{"path": "/dev/card1"}]}}]}
        want = ["/dev/card1"]
    else:
        doc, want = _reference_shaped(version), ["/vendorroot/dev/card1", "/dev/card2", "/dev/vendorctl"]
    got = {n: [x.path for x in nodes] for n, nodes in spec_devices(doc, "f").items()}
    assert got == {"vendor.com/device=myDevice": want}


@pytest.mark.parametrize("version", REFUSED, ids=[repr(v) for v in REFUSED])
def test_versions_the_reference_refuses_are_refused(version):
    doc = {**_reference_shaped("0.6.0"), "cdiVersion": version}
    with pytest.raises(SpecError, match="cdiVersion"):
        spec_devices(doc, "f.json")


@pytest.mark.parametrize(
    "doc, match",
    [({"cdiVersion": "0.2.0", "kind": "a.com/b", "devices": []}, "cdiVersion"),
     ({"cdiVersion": "0.6.0", "kind": "nokind", "devices": []}, "kind"),
     ({"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": [{"containerEdits": {}}]}, "has no name"),
     ({"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": [{"name": "x", "containerEdits": {
         "deviceNodes": [{"path": "dev/rel"}]}}]}, "absolute"),
     ({"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": [{"name": "x", "containerEdits": {
         "deviceNodes": [{"path": "/dev/x", "major": -1}]}}]}, "major"),
     ({"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": [{"name": "x"}] * 5000}, "at most"),
     ([], "not a mapping")],
    ids=["old-version", "bad-kind", "no-name", "relative-path", "negative-major", "too-many", "not-mapping"],
)
def test_specs_without_the_cdi_shape_are_refused(doc, match):
    with pytest.raises(SpecError, match=match):
        spec_devices(doc, "f.json")


def test_spec_level_nodes_belong_to_every_device():
    doc = {"cdiVersion": "0.5.0", "kind": "a.com/b", "containerEdits": {"deviceNodes": [{"path": "/dev/ctl"}]},
           "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/d0", "hostPath": "/dev/h0"}]}},
                       {"name": "1"}]}
    got = {n: [x.path for x in nodes] for n, nodes in spec_devices(doc, "f").items()}
    assert got == {"a.com/b=0": ["/dev/h0", "/dev/ctl"], "a.com/b=1": ["/dev/ctl"]}


# ---- linux.devices, whoever put them there ------------------------------------------------


def dev(path, major, minor):
    return {"path": path, "type": "c", "major": major, "minor": minor}


def test_render_node_in_linux_devices_aligns_to_its_gpu(built, topo, tmp_path):
    gpu = KIT_GPUS[3]
    req = request(config(built, tmp_path), {"numa-pin.io/cpus": "2"},
                  [dev(f"/dev/dri/renderD{128 + gpu.gpu_minor}", devtree.DRM_MAJOR, 128 + gpu.gpu_minor),
                   dev("/dev/fuse", 10, 229)])
    d = decide(topo, LedgerState(), req, SNN)
    assert d.admit and dict(d.devices) == {"nvidia.com/gpu": (gpu.address,)}
    assert cpu_nodes(topo, d.cpus) == {gpu.numa_node}
    assert d.notes == ("not aligned: /dev/fuse (linux.devices): no PCI function behind character device 10:229",)


def test_a_device_no_resource_lists_is_booked_as_assigned(built, topo, tmp_path):
    req = request(config(built, tmp_path), {"numa-pin.io/cpus": "2"},
                  [dev("/dev/infiniband/uverbs0", devtree.UVERBS_MAJOR, 192), dev("/dev/infiniband/rdma_cm", 10, 58)])
    d = decide(topo, LedgerState(), req, SNN)
    assert d.admit and dict(d.devices) == {ASSIGNED: (devtree.CX6_PF,)} and not d.notes
    assert cpu_nodes(topo, d.cpus) == {node_of(topo, devtree.CX6_PF)}


def test_a_vfio_group_node_aligns_to_the_functions_of_its_group(built, topo, tmp_path):
    vf = next(p for p in topo.pci_devices if p.address == "0000:c9:00.3")
    req = request(config(built, tmp_path), {"numa-pin.io/cpus": "2"},
                  [dev(f"/dev/vfio/{vf.iommu_group}", 240, 0), dev("/dev/vfio/vfio", 10, 196)])
    d = decide(topo, LedgerState(), req, SNN)
    assert d.admit and dict(d.devices) == {ASSIGNED: (vf.address,)} and not d.notes
    assert cpu_nodes(topo, d.cpus) == {vf.numa_node}


def test_devices_on_two_nodes_are_refused_by_single_numa_node(built, topo, tmp_path):
    far = next(g for g in KIT_GPUS if g.numa_node != node_of(topo, devtree.CX6_PF))
    req = request(config(built, tmp_path), {"numa-pin.io/cpus": "2"},
                  [dev("/dev/infiniband/uverbs0", devtree.UVERBS_MAJOR, 192), dev(f"/dev/nvidia{far.gpu_minor}", 195,
                                                                                   far.gpu_minor)])
    assert not decide(topo, LedgerState(), req, SNN).admit


def test_virtual_nodes_alone_ask_nothing(built, tmp_path):
    req = request(config(built, tmp_path), {}, [dev("/dev/vfio/vfio", 10, 196), dev("/dev/nvidiactl", 195, 255)])
    assert req.asks_nothing


def test_the_switch_turns_it_off(built, tmp_path):
    req = request(config(built, tmp_path, device_nodes=False), {}, [dev("/dev/nvidia1", 195, 1)])
    assert req.fixed_nodes == () and req.asks_nothing


def test_linux_devices_are_parsed_bounded():
    spec = parse_spec(json.dumps({"linux": {"devices": [dev("/dev/a", 1, 2), {"path": "/dev/p", "type": "p"}]}}), "/")
    assert spec.devices == (DeviceNode("/dev/a", "linux.devices", "c", 1, 2),)
    from numa_pin.errors import HookInputError

    with pytest.raises(HookInputError, match="linux.devices"):
        parse_spec(json.dumps({"linux": {"devices": [dev("/dev/a", 1, 2)] * 5000}}), "/")
    with pytest.raises(HookInputError, match="major"):
        parse_spec(json.dumps({"linux": {"devices": [dev("/dev/a", "1", 2)]}}), "/")


def test_nvidia_nodes_have_no_sys_dev_char_entry_in_the_kit(built):
    """The kit mirrors real machines: NVIDIA's 195:N are found through the driver's minor only."""
    assert not os.path.lexists(built.sysfs_root / "dev" / "char" / "195:0")


# ---- what a node stands for (pure) ---------------------------------------------------------


@pytest.mark.parametrize(
    "node, gpu_index, why",
    [(DeviceNode("/dev/nvidia4", "s", "c", 195, 4, virtual=True), 4, ""),
     (DeviceNode("/dev/nvidia4", "s", "c", 195, 4), 4, ""),
     (DeviceNode("/dev/nvidiactl", "s", "c", 195, 255), None, ""),
     (DeviceNode("/dev/nvidia-uvm", "s", "c", 238, 0), None, ""),
     (DeviceNode("/dev/nvidia-caps/nvidia-cap1", "s", "c", 241, 1), None, ""),
     (DeviceNode("/dev/nvidia77", "s", "c", 195, 77), None, "no NVIDIA GPU reports device minor 77"),
     (DeviceNode("/dev/vfio/999", "s", "c", 240, 3, virtual=True), None, "IOMMU group 999 holds no PCI function"),
     (DeviceNode("/dev/x", "s", "c", 5, 5, address="0000:ee:00.0"), None,
      "PCI function 0000:ee:00.0 is not among this machine's devices"),
     (DeviceNode("/dev/sda", "s", "b", 8, 0), None, "no PCI function behind block device 8:0"),
     (DeviceNode("/dev/fuse", "s", "c", 10, 229, virtual=True), None, "")],
    ids=["nvidia-minor-virtual-in-sysfs", "nvidia-minor", "nvidiactl", "nvidia-uvm", "nvidia-caps", "unknown-minor",
         "empty-iommu-group", "foreign-address", "block-without-sysfs", "virtual"],
)
def test_what_a_node_stands_for(topo, node, gpu_index, why):
    from numa_pin.devices.devnode import functions_of

    want = (KIT_GPUS[gpu_index].address,) if gpu_index is not None else ()
    assert functions_of(node, topo) == (want, why)
