"""Drive containerd's CRI plugin as kubelet does, for the CRI tier (test_cri_e2e.py).

* :func:`compile_api`: the CRI client, compiled at test time by grpcio-tools from cri-api's
  ``api.proto`` (vendored in ``cri_api/`` with its license header) into a build directory;
* :func:`image_archive`: an image without a registry: a docker-archive tar of a busybox
  rootfs, for ``ctr images import``;
* :class:`Pod` / :class:`Container`: a pod definition (requests and limits per container), and
  :class:`Kubelet`: the requests kubelet builds from it (``RunPodSandbox`` with kubelet's labels,
  annotations and ``/kubepods/...`` cgroup parent; ``CreateContainer`` with the
  ``LinuxContainerResources`` of cpuManagerPolicy ``none``), written after kubelet's
  ``generatePodSandboxConfig``, ``generateContainerConfig`` and ``generateLinuxContainerResources``.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import subprocess
import sys
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

API_PROTO = Path(__file__).resolve().parent / "cri_api" / "api.proto"
PERIOD = 100000  # kubelet's CFS period
GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"
NODE_MEMORY = 1 << 40  # the capacity kubelet's Burstable oom_score_adj is computed against
NODE = 2  # NamespaceMode NODE: host network
POD_NS, CONTAINER_NS = 0, 1
RUNNING, EXITED = 1, 2


def compile_api(build: Path) -> tuple[ModuleType, ModuleType]:
    """``(api_pb2, api_pb2_grpc)`` compiled from :data:`API_PROTO` into ``build/<digest>``
    (kept when it is there already)."""
    digest = hashlib.sha256(API_PROTO.read_bytes()).hexdigest()[:16]
    out = build / f"cri-{digest}"
    if not (out / "api_pb2_grpc.py").is_file():
        out.mkdir(parents=True, exist_ok=True)
        (out / "api.proto").write_bytes(API_PROTO.read_bytes())
        done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}",
                               f"--grpc_python_out={out}", str(out / "api.proto")],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"protoc failed: {done.stderr}")
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module("api_pb2"), importlib.import_module("api_pb2_grpc")


def image_archive(rootfs: Path, tar: Path, ref: str, cmd: list[str]) -> Path:
    """A docker-archive image of ``rootfs`` named ``ref`` whose command is ``cmd``."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        for path in sorted(rootfs.rglob("*")):
            t.add(path, arcname=str(path.relative_to(rootfs)), recursive=False)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": cmd, "Env": ["PATH=/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(tar, "w") as t:
        for name, data in (("layer.tar", layer_bytes), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return tar


# ---- kubelet's side, transcribed ---------------------------------------------------------------
def milli_cpu_to_shares(milli: int) -> int:
    return 2 if milli == 0 else max(2, min(milli * 1024 // 1000, 262144))


def milli_cpu_to_quota(milli: int, period: int) -> int:
    return 0 if milli == 0 else max(milli * period // 1000, 1000)


@dataclass
class Container:
    name: str
    requests: dict[str, int] = field(default_factory=dict)  # cpu in millicores, memory in bytes
    limits: dict[str, int] = field(default_factory=dict)
    command: tuple[str, ...] = ("sleep", "3600")

    def effective_requests(self) -> dict[str, int]:
        return {**self.limits, **self.requests}  # API defaulting: requests default to limits


@dataclass
class Pod:
    name: str
    containers: list[Container]
    namespace: str = "numa-pin-e2e"
    annotations: dict[str, str] = field(default_factory=dict)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))

    @property
    def qos(self) -> str:
        """kubelet's GetPodQOS."""
        requests: dict[str, int] = {}
        limits: dict[str, int] = {}
        guaranteed = True
        for c in self.containers:
            for res, v in c.effective_requests().items():
                requests[res] = requests.get(res, 0) + v
            for res, v in c.limits.items():
                limits[res] = limits.get(res, 0) + v
            if set(c.limits) != {"cpu", "memory"}:
                guaranteed = False
        if not requests and not limits:
            return BEST_EFFORT
        return GUARANTEED if guaranteed and requests == limits else BURSTABLE

    def cgroup_parent(self, driver: str) -> str:
        level = {GUARANTEED: [], BURSTABLE: ["burstable"], BEST_EFFORT: ["besteffort"]}[self.qos]
        names = ["kubepods", *level, f"pod{self.uid}"]
        if driver == "systemd":
            return "-".join(n.replace("-", "_") for n in names) + ".slice"
        return "/" + "/".join(names)


class Kubelet:
    """The CRI calls kubelet makes, on one containerd's CRI socket."""

    def __init__(self, address: str, build: Path, log_root: Path, handler: str = "", driver: str = "cgroupfs"):
        import grpc

        self.pb, grpc_mod = compile_api(build)
        self.channel = grpc.insecure_channel(f"unix://{address}")
        self.runtime = grpc_mod.RuntimeServiceStub(self.channel)
        self.log_root, self.handler, self.driver = log_root, handler, driver
        self.image = ""
        self.pods_run: list[Pod] = []

    def close(self) -> None:
        self.channel.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.runtime.Version(self.pb.VersionRequest(), timeout=5)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _namespaces(self) -> Any:
        return self.pb.NamespaceOption(network=NODE, pid=CONTAINER_NS, ipc=POD_NS)

    def sandbox_config(self, pod: Pod, attempt: int = 0) -> Any:
        pb = self.pb
        log_dir = self.log_root / f"{pod.namespace}_{pod.name}_{pod.uid}"
        log_dir.mkdir(parents=True, exist_ok=True)
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=attempt),
            log_directory=str(log_dir),
            labels={"io.kubernetes.pod.name": pod.name, "io.kubernetes.pod.namespace": pod.namespace,
                    "io.kubernetes.pod.uid": pod.uid},
            annotations={"kubernetes.io/config.seen": "2026-11-26T00:00:00Z", "kubernetes.io/config.source": "api",
                         **pod.annotations},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=pod.cgroup_parent(self.driver),
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=self._namespaces()),
            ),
        )

    def run_pod(self, pod: Pod, attempt: int = 0) -> str:
        req = self.pb.RunPodSandboxRequest(config=self.sandbox_config(pod, attempt), runtime_handler=self.handler)
        self.pods_run.append(pod)
        return self.runtime.RunPodSandbox(req, timeout=120).pod_sandbox_id

    def resources(self, pod: Pod, c: Container) -> Any:
        """generateLinuxContainerResources under cpuManagerPolicy none (no cpuset)."""
        req = c.effective_requests()
        out: dict[str, Any] = {"cpu_shares": milli_cpu_to_shares(req.get("cpu", 0)), "cpu_period": PERIOD}
        if "cpu" in c.limits:
            out["cpu_quota"] = milli_cpu_to_quota(c.limits["cpu"], PERIOD)
        if "memory" in c.limits:
            out["memory_limit_in_bytes"] = c.limits["memory"]
        qos = pod.qos
        if qos == GUARANTEED:
            out["oom_score_adj"] = -997
        elif qos == BEST_EFFORT:
            out["oom_score_adj"] = 1000
        else:
            adj = 1000 - (1000 * req.get("memory", 0)) // NODE_MEMORY
            out["oom_score_adj"] = min(max(adj, 2), 999)
        return self.pb.LinuxContainerResources(**out)

    def create(self, sandbox_id: str, pod: Pod, c: Container, attempt: int = 0, sandbox_attempt: int = 0) -> str:
        pb = self.pb
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=c.name, attempt=attempt),
            image=pb.ImageSpec(image=self.image),
            command=list(c.command),
            labels={"io.kubernetes.container.name": c.name, "io.kubernetes.pod.name": pod.name,
                    "io.kubernetes.pod.namespace": pod.namespace, "io.kubernetes.pod.uid": pod.uid},
            annotations={"io.kubernetes.container.hash": f"{abs(hash(c.name)) & 0xffffffff:x}",
                         "io.kubernetes.container.restartCount": str(attempt),
                         "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                         "io.kubernetes.container.terminationMessagePolicy": "File",
                         "io.kubernetes.pod.terminationGracePeriod": "30"},
            log_path=f"{c.name}/{attempt}.log",
            linux=pb.LinuxContainerConfig(
                resources=self.resources(pod, c),
                security_context=pb.LinuxContainerSecurityContext(namespace_options=self._namespaces()),
            ),
        )
        req = pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config,
                                        sandbox_config=self.sandbox_config(pod, sandbox_attempt))
        return self.runtime.CreateContainer(req, timeout=120).container_id

    def start(self, cid: str) -> None:
        self.runtime.StartContainer(self.pb.StartContainerRequest(container_id=cid), timeout=120)

    def stop(self, cid: str, timeout: int = 0) -> None:
        self.runtime.StopContainer(self.pb.StopContainerRequest(container_id=cid, timeout=timeout), timeout=120)

    def remove(self, cid: str) -> None:
        self.runtime.RemoveContainer(self.pb.RemoveContainerRequest(container_id=cid), timeout=120)

    def stop_pod(self, sandbox_id: str) -> None:
        self.runtime.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=120)

    def remove_pod(self, sandbox_id: str) -> None:
        self.runtime.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=120)

    def status(self, cid: str) -> tuple[Any, dict[str, Any]]:
        """The container's status and containerd's verbose info (``runtimeSpec``, ``pid``)."""
        res = self.runtime.ContainerStatus(self.pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=60)
        return res.status, json.loads(res.info.get("info", "{}"))

    def sandbox_info(self, sandbox_id: str) -> dict[str, Any]:
        """containerd's verbose info on the pod's sandbox (pause) container: ``runtimeSpec``, ``pid``."""
        req = self.pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True)
        info: dict[str, Any] = json.loads(self.runtime.PodSandboxStatus(req, timeout=60).info["info"])
        return info

    def wait_exited(self, cid: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            status, _ = self.status(cid)
            if status.state == EXITED or time.monotonic() > deadline:
                return status
            time.sleep(0.1)

    def pods(self) -> list[str]:
        return [p.id for p in self.runtime.ListPodSandbox(self.pb.ListPodSandboxRequest(), timeout=60).items]

    def run_all(self, pod: Pod) -> tuple[str, list[str]]:
        """RunPodSandbox, then create and start every container, as kubelet's SyncPod does."""
        sandbox = self.run_pod(pod)
        ids = []
        for c in pod.containers:
            cid = self.create(sandbox, pod, c)
            self.start(cid)
            ids.append(cid)
        return sandbox, ids

    def teardown(self) -> None:
        """Stop and remove every pod this containerd holds (failures ignored: cleanup)."""
        for sandbox in self.pods():
            for call in (self.stop_pod, self.remove_pod):
                try:
                    call(sandbox)
                except Exception:  # best-effort cleanup: the pod may be gone already
                    pass


def remove_pod_cgroups(pods: list[Pod], cgroup_root: Path = Path("/sys/fs/cgroup")) -> None:
    """rmdir the (empty) pod cgroups runc left under ``kubepods`` for ``pods``, then the QoS
    levels and ``kubepods`` itself where nothing else is left in them (cgroupfs driver)."""
    levels = [("kubepods", "burstable"), ("kubepods", "besteffort"), ("kubepods",)]
    for hierarchy in sorted(p for p in cgroup_root.iterdir() if (p / "kubepods").is_dir()):
        targets = [hierarchy.joinpath(*level, f"pod{pod.uid}") for pod in pods for level in levels]
        for path in targets + [hierarchy.joinpath(*level) for level in levels]:
            try:
                path.rmdir()
            except OSError:  # not there, or still in use: left alone
                pass
