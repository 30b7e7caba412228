"""NRI's messages: the checked-in descriptors are the vendored .proto files (``third_party/nri``)
compiled, and they load on Debian 12's python3-protobuf (3.21) as on the venv's protobuf."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from numa_pin.nri import messages

REPO = Path(messages.DESCRIPTORS).parents[3]
#: the .proto sources: outside the package, only ``make nri-descriptors`` reads them
PROTO_DIR = REPO / "third_party" / "nri"


def test_the_descriptors_are_the_vendored_protos_compiled(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    out = tmp_path / "d.binpb"
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "--include_imports",
                           f"--descriptor_set_out={out}", f"-I{PROTO_DIR}", "api.proto", "ttrpc.proto"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    kept = descriptor_pb2.FileDescriptorSet.FromString(Path(messages.DESCRIPTORS).read_bytes())
    assert fresh == kept, "run `make nri-descriptors` after changing api.proto or ttrpc.proto"


def test_the_package_holds_the_descriptors_and_not_their_sources() -> None:
    package = Path(messages.DESCRIPTORS).parent
    assert sorted(p.name for p in package.glob("*.proto")) == []
    assert sorted(p.name for p in PROTO_DIR.glob("*.proto")) == ["api.proto", "ttrpc.proto"]


def test_the_vendored_api_keeps_its_licence_and_names_its_source() -> None:
    head = (PROTO_DIR / "api.proto").read_text()[:1200]
    assert "Licensed under the Apache License, Version 2.0" in head
    assert "github.com/containerd/nri v0.12.2" in head


ROUND_TRIP = """
import sys
sys.path.insert(0, sys.argv[1])
import google.protobuf
from numa_pin.nri import messages
m = messages.load()
req = m.api("CreateContainerRequest")()
req.container.id = "c1"
req.container.linux.resources.cpu.shares.value = 2048
req.container.annotations["k"] = "v"
back = m.api("CreateContainerRequest").FromString(req.SerializeToString())
print(google.protobuf.__version__, back.container.linux.resources.cpu.shares.value, back.container.annotations["k"],
      messages.event_mask(m, ("CREATE_CONTAINER", "REMOVE_CONTAINER")))
"""


@pytest.mark.parametrize("python", [
    pytest.param(sys.executable, id="venv"),
    pytest.param("/usr/bin/python3", id="debian",
                 marks=pytest.mark.skipif(shutil.which("/usr/bin/python3") is None, reason="/usr/bin/python3 is not here")),
])
def test_messages_are_made_on_either_protobuf_runtime(python: str) -> None:
    probe = subprocess.run([python, "-c", "import google.protobuf"], capture_output=True, timeout=60)
    if probe.returncode:
        pytest.skip(f"{python} has no protobuf (apt-get install python3-protobuf)")
    done = subprocess.run([python, "-c", ROUND_TRIP, str(REPO / "src")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    _version, shares, value, mask = done.stdout.split()
    # NRI's EventMask sets bit (event - 1): CREATE_CONTAINER = 4, REMOVE_CONTAINER = 11
    assert (shares, value, int(mask)) == ("2048", "v", (1 << 3) | (1 << 10))


def test_a_file_that_is_no_descriptor_set_is_a_config_error(tmp_path: Path) -> None:
    from numa_pin.errors import ConfigError

    bad = tmp_path / "bad.binpb"
    bad.write_bytes(b"\xff\xff\xff")
    with pytest.raises(ConfigError, match="not NRI's protobuf descriptors"):
        messages.load(str(bad))
