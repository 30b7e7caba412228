"""A fake NRI runtime for tests: the runtime's end of the plugin's socket, speaking real frames.

It frames and unframes with its own code, written from containerd/nri's ``mux.go`` (8-byte
header: connection id, length) and containerd/ttrpc's ``channel.go`` (10-byte header: length,
stream id, type, flags), not with :mod:`numa_pin.nri.wire`, and behaves as NRI's adaptation does:
it waits for ``RegisterPlugin`` on connection 2, answers it, then calls the plugin's service on
connection 1 with odd stream ids, one call at a time. Kubernetes-shaped pods and containers are
made by :func:`pod` and :func:`container` as containerd 1.7 hands them to a plugin.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from numa_pin.nri import messages as nri_messages
from numa_pin.nri import plugin, wire

PLUGIN_CONN, RUNTIME_CONN = 1, 2
REQUEST, RESPONSE = 1, 2


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the plugin closed the connection")
        data += chunk
    return data


class FakeRuntime:
    """The runtime's end of one plugin connection."""

    def __init__(self, sock: socket.socket, m: nri_messages.Messages) -> None:
        self.sock = sock
        self.m = m
        self.next_stream = 1
        self.registered: Any = None
        self._pending = b""
        #: the updates the plugin sent unasked (``UpdateContainers``), in the order they came
        self.unasked: list[Any] = []

    def _send(self, conn: int, stream: int, kind: int, payload: bytes) -> None:
        body = len(payload).to_bytes(4, "big") + stream.to_bytes(4, "big") + bytes([kind, 0]) + payload
        # Go's bufio.Writer may flush one message in several writes: split it in two frames
        half = len(body) // 2
        for piece in (body[:half], body[half:]):
            self.sock.sendall(conn.to_bytes(4, "big") + len(piece).to_bytes(4, "big") + piece)

    def _receive(self) -> tuple[int, int, int, bytes]:
        """One ttrpc message (the plugin writes each in one frame)."""
        head = _read_exact(self.sock, 8)
        conn, size = int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")
        body = _read_exact(self.sock, size)
        length, stream, kind = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big"), body[8]
        assert len(body) == 10 + length
        return conn, stream, kind, body[10:]

    def accept_registration(self) -> Any:
        conn, stream, kind, payload = self._receive()
        assert (conn, kind) == (RUNTIME_CONN, REQUEST)
        request = self.m.ttrpc("Request").FromString(payload)
        assert (request.service, request.method) == (nri_messages.RUNTIME_SERVICE, "RegisterPlugin")
        self.registered = self.m.api("RegisterPluginRequest").FromString(request.payload)
        response = self.m.ttrpc("Response")(payload=self.m.api("Empty")().SerializeToString())
        self._send(RUNTIME_CONN, stream, RESPONSE, response.SerializeToString())
        return self.registered

    def call(self, method: str, request: Any, reply: str) -> tuple[int, str, Any]:
        """``(status code, status message, reply message)`` of one call of the plugin's service."""
        stream, self.next_stream = self.next_stream, self.next_stream + 2
        envelope = self.m.ttrpc("Request")(service=nri_messages.PLUGIN_SERVICE, method=method,
                                           payload=request.SerializeToString(), timeout_nano=2_000_000_000)
        self._send(PLUGIN_CONN, stream, REQUEST, envelope.SerializeToString())
        conn, got_stream, kind, payload = self._receive_answer()
        assert (conn, got_stream, kind) == (PLUGIN_CONN, stream, RESPONSE)
        response = self.m.ttrpc("Response").FromString(payload)
        return response.status.code, response.status.message, self.m.api(reply).FromString(response.payload)

    def _receive_answer(self) -> tuple[int, int, int, bytes]:
        """The next message that is not a request of the plugin's own (those are answered)."""
        while True:
            conn, stream, kind, payload = self._receive()
            if (conn, kind) != (RUNTIME_CONN, REQUEST):
                return conn, stream, kind, payload
            self._answer_unasked(stream, payload)

    def _answer_unasked(self, stream: int, payload: bytes) -> None:
        request = self.m.ttrpc("Request").FromString(payload)
        assert (request.service, request.method) == (nri_messages.RUNTIME_SERVICE, "UpdateContainers")
        self.unasked.extend(self.m.api("UpdateContainersRequest").FromString(request.payload).update)
        response = self.m.ttrpc("Response")(payload=self.m.api("UpdateContainersResponse")().SerializeToString())
        self._send(RUNTIME_CONN, stream, RESPONSE, response.SerializeToString())

    def wait_unasked(self, count: int) -> list[Any]:
        """Answer the plugin's ``UpdateContainers`` requests until ``count`` updates came (30 s at
        most: a plugin that never sends them fails the test instead of hanging it)."""
        self.sock.settimeout(30)
        try:
            while len(self.unasked) < count:
                conn, stream, kind, payload = self._receive()
                assert (conn, kind) == (RUNTIME_CONN, REQUEST), "only the plugin's own requests come unasked"
                self._answer_unasked(stream, payload)
        finally:
            self.sock.settimeout(None)
        return self.unasked

    def configure(self, timeout_ms: int = 2000) -> Any:
        code, text, reply = self.call("Configure", self.m.api("ConfigureRequest")(
            runtime_name="containerd", runtime_version="v1.7.24", registration_timeout=5000,
            request_timeout=timeout_ms), "ConfigureResponse")
        assert code == 0, text
        return reply

    def synchronize(self, pods: list[Any], containers: list[Any], chunk: int | None = None) -> Any:
        """NRI's synchronisation, split in parts of ``chunk`` containers as newer runtimes do."""
        chunk = chunk or max(1, len(containers))
        parts = [containers[i:i + chunk] for i in range(0, len(containers), chunk)] or [[]]
        for i, part in enumerate(parts):
            more = i < len(parts) - 1
            request = self.m.api("SynchronizeRequest")(pods=pods if i == 0 else [], containers=part, more=more)
            code, text, reply = self.call("Synchronize", request, "SynchronizeResponse")
            assert code == 0, text
            assert reply.more == more and (not more or not reply.update)
        return reply

    def create(self, pod_msg: Any, ctr: Any) -> tuple[int, str, Any]:
        return self.call("CreateContainer", self.m.api("CreateContainerRequest")(pod=pod_msg, container=ctr),
                         "CreateContainerResponse")

    def start(self, pod_msg: Any, ctr: Any, as_event: bool = False) -> tuple[int, str, Any]:
        """StartContainer as NRI 0.10 and later call it, or (``as_event``) as the state-change
        event containerd 1.7's NRI sends."""
        if as_event:
            event = self.m.api("StateChangeEvent")(event=self.m.event("START_CONTAINER"), pod=pod_msg, container=ctr)
            return self.call("StateChange", event, "Empty")
        return self.call("StartContainer", self.m.api("StartContainerRequest")(pod=pod_msg, container=ctr),
                         "StartContainerResponse")

    def stop(self, pod_msg: Any, ctr: Any) -> tuple[int, str, Any]:
        return self.call("StopContainer", self.m.api("StopContainerRequest")(pod=pod_msg, container=ctr),
                         "StopContainerResponse")

    def remove(self, pod_msg: Any, ctr: Any) -> tuple[int, str, Any]:
        event = self.m.api("StateChangeEvent")(event=self.m.event("REMOVE_CONTAINER"), pod=pod_msg, container=ctr)
        return self.call("StateChange", event, "Empty")

    def update(self, pod_msg: Any, ctr: Any) -> tuple[int, str, Any]:
        request = self.m.api("UpdateContainerRequest")(pod=pod_msg, container=ctr)
        request.linux_resources.cpu.cpus = "0-31"  # what an update without numa-pin would set
        return self.call("UpdateContainer", request, "UpdateContainerResponse")


def resize(m: nri_messages.Messages, pod_msg: Any, ctr: Any, cpu_milli: int, memory: int) -> Any:
    """kubelet's in-place resize of a Guaranteed container as NRI's UpdateContainer carries it:
    shares, quota and period for ``cpu_milli`` (request = limit), and the memory limit."""
    request = m.api("UpdateContainerRequest")(pod=pod_msg, container=ctr)
    cpu = request.linux_resources.cpu
    cpu.shares.value = cpu_milli * 1024 // 1000
    cpu.quota.value = cpu_milli * 100000 // 1000
    cpu.period.value = 100000
    request.linux_resources.memory.limit.value = memory
    return request


class Connected:
    """A plugin session on one end of a socketpair (in a thread) and the fake runtime on the other."""

    def __init__(self, service: Any, m: nri_messages.Messages) -> None:
        ours, theirs = socket.socketpair()
        self.runtime = FakeRuntime(ours, m)
        self.log: list[str] = []
        self.session = plugin.Session(wire.Channel(theirs, "socketpair"), plugin.Handler(service, m, self.log.append),
                                      "numa-pin", "50")
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.runtime.accept_registration()

    def _run(self) -> None:
        try:
            self.session.run()
        except BaseException as exc:  # handed to the test by close()
            self.error = exc

    def close(self) -> None:
        """The runtime hangs up (a restart); the session must end cleanly."""
        self.runtime.sock.close()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        self.session.channel.close()
        if self.error is not None:
            raise self.error


def pod(m: nri_messages.Messages, uid: str, name: str, qos_dir: str, annotations: dict[str, str] | None = None) -> Any:
    """A pod as containerd's NRI shows it (``qos_dir``: ``""``, ``burstable``, ``besteffort``)."""
    parent = "/".join(p for p in ("/kubepods", qos_dir, f"pod{uid}") if p)
    msg = m.api("PodSandbox")(id=f"sandbox-{uid}", name=name, uid=uid, namespace="default")
    msg.annotations.update(annotations or {})
    msg.linux.cgroup_parent = parent
    return msg


def container(m: nri_messages.Messages, pod_msg: Any, cid: str, *, cpu_milli: int = 0, limit_milli: int = 0,
              memory: int = 0, annotations: dict[str, str] | None = None, state: int = 0, pid: int = 0) -> Any:
    """A container of ``pod_msg`` with kubelet's resources (cpuManagerPolicy none): shares from the
    request, quota from the limit, the memory limit; ``state``/``pid`` for synchronisation."""
    msg = m.api("Container")(id=cid, pod_sandbox_id=pod_msg.id, name=cid, state=state, pid=pid)
    msg.annotations.update({
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.container-name": cid,
        "io.kubernetes.cri.sandbox-id": pod_msg.id,
        "io.kubernetes.cri.sandbox-name": pod_msg.name,
        "io.kubernetes.cri.sandbox-namespace": pod_msg.namespace,
        **(annotations or {}),
    })
    msg.env.extend(["PATH=/usr/bin", "HOSTNAME=x"])
    linux = msg.linux
    linux.cgroups_path = f"{pod_msg.linux.cgroup_parent}/{cid}"
    cpu = linux.resources.cpu
    cpu.shares.value = max(2, cpu_milli * 1024 // 1000)
    cpu.period.value = 100000
    if limit_milli:
        cpu.quota.value = limit_milli * 100000 // 1000
    if memory:
        linux.resources.memory.limit.value = memory
    return msg


__all__ = ["Connected", "FakeRuntime", "container", "pod"]
