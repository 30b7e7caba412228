"""The client's descriptor set: ``third_party/podresources/api.proto`` compiled, with kubelet's
service, method and field numbers (the table below is read from kubelet's
``staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``), and it loads on Debian 12's
python3-protobuf as on the venv's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from numa_pin.errors import ConfigError
from numa_pin.podresources import client

REPO = Path(client.DESCRIPTORS).parents[3]
PROTO_DIR = REPO / "third_party" / "podresources"

#: kubelet's v1 API: message -> {field: (number, repeated)}
KUBELET_FIELDS = {
    "AllocatableResourcesResponse": {"devices": (1, True), "cpu_ids": (2, True), "memory": (3, True)},
    "ListPodResourcesResponse": {"pod_resources": (1, True)},
    "PodResources": {"name": (1, False), "namespace": (2, False), "containers": (3, True)},
    "ContainerResources": {"name": (1, False), "devices": (2, True), "cpu_ids": (3, True), "memory": (4, True)},
    "ContainerMemory": {"memory_type": (1, False), "size": (2, False), "topology": (3, False)},
    "ContainerDevices": {"resource_name": (1, False), "device_ids": (2, True), "topology": (3, False)},
    "TopologyInfo": {"nodes": (1, True)},
    "NUMANode": {"ID": (1, False)},
    "ListPodResourcesRequest": {},
    "AllocatableResourcesRequest": {},
}


def _kept() -> descriptor_pb2.FileDescriptorSet:
    return descriptor_pb2.FileDescriptorSet.FromString(Path(client.DESCRIPTORS).read_bytes())


def test_the_descriptors_are_the_proto_compiled(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    out = tmp_path / "d.binpb"
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "--include_imports",
                           f"--descriptor_set_out={out}", f"-I{PROTO_DIR}", "api.proto"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()) == _kept(), \
        "run `make podresources-descriptors` after changing third_party/podresources/api.proto"


@pytest.mark.parametrize("name", sorted(KUBELET_FIELDS), ids=sorted(KUBELET_FIELDS))
def test_field_numbers_are_kubelets(name: str) -> None:
    (proto,) = _kept().file
    assert proto.package == "v1"
    (msg,) = [m for m in proto.message_type if m.name == name]
    repeated = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    assert {f.name: (f.number, f.label == repeated) for f in msg.field} == KUBELET_FIELDS[name]


def test_the_service_is_kubelets() -> None:
    (proto,) = _kept().file
    (service,) = proto.service
    assert f"{proto.package}.{service.name}" == client.SERVICE
    assert {(m.name, m.input_type, m.output_type) for m in service.method} == {
        ("List", ".v1.ListPodResourcesRequest", ".v1.ListPodResourcesResponse"),
        ("GetAllocatableResources", ".v1.AllocatableResourcesRequest", ".v1.AllocatableResourcesResponse"),
    }


@pytest.mark.parametrize("content", [b"", b"\xff\xfe not protobuf"], ids=["empty", "garbage"])
def test_unusable_descriptors_are_a_config_error(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "d.binpb"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=str(path)):
        client.PodResourcesClient(str(tmp_path / "kubelet.sock"), descriptors=str(path))


DEBIAN_CLIENT = """
import sys
sys.path.insert(0, sys.argv[1])
import google.protobuf, grpc
from numa_pin.cluster.nrt import pods_fingerprint
from numa_pin.podresources.client import PodResourcesClient, pod_names
with PodResourcesClient(sys.argv[2], timeout_s=10) as c:
    pods = c.list()
print(google.protobuf.__version__, grpc.__version__, sorted(pods[0].containers[0].cpus), pods_fingerprint(pod_names(pods)))
"""


def test_debians_python_reads_a_server(pb, serve) -> None:
    """Debian's python3-protobuf and python3-grpcio (the deb's dependencies) as the client of the
    venv's grpcio server."""
    python = "/usr/bin/python3"
    probe = subprocess.run([python, "-c", "import google.protobuf, grpc"], capture_output=True, timeout=60) \
        if Path(python).exists() else None
    if probe is None or probe.returncode != 0:
        pytest.skip("Debian's python3-protobuf and python3-grpcio are not installed")
    answer = pb.ListPodResourcesResponse()
    for namespace, name in [("ns1", "n1"), ("ns1", "n2"), ("ns2", "n1"), ("ns3", "n1"), ("ns3", "n2")]:
        answer.pod_resources.add(namespace=namespace, name=name).containers.add(name="c", cpu_ids=[3, 4])
    sock = serve(list=lambda req, ctx: answer)
    done = subprocess.run([python, "-c", DEBIAN_CLIENT, str(REPO / "src"), sock], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[2:] == ["[3,", "4]", "pfp0v001b92008c14168b3a6"]
