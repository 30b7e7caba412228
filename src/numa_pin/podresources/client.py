"""kubelet's pod-resources API: the pods and containers kubelet runs, and what it can hand out.

kubelet serves ``v1.PodResourcesLister`` (gRPC, HTTP/2 on a Unix socket) at
``<kubelet root>/pod-resources/kubelet.sock``. Two of its calls are read here:

* ``List``: every pod kubelet runs (namespace, name), its containers, and what kubelet's own
  managers assigned to each: devices of device plugins (with their NUMA nodes), and, under the
  static CPU and memory managers, exclusive CPUs and memory blocks (with their NUMA nodes);
* ``GetAllocatableResources``: the devices, CPUs and memory kubelet can hand out.

``numa-pin nrt`` signs the pods of ``List`` (:func:`pod_names`; the NFD topology updater does
the same) as the ``nodeTopologyPodsFingerprint`` the scheduler compares with the pods it sees
bound to the node.

Every call is bounded: a deadline (``timeout_s``), a largest answer (``max_message_bytes``,
gRPC's receive limit, as kubelet's own client sets one) and a largest number of pods and of
containers per pod; beyond any of them the call raises :class:`~numa_pin.errors.KubeletError`
naming the socket, never a partial answer (a fingerprint of part of the pods would be wrong).
Messages come from ``descriptors.binpb`` (``third_party/podresources/api.proto`` compiled by
``make podresources-descriptors``), as NRI's do. Not on the hook's path (gRPC and protobuf are
slow to import).
"""

from __future__ import annotations

import os
import stat
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from numa_pin.base.boundedio import read_regular_file
from numa_pin.base.record import record
from numa_pin.base.text import MAX_QUOTED, cut, one_line, quote
from numa_pin.errors import ConfigError, KubeletError

#: the descriptor set next to this module
DESCRIPTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "descriptors.binpb")
MAX_DESCRIPTOR_BYTES = 1 << 20
#: the socket under kubelet's root directory (kubelet's ``pod-resources/kubelet.sock``)
SOCKET_UNDER_ROOT = os.path.join("pod-resources", "kubelet.sock")
SERVICE = "v1.PodResourcesLister"
DEFAULT_TIMEOUT_S = 5.0
#: kubelet's own pod-resources client allows 16 MiB answers; a node's pods need far less
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20
#: kubelet's maxPods is 110 by default; nodes raised to a few hundred exist
DEFAULT_MAX_PODS = 4096
DEFAULT_MAX_CONTAINERS = 256


def socket_path(kubelet_root: str) -> str:
    """The pod-resources socket of the kubelet whose root directory is ``kubelet_root``."""
    return os.path.join(kubelet_root, SOCKET_UNDER_ROOT)


@record
class Devices:
    """Devices of one resource (``resource``: ``vendor.com/gpu``) and their NUMA nodes."""

    resource: str
    ids: tuple[str, ...]
    numa_nodes: frozenset[int]


@record
class Memory:
    """A block of memory (``kind``: ``memory``, ``hugepages-2Mi``) of ``size`` bytes."""

    kind: str
    size: int
    numa_nodes: frozenset[int]


@record
class Container:
    """One container as kubelet sees it; ``cpus`` and ``memory`` are what kubelet's static
    managers assigned exclusively (empty under their ``none`` policies)."""

    name: str
    devices: tuple[Devices, ...]
    cpus: frozenset[int]
    memory: tuple[Memory, ...]


@record
class Pod:
    namespace: str
    name: str
    containers: tuple[Container, ...]


@record
class Allocatable:
    """What kubelet can hand out: ``GetAllocatableResources``."""

    devices: tuple[Devices, ...]
    cpus: frozenset[int]
    memory: tuple[Memory, ...]


def pod_names(pods: tuple[Pod, ...] | list[Pod]) -> list[tuple[str, str]]:
    """``(namespace, name)`` of each pod, what :func:`numa_pin.cluster.nrt.pods_fingerprint` signs."""
    return [(pod.namespace, pod.name) for pod in pods]


def _nodes(topology: Any) -> frozenset[int]:
    return frozenset(int(node.ID) for node in topology.nodes)


def _devices(items: Any) -> tuple[Devices, ...]:
    return tuple(Devices(d.resource_name, tuple(d.device_ids), _nodes(d.topology)) for d in items)


def _memory(items: Any) -> tuple[Memory, ...]:
    return tuple(Memory(m.memory_type, int(m.size), _nodes(m.topology)) for m in items)


class PodResourcesClient:
    """A client of one kubelet's pod-resources socket; a context manager (closes its channel).

    Raises (every call): :class:`KubeletError` naming the socket when it is not a socket, does
    not answer within ``timeout_s``, answers more than ``max_message_bytes``, more than
    ``max_pods`` pods or ``max_containers`` containers in a pod, or fails otherwise;
    :class:`ConfigError` when the descriptor set is unusable.
    """

    def __init__(self, path: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_pods: int = DEFAULT_MAX_PODS,
                 max_containers: int = DEFAULT_MAX_CONTAINERS, descriptors: str = DESCRIPTORS) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self.max_pods = max_pods
        self.max_containers = max_containers
        self._pool = _load_pool(descriptors)
        self._channel: grpc.Channel | None = None
        self._classes: dict[str, Any] = {}

    def message(self, name: str) -> Any:
        """The message class ``v1.<name>`` (``ListPodResourcesResponse``), made once."""
        cls = self._classes.get(name)
        if cls is None:
            desc = self._pool.FindMessageTypeByName(f"v1.{name}")
            make = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.21
            cls = make(desc) if make is not None else message_factory.MessageFactory(self._pool).GetPrototype(desc)
            self._classes[name] = cls
        return cls

    def list(self) -> tuple[Pod, ...]:
        """``List``: the pods kubelet runs, in kubelet's order."""
        answer = self._call("List", "ListPodResourcesRequest", "ListPodResourcesResponse")
        if len(answer.pod_resources) > self.max_pods:
            raise KubeletError(f"List: {len(answer.pod_resources)} pods, more than the {self.max_pods} read",
                               path=self.path)
        pods = []
        for pod in answer.pod_resources:
            if len(pod.containers) > self.max_containers:
                raise KubeletError(f"List: pod {quote(pod.namespace + '/' + pod.name)} has {len(pod.containers)} "
                                   f"containers, more than the {self.max_containers} read", path=self.path)
            if not pod.name:
                raise KubeletError("List: a pod without a name", path=self.path)
            containers = tuple(Container(c.name, _devices(c.devices), frozenset(int(i) for i in c.cpu_ids),
                                         _memory(c.memory)) for c in pod.containers)
            pods.append(Pod(pod.namespace, pod.name, containers))
        return tuple(pods)

    def allocatable(self) -> Allocatable:
        """``GetAllocatableResources``."""
        answer = self._call("GetAllocatableResources", "AllocatableResourcesRequest", "AllocatableResourcesResponse")
        return Allocatable(_devices(answer.devices), frozenset(int(i) for i in answer.cpu_ids), _memory(answer.memory))

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _connect(self) -> grpc.Channel:
        if self._channel is None:
            try:
                mode = os.stat(self.path).st_mode
            except OSError as exc:
                raise KubeletError(f"kubelet's pod-resources socket: {exc.strerror}", path=self.path) from exc
            if not stat.S_ISSOCK(mode):
                raise KubeletError("not a socket (kubelet's pod-resources socket)", path=self.path)
            self._channel = grpc.insecure_channel(
                "unix:" + os.path.abspath(self.path),
                options=[("grpc.max_receive_message_length", self.max_message_bytes),
                         ("grpc.max_send_message_length", 1 << 10), ("grpc.enable_retries", 0)])
        return self._channel

    def _call(self, method: str, request: str, response: str) -> Any:
        call = self._connect().unary_unary(f"/{SERVICE}/{method}",
                                           request_serializer=lambda m: m.SerializeToString(),
                                           response_deserializer=self.message(response).FromString)
        try:
            return call(self.message(request)(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise KubeletError(_why(method, exc, self.timeout_s, self.max_message_bytes), path=self.path) from exc


def _why(method: str, exc: grpc.RpcError, timeout_s: float, max_bytes: int) -> str:
    """One line for a failed call."""
    code = exc.code() if isinstance(exc, grpc.Call) else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{method}: kubelet did not answer within {timeout_s:g} s"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return f"{method}: kubelet's answer is larger than the {max_bytes} bytes read"
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return f"{method}: {code.name if code is not None else 'failed'}: {one_line(cut(details, MAX_QUOTED))}"


def _load_pool(path: str) -> descriptor_pool.DescriptorPool:
    """The descriptor pool of the set at ``path``. Raises ConfigError naming the file."""
    try:
        fds = descriptor_pb2.FileDescriptorSet.FromString(read_regular_file(path, MAX_DESCRIPTOR_BYTES))
        pool = descriptor_pool.DescriptorPool()
        for proto in fds.file:
            pool.Add(proto)
        pool.FindServiceByName(SERVICE)
    except (OSError, ValueError, TypeError, KeyError, message.Error) as exc:
        raise ConfigError(f"not the pod-resources descriptors ({exc})", path=path) from exc
    return pool


__all__ = ["DEFAULT_MAX_CONTAINERS", "DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_MAX_PODS", "DEFAULT_TIMEOUT_S",
           "DESCRIPTORS", "SOCKET_UNDER_ROOT", "Allocatable", "Container", "Devices", "Memory", "Pod",
           "PodResourcesClient", "pod_names", "socket_path"]
