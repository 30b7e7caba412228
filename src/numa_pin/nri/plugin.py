"""numa-pin as an NRI plugin: the runtime asks, numa-pin decides, the runtime applies.

:class:`Handler` answers NRI's plugin service through one :class:`~numa_pin.service.node.NodeService`,
the same service and ledger as the hook:

* ``Configure``: subscribes to ``CreateContainer``, ``StartContainer``, ``UpdateContainer``,
  ``StopContainer`` and ``RemoveContainer``, and takes the runtime's request timeout (announced, else NRI's default or
  ``--nri-request-timeout``) as the admission deadline's bound: a plugin that answers late is
  disconnected, and the container starts without it, so a late decision is a refusal instead.
* ``Synchronize`` (after every connect: the plugin's or the runtime's restart): drops the grants
  whose container is gone and repairs drift (``numa-pin reconcile``), releases stopped
  containers, adopts running ones that have no grant (they started while the plugin was away) and
  answers an update for each container that pins it where its grant says.
* ``CreateContainer``: builds the request as the hook does (:func:`numa_pin.nri.convert.spec_of`
  into :func:`numa_pin.hook.admit.request_from_spec`), admits it without a pid against the
  cgroup the runtime will create (as ``precreate`` does) and answers, as the container's
  adjustment, what every resource says the runtime must apply (``NodeResource.runtime``: the
  cpuset, device nodes and their rules, variables); a request NRI cannot carry (a memory
  policy) is refused before anything is decided. A refusal is an error whose message is numa-pin's one line
  (``numa-pin: rejected <id>: <kind>: <why>``), kept as a reason file and in syslog as the hook
  keeps it; the runtime fails the container's creation with it, so the pod's event carries it.
* ``StartContainer``: the container's cgroup exists and it has not run yet: its grant is bound
  to its pid and enforced there (the cpuset as the pool is now, the isolation knobs), as the
  prestart hook does after podman's precreate.
* ``UpdateContainer``: kubelet's in-place resize of an exclusive container's CPU count is
  followed through the ledger under ``resize_follow: adopt`` (KEP-5554: the CPUs it was
  admitted with stay, growth on its NUMA affinity) and refused in one line otherwise; the answer
  is the grant's CPUs and memory nodes, so an update never unpins a container.
  ``StopContainer`` and ``RemoveContainer`` release.

:class:`Session` speaks the wire (:mod:`numa_pin.nri.wire`) on one connection: registers with
``RegisterPlugin`` and serves requests until the runtime hangs up; :func:`serve` connects again
after a runtime restart.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from numa_pin.base.deadline import Deadline
from numa_pin.base.text import cut, one_line
from numa_pin.errors import AdmissionError, NriError, NumaPinError
from numa_pin.ledger.model import Grant
from numa_pin.nri import wire
from numa_pin.nri.adopt import later_round, not_adopted, settle, updates_answered, updates_request
from numa_pin.nri.convert import check_names, fill_adjustment, fill_update, spec_of
from numa_pin.nri.messages import PLUGIN_SERVICE, RUNTIME_SERVICE, Messages, event_mask
from numa_pin.reporting import report
from numa_pin.requests.request import ContainerRequest
from numa_pin.resources.node.resize import follow_resize
from numa_pin.resources.runtime import NRI

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_NAME, DEFAULT_INDEX = "numa-pin", "50"
#: set by a runtime that starts the plugin itself: the connected socket's fd, name and index
SOCKET_ENV, NAME_ENV, INDEX_ENV = "NRI_PLUGIN_SOCKET", "NRI_PLUGIN_NAME", "NRI_PLUGIN_IDX"
EVENTS = ("CREATE_CONTAINER", "START_CONTAINER", "UPDATE_CONTAINER", "STOP_CONTAINER", "REMOVE_CONTAINER")
#: gRPC status codes ttrpc carries
UNKNOWN, INVALID_ARGUMENT, UNIMPLEMENTED = 2, 3, 12
#: the share of the runtime's request timeout an admission may use, and NRI's default timeout
#: (what numa-pin assumes of a runtime that does not announce its own: containerd 1.7 does not)
DEADLINE_SHARE = 0.75
NRI_REQUEST_TIMEOUT_S = 2.0
CONTAINER_STOPPED = 4
#: the most parts (``more``) and bytes of one split Synchronize kept until its last part: a
#: runtime splits only what exceeds its 4 MiB message limit, so this is a node of ~100,000 containers
MAX_SYNC_PARTS, MAX_SYNC_BYTES = 64, 256 << 20


class Handler:
    """NRI's plugin service, answered through ``service`` (a NodeService)."""

    def __init__(self, service: Any, messages: Messages, log: Callable[[str], None],
                 request_timeout_s: float = NRI_REQUEST_TIMEOUT_S) -> None:
        self.service = service
        self.m = messages
        self.log = log
        #: the runtime's request timeout: announced at Configure, else ``request_timeout_s``
        self.request_timeout_s = request_timeout_s
        self._sync_pods: list[Any] = []
        self._sync_containers: list[Any] = []
        self._sync_parts = self._sync_bytes = 0
        #: running containers the last Synchronize's budget left, adopted after its answer
        #: (:mod:`numa_pin.nri.adopt`)
        self.later: list[Any] = []
        self._methods: dict[str, tuple[str, Callable[[Any], Any]]] = {
            "Configure": ("ConfigureRequest", self.configure),
            "Synchronize": ("SynchronizeRequest", self.synchronize),
            "Shutdown": ("Empty", self.shutdown),
            "CreateContainer": ("CreateContainerRequest", self.create_container),
            "StartContainer": ("StartContainerRequest", self.start_container),
            "UpdateContainer": ("UpdateContainerRequest", self.update_container),
            "StopContainer": ("StopContainerRequest", self.stop_container),
            "RemoveContainer": ("RemoveContainerRequest", self.remove_container),
            "StateChange": ("StateChangeEvent", self.state_change),
        }

    def call(self, method: str, payload: bytes) -> tuple[int, str, bytes]:
        """``(status code, message, response payload)`` for one request of the plugin service."""
        entry = self._methods.get(method)
        if entry is None:
            return UNIMPLEMENTED, f"numa-pin does not handle {method}", b""
        try:
            request = self.m.api(entry[0]).FromString(payload)
        except Exception as exc:  # protobuf's DecodeError: the runtime sent garbage
            return INVALID_ARGUMENT, f"numa-pin: cannot read {method}: {exc}", b""
        try:
            return 0, "", entry[1](request).SerializeToString()
        except NumaPinError as exc:
            return UNKNOWN, self._refusal(method, request, exc), b""
        except Exception as exc:  # the boundary: the runtime gets one line, the plugin keeps serving
            line = cut(one_line(f"numa-pin: internal error {_cid(request)}: {type(exc).__name__}: {exc}"))
            self.log(f"{method}: {line}")
            return UNKNOWN, line, b""

    def _refusal(self, method: str, request: Any, exc: NumaPinError) -> str:
        cid = _cid(request)
        verb = "rejected" if isinstance(exc, AdmissionError) else "error"  # the hook's words
        line = cut(one_line(f"numa-pin: {verb} {cid}: {exc.kind}: {exc}"))
        self.log(f"{method}: {line}")
        cfg = self.service.config
        if cid != "?":
            report.write_reason(cfg.state_dir, cid, line, {"kind": exc.kind})
        if cfg.syslog:
            report.log_syslog(line)
        return line

    # ---- the plugin service -----------------------------------------------------------------
    def configure(self, req: Any) -> Any:
        if req.request_timeout > 0:
            self.request_timeout_s = req.request_timeout / 1000
        self.log(f"configured by {req.runtime_name} {req.runtime_version} "
                 f"(request timeout {self.request_timeout_s:g}s{'' if req.request_timeout > 0 else ', assumed'})")
        self.service.topology  # noqa: B018  (read it now: the first admission must answer in time)
        return self.m.api("ConfigureResponse")(events=event_mask(self.m, EVENTS))

    def synchronize(self, req: Any) -> Any:
        self._sync_parts += 1
        self._sync_bytes += req.ByteSize()
        if self._sync_parts > MAX_SYNC_PARTS or self._sync_bytes > MAX_SYNC_BYTES:
            parts, size = self._sync_parts, self._sync_bytes
            self._sync_pods, self._sync_containers, self._sync_parts, self._sync_bytes = [], [], 0, 0
            raise NriError(f"Synchronize split in more than {MAX_SYNC_PARTS} parts or {MAX_SYNC_BYTES} bytes "
                           f"({parts} parts, {size} bytes so far): its parts are dropped")
        self._sync_pods += req.pods
        self._sync_containers += req.containers
        if req.more:  # the runtime splits a large state; the answer comes with the last part
            return self.m.api("SynchronizeResponse")(more=True)
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers, self._sync_parts, self._sync_bytes = [], [], 0, 0
        response = self.m.api("SynchronizeResponse")()
        for update in self.adopt({p.id: p for p in pods}, containers):
            response.update.append(update)
        return response

    def shutdown(self, req: Any) -> Any:
        self.log("the runtime is shutting down")
        return self.m.api("Empty")()

    def create_container(self, req: Any) -> Any:
        grant, request = self._admit(req.pod, req.container, None)
        response = self.m.api("CreateContainerResponse")()
        fill_adjustment(response.adjust, self.service.runtime_edit(grant, request, NRI))
        return response

    def start_container(self, req: Any) -> Any:
        self._start(req.pod, req.container)
        return self.m.api("StartContainerResponse")()

    def _start(self, pod: Any, container: Any) -> None:
        """The container's cgroup and process exist now, and it has not run yet: its grant is
        bound to the pid and made true there, as prestart does after podman's precreate. So a
        shared container created before an exclusive grant starts on the shared pool as it is
        now, not as it was at its creation, and what the runtime does not apply (the isolation
        knobs, VFs moved into its namespace) is applied before it runs."""
        if container.id and container.pid and container.id in self.service.ledger.read().grants:
            self._admit(pod, container, container.pid)

    def update_container(self, req: Any) -> Any:
        """kubelet's in-place resize changes the container's exclusive CPU count: the grant follows
        it under ``resize_follow: adopt`` or the update is refused in one line; any other update
        gets the grant's cpuset back, so it never unpins the container."""
        response = self.m.api("UpdateContainerResponse")()
        grant = self.service.ledger.read().grants.get(req.container.id)
        if grant is not None and grant.cpus and req.HasField("linux_resources"):
            resized = self.m.api("Container")()
            resized.CopyFrom(req.container)
            resized.linux.resources.MergeFrom(req.linux_resources)  # what the update sets, over what was
            follow_resize(self.service, grant, self.request_of(req.pod, resized).amounts.cpus)
        update = self.update_of(req.container.id)
        if update is not None:
            response.update.append(update)
        return response

    def stop_container(self, req: Any) -> Any:
        self._release(req.container.id)
        return self.m.api("StopContainerResponse")()

    def remove_container(self, req: Any) -> Any:
        self._release(req.container.id)
        return self.m.api("RemoveContainerResponse")()

    def state_change(self, req: Any) -> Any:
        """Older runtimes (NRI before 0.10: containerd 1.7) send the start and the removal as events."""
        if req.event in (self.m.event("REMOVE_CONTAINER"), self.m.event("STOP_CONTAINER")) and req.container.id:
            self._release(req.container.id)
        elif req.event == self.m.event("START_CONTAINER"):
            self._start(req.pod, req.container)
        return self.m.api("Empty")()

    # ---- the decisions ------------------------------------------------------------------------
    def request_of(self, pod: Any, container: Any) -> Any:
        """The hook's request for this container (:func:`numa_pin.hook.admit.request_from_spec`)."""
        from numa_pin.hook.admit import request_from_spec
        from numa_pin.hook.oci import OciState

        check_names(pod, container)
        state = OciState(id=container.id, status="creating", pid=None, bundle="/")
        return request_from_spec(state, spec_of(pod, container), self.service.config)

    def deadline(self, what: str) -> Deadline:
        """The budget of one request: three quarters of the runtime's timeout, at most the config's."""
        bound = min(self.service.config.admission_timeout_s, self.request_timeout_s * DEADLINE_SHARE)
        return Deadline(bound, what)

    def _admit(self, pod: Any, container: Any, pid: int | None,
               deadline: Deadline | None = None) -> tuple[Grant, ContainerRequest]:
        """The grant of one container, and the request it was admitted for."""
        from numa_pin.hook.precreate import expected_cgroup

        if not container.id:
            raise NriError("the runtime sent a container without an id")
        request = self.request_of(pod, container)
        cfg = self.service.config
        admitted = self.service.admit(request, pid, deadline=deadline or self.deadline(f"admission of {container.id}"),
                                      expected_cgroup=expected_cgroup(container.linux.cgroups_path or None),
                                      target=NRI)
        report.forget_reason(cfg.state_dir, container.id)
        self.log(report.decision_line(admitted.grant, "admitted" if admitted.decision else "re-applied"))
        return admitted.grant, request

    def _release(self, container_id: str) -> None:
        grant = self.service.release(container_id)
        if grant is not None:
            report.forget_reason(self.service.config.state_dir, container_id)
            self.log(report.decision_line(grant, "released"))

    def update_of(self, container_id: str, state: Any = None) -> Any | None:
        """The update that pins a container where its grant says (``state``: the ledger, when the
        caller read it already), or None when it holds no grant."""
        state = self.service.ledger.read() if state is None else state
        grant = state.grants.get(container_id)
        if grant is None:
            return None
        update = self.m.api("ContainerUpdate")(container_id=container_id)
        edit = self.service.runtime_edit(grant, None, NRI, state)
        return update if fill_update(update.linux.resources, edit) else None

    def adopt(self, pods: Mapping[str, Any], containers: list[Any]) -> list[Any]:
        """Bring the ledger in line with the runtime's containers; the updates that pin them.

        The running containers that hold no grant are adopted as one batch, in one ledger
        transaction (:meth:`~numa_pin.service.node.NodeService.adopt_batch`): the runtime waits for one
        answer for all of them, and a busy node has thousands."""
        from numa_pin.hook.precreate import expected_cgroup
        from numa_pin.service.adopt import Adoptee

        removed, repaired = self.service.reconcile()
        if removed or repaired:
            self.log(f"synchronized: {len(removed)} grant(s) of gone containers dropped, "
                     f"{len(repaired)} container(s) repaired")
        known = self.service.ledger.read().grants
        budget = self.deadline("synchronisation")  # one answer for all: one budget for all
        running, adoptees = [], []
        for container in containers:
            if container.state == CONTAINER_STOPPED:
                self._release(container.id)
                continue
            running.append(container.id)
            if container.id in known:
                continue
            pod = pods.get(container.pod_sandbox_id) or self.m.api("PodSandbox")()
            try:
                request = self.request_of(pod, container)
            except NumaPinError as exc:
                not_adopted(self, container.id, exc)
                continue
            cgroup = expected_cgroup(container.linux.cgroups_path or None)
            adoptees.append(Adoptee(request, container.pid or None, cgroup))
        adopted, self.later = settle(self, adoptees, budget) if adoptees else ([], [])
        if adoptees:
            self.log(f"synchronized: {len(adopted)} running container(s) adopted, "
                     f"{len(adoptees) - len(adopted) - len(self.later)} not, {len(self.later)} after the answer")
        state = self.service.ledger.read()  # once for every update: a busy node has thousands
        updates = [self.update_of(cid, state) for cid in running]
        return [u for u in updates if u is not None]

    def adopt_later(self) -> list[Any]:
        """One round of what the last Synchronize's budget left (:func:`numa_pin.nri.adopt.later_round`)."""
        return later_round(self)


def _cid(request: Any) -> str:
    return getattr(getattr(request, "container", None), "id", "") or "?"


class Session:
    """One connection to the runtime: register, then answer until it hangs up."""

    def __init__(self, channel: wire.Channel, handler: Handler, name: str, index: str) -> None:
        self.channel = channel
        self.handler = handler
        self.name, self.index = name, index
        self.registered = False
        #: the stream of this end's next request to the runtime (ttrpc: odd, 1 is the registration)
        self._stream = 3

    def register(self) -> None:
        m = self.handler.m
        body = m.api("RegisterPluginRequest")(plugin_name=self.name, plugin_idx=self.index)
        request = m.ttrpc("Request")(service=RUNTIME_SERVICE, method="RegisterPlugin",
                                     payload=body.SerializeToString())
        self.channel.send(wire.Message(wire.RUNTIME_CONN, 1, wire.REQUEST, request.SerializeToString()))

    def run(self) -> None:
        """Serve until the runtime closes the connection. Raises NriError when the runtime refuses
        the registration or sends what cannot be read."""
        self.register()
        while True:
            if self.handler.later and self.registered and not self.channel.pending():
                self._update_containers(self.handler.adopt_later())  # between the runtime's requests
                continue
            message = self.channel.receive()
            if message is None:
                return
            if message.conn == wire.RUNTIME_CONN and message.kind == wire.RESPONSE and message.stream != 1:
                updates_answered(self.handler, self._parse("Response", message.payload), self.channel.where)
            elif message.conn == wire.RUNTIME_CONN and message.kind == wire.RESPONSE:
                self._registered(message)
            elif message.conn == wire.PLUGIN_CONN and message.kind == wire.REQUEST:
                self._answer(message)

    def _registered(self, message: wire.Message) -> None:
        response = self._parse("Response", message.payload)
        if response.status.code:
            raise NriError(f"the runtime refused to register plugin {self.index}-{self.name}: "
                           f"{response.status.message}", path=self.channel.where)
        self.registered = True
        self.handler.log(f"registered as {self.index}-{self.name}")

    def _update_containers(self, updates: list[Any]) -> None:
        """Send the runtime ``updates`` it did not ask for (``UpdateContainers``)."""
        if updates:
            stream, self._stream = self._stream, self._stream + 2
            payload = updates_request(self.handler.m, updates)
            self.channel.send(wire.Message(wire.RUNTIME_CONN, stream, wire.REQUEST, payload))

    def _answer(self, message: wire.Message) -> None:
        m = self.handler.m
        request = self._parse("Request", message.payload)
        if request.service != PLUGIN_SERVICE:
            code, text, payload = UNIMPLEMENTED, f"numa-pin serves no {request.service}", b""
        else:
            code, text, payload = self.handler.call(request.method, request.payload)
        response = m.ttrpc("Response")(payload=payload)
        if code:
            response.status.code, response.status.message = code, text
        self.channel.send(wire.Message(wire.PLUGIN_CONN, message.stream, wire.RESPONSE, response.SerializeToString()))

    def _parse(self, name: str, payload: bytes) -> Any:
        try:
            return self.handler.m.ttrpc(name).FromString(payload)
        except Exception as exc:  # protobuf's DecodeError
            raise NriError(f"unreadable ttrpc {name}: {exc}", path=self.channel.where) from exc


def connect(path: str, env: Mapping[str, str]) -> socket.socket:
    """The runtime's socket: the one a runtime that started the plugin passed, else ``path``.
    Raises NriError when it cannot be reached."""
    fd = env.get(SOCKET_ENV)
    if fd:
        try:
            return socket.socket(fileno=int(fd))
        except (ValueError, OSError) as exc:
            raise NriError(f"{SOCKET_ENV}={fd!r} is not a connected socket: {exc}") from exc
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise NriError(f"cannot connect ({exc.strerror or exc}); is NRI enabled in the runtime?", path=path) from exc
    return sock


def serve(path: str, make_service: Callable[[], Any], messages: Messages, *, env: Mapping[str, str] | None = None,
          name: str | None = None, index: str | None = None, retry_s: float = 1.0,
          log: Callable[[str], None] | None = None, once: bool = False,
          request_timeout_s: float = NRI_REQUEST_TIMEOUT_S) -> int:
    """Run the plugin: connect, register, answer; connect again (every ``retry_s``) when the
    runtime goes away, unless the runtime started the plugin itself (``NRI_PLUGIN_SOCKET``) or
    ``once``. ``make_service`` gives a fresh NodeService per connection (the config is read again);
    ``request_timeout_s`` is the runtime's request timeout when it does not announce one."""
    env = os.environ if env is None else env
    say = log or _stderr
    name = name or env.get(NAME_ENV) or DEFAULT_NAME
    index = index or env.get(INDEX_ENV) or DEFAULT_INDEX
    preconnected = bool(env.get(SOCKET_ENV))
    complained = False
    while True:
        try:
            sock = connect(path, env)
        except NriError as exc:
            if once or preconnected:
                raise
            if not complained:
                say(f"numa-pin: {exc}; trying again every {retry_s:g}s")
                complained = True
            time.sleep(retry_s)
            continue
        complained = False
        channel = wire.Channel(sock, path)
        try:
            Session(channel, Handler(make_service(), messages, say, request_timeout_s), name, index).run()
            say("numa-pin: the runtime closed the NRI connection")
        except NriError as exc:
            say(f"numa-pin: {exc}")
            if once or preconnected:
                raise
        finally:
            channel.close()
        if once or preconnected:
            return 0
        time.sleep(retry_s)


def _stderr(line: str) -> None:
    import sys

    print(cut(one_line(line)), file=sys.stderr, flush=True)


__all__ = ["DEFAULT_INDEX", "DEFAULT_NAME", "DEFAULT_SOCKET", "EVENTS", "Handler", "Session", "connect", "serve"]
