"""A pod-resources server for the tests: grpcio serving ``v1.PodResourcesLister`` on a Unix socket
in a temporary directory, with message classes that ``grpc_tools.protoc`` generates from
``third_party/podresources/api.proto`` here (not the client's descriptor set, which
``test_descriptors.py`` checks separately)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

REPO = Path(__file__).resolve().parents[2]
PROTO = REPO / "third_party" / "podresources" / "api.proto"
SERVICE = "v1.PodResourcesLister"

Handler = Callable[[Any, Any], Any]


@pytest.fixture(scope="session")
def pb(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The generated ``_pb2`` module of the project's proto (under another file name, so that
    it cannot clash with another ``api.proto`` in protobuf's default pool)."""
    pytest.importorskip("grpc_tools")
    out = tmp_path_factory.mktemp("pb")
    shutil.copy(PROTO, out / "podres_test_api.proto")
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}",
                           "podres_test_api.proto"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    spec = importlib.util.spec_from_file_location("podres_test_api_pb2", out / "podres_test_api_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def serve(pb: ModuleType) -> Iterator[Callable[..., str]]:
    """``serve(list=fn, allocatable=fn, path=None)``: start a server whose handlers are
    ``fn(request, context)`` on ``path`` (default: a new short temporary directory's
    ``kubelet.sock``), and return the socket's path; every server stops when the test ends."""
    servers: list[Any] = []
    dirs: list[tempfile.TemporaryDirectory[str]] = []

    def start(list: Handler | None = None, allocatable: Handler | None = None, path: str | None = None) -> str:
        handlers = {}
        if list is not None:
            handlers["List"] = grpc.unary_unary_rpc_method_handler(
                list, request_deserializer=pb.ListPodResourcesRequest.FromString,
                response_serializer=pb.ListPodResourcesResponse.SerializeToString)
        if allocatable is not None:
            handlers["GetAllocatableResources"] = grpc.unary_unary_rpc_method_handler(
                allocatable, request_deserializer=pb.AllocatableResourcesRequest.FromString,
                response_serializer=pb.AllocatableResourcesResponse.SerializeToString)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        if path is None:
            tmp = tempfile.TemporaryDirectory(prefix="podres-")  # short: a socket path has 107 bytes
            dirs.append(tmp)
            path = str(Path(tmp.name) / "kubelet.sock")
        server.add_insecure_port(f"unix:{path}")
        server.start()
        servers.append(server)
        return path

    yield start
    for server in servers:
        server.stop(0).wait(5)
    for tmp in dirs:
        tmp.cleanup()
