"""numa-pin under Kubernetes: containerd's CRI plugin driven with the requests kubelet builds.

A private containerd (its own config, root, state and socket) runs the shipped snippet
(``packaging/containerd/config.toml``: the base spec and the ``pod_annotations`` passthrough)
with a base spec made by the shipped ``numa-pin-containerd-spec`` from ``ctr oci spec``, plus a
second runtime handler without a base spec, which is what containerd does on its own. Images are
built here (a busybox rootfs in a docker-archive tar, ``ctr images import``); pods use the host
network (no CNI). The CRI client is compiled from cri-api's ``api.proto`` (:mod:`.cri`) and makes
kubelet's calls: RunPodSandbox with kubelet's labels, annotations and ``/kubepods/...`` cgroup
parents, CreateContainer with the resources of cpuManagerPolicy ``none``, start, stop, remove,
restarts with ``attempt + 1``.

Oracles: kubelet's QoS class of each pod definition (:class:`.cri.Pod`) and its static CPU
manager's rule (integer CPUs of Guaranteed pods only), the kernel's view of each container
(``Cpus_allowed_list`` of its pid), the raw ledger, and containerd's own spec of a container
created without numa-pin's base spec.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import cri, harness

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SPEC_TOOL = REPO / "packaging" / "containerd" / "numa-pin-containerd-spec"
SNIPPET = REPO / "packaging" / "containerd" / "config.toml"
IMAGE = "numa-pin.test/busybox:1"
PLAIN = "plain"  # the runtime handler without a base spec
GI = 1 << 30
WAIT_S = 60.0


class CriNode:
    """A private containerd with the CRI plugin, numa-pin's config and ledger, and a kubelet."""

    def __init__(self, base: Path, daemon: str, ctr: str) -> None:
        self.base, self.daemon, self.ctr = base, daemon, ctr
        self.address = str(base / "c.sock")
        self.config = base / "numa-pin.yaml"
        self.ledger = base / "ledger"
        self.proc: subprocess.Popen[bytes] | None = None
        self.kubelet: cri.Kubelet | None = None
        self.earlier_pods: list[cri.Pod] = []  # pods of the kubelets of earlier containerd runs

    def write_config(self, hook: Path) -> None:
        self.config.write_text(f"policy: restricted\nstate_dir: {self.ledger}\nsyslog: false\n")
        made = subprocess.run(f"{self.ctr} oci spec | {SPEC_TOOL} --hook {hook} --config {self.config}",
                              shell=True, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        spec = json.loads(made.stdout)
        for entries in spec["hooks"].values():  # a private config cache for this node
            for entry in entries:
                entry["env"] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"NUMA_PIN_CACHE_DIR={self.base / 'cache'}"]
        base_spec = self.base / "numa-pin-base-spec.json"
        base_spec.write_text(json.dumps(spec, indent=1))
        snippet = SNIPPET.read_text()
        body = "\n".join(line for line in snippet.splitlines() if not line.startswith(("#", "version")))
        assert "/etc/containerd/numa-pin-base-spec.json" in body
        cri_table = 'plugins."io.containerd.grpc.v1.cri"'
        (self.base / "config.toml").write_text(
            f'version = 2\nroot = "{self.base / "root"}"\nstate = "{self.base / "state"}"\n'
            f'[grpc]\n  address = "{self.address}"\n[ttrpc]\n  address = "{self.address}.ttrpc"\n'
            f'[{cri_table}]\n  sandbox_image = "{IMAGE}"\n  stream_server_port = "0"\n'
            # without CAP_SYS_RESOURCE (a container as this host) no oom_score_adj below our own
            "  restrict_oom_score_adj = true\n"
            f'[{cri_table}.cni]\n  conf_dir = "{self.base / "cni"}"\n  bin_dir = "{self.base / "cni"}"\n'
            f'[{cri_table}.containerd.runtimes.{PLAIN}]\n  runtime_type = "io.containerd.runc.v2"\n'
            + body.replace("/etc/containerd/numa-pin-base-spec.json", str(base_spec)) + "\n"
        )

    def start(self) -> None:
        log = open(self.base / "containerd.log", "ab")
        self.proc = subprocess.Popen([self.daemon, "--config", str(self.base / "config.toml")], stdout=log,
                                     stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + WAIT_S
        while not os.path.exists(self.address):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"containerd did not start: {self.log_tail()}")
            time.sleep(0.1)
        self.kubelet = cri.Kubelet(self.address, self.base.parent / "cri-build", self.base / "logs")
        self.kubelet.image = IMAGE
        self.kubelet.wait_ready()

    def stop(self) -> None:
        if self.kubelet is not None:
            self.earlier_pods += self.kubelet.pods_run
            self.kubelet.close()
            self.kubelet = None
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def log_tail(self) -> str:
        return (self.base / "containerd.log").read_text(errors="replace")[-3000:]

    def grants(self) -> dict:
        from numa_pin.ledger.store import Ledger

        return dict(Ledger(str(self.ledger)).read().grants)

    def wait_for(self, what, timeout: float = WAIT_S):
        deadline = time.monotonic() + timeout
        while True:
            value = what()
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        exe = harness.numa_pin_hook_path().with_name("numa-pin")  # type: ignore[union-attr]
        return subprocess.run([str(exe), *args, "--config", str(self.config)], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "NUMA_PIN_CACHE_DIR": str(self.base / "cache")})


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CriNode]:
    ctr, daemon, hook = harness.find_binary("ctr"), harness.find_binary("containerd"), harness.numa_pin_hook_path()
    if ctr is None or daemon is None:
        pytest.skip("containerd is not installed (apt-get install containerd)")
    if hook is None:
        pytest.skip("numa-pin-hook is not installed")
    if not harness.BUSYBOX.is_file():
        pytest.skip(f"{harness.BUSYBOX} missing: install busybox-static")
    pytest.importorskip("grpc_tools", reason="grpcio-tools compiles the CRI client (test extras)")
    # short paths: the shim's socket path must stay under the Unix socket limit
    base = harness.DEFAULT_STATE_DIR / f"cri-{uuid.uuid4().hex[:8]}"
    base.mkdir(parents=True)
    own = CriNode(base, daemon, ctr)
    try:
        own.write_config(hook)
        scratch = tmp_path_factory.mktemp("cri-image")
        tar = cri.image_archive(harness.make_rootfs(scratch / "rootfs"), scratch / "image.tar", IMAGE,
                                ["sleep", "100000"])
        own.start()
        imported = subprocess.run([ctr, "--address", own.address, "--namespace", "k8s.io", "images", "import",
                                   str(tar)], capture_output=True, text=True, timeout=120)
        assert imported.returncode == 0, imported.stderr
        yield own
    finally:
        pods: list[cri.Pod] = []
        if own.kubelet is not None:
            own.kubelet.teardown()
            pods = own.kubelet.pods_run
        own.stop()
        cri.remove_pod_cgroups(pods + own.earlier_pods)
        subprocess.run(["umount", "-R", str(base / "state")], capture_output=True, timeout=60)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], capture_output=True, timeout=60)


@pytest.fixture
def kubelet(node: CriNode) -> Iterator[cri.Kubelet]:
    """The node's kubelet; every pod is stopped and removed after the test (grants released)."""
    assert node.kubelet is not None
    node.kubelet.handler = ""
    yield node.kubelet
    assert node.kubelet is not None
    node.kubelet.teardown()
    node.kubelet.handler = ""
    assert node.wait_for(lambda: not node.grants()) is True, node.grants()


def _allowed(k: cri.Kubelet, cid: str) -> str:
    _, info = k.status(cid)
    return harness.proc_allowed(int(info["pid"]))[0]


def _pod(name: str, *containers: cri.Container, **annotations: str) -> cri.Pod:
    return cri.Pod(f"{name}-{uuid.uuid4().hex[:6]}", list(containers), annotations=dict(annotations))


def guaranteed(name: str = "app", cpu: int = 1000, command: tuple[str, ...] = ("sleep", "3600")) -> cri.Container:
    return cri.Container(name, limits={"cpu": cpu, "memory": GI}, command=command)


def test_only_guaranteed_pods_get_exclusive_cpus(node, kubelet):
    """The one exclusive CPU (1; CPU 0 is reserved) goes to the Guaranteed pod; Burstable pods
    whose containers look Guaranteed (a whole CPU limit and a memory limit) and BestEffort pods
    run on the shared pool, as kubelet's static policy would run them."""
    pods = {
        "guaranteed": _pod("g", guaranteed()),
        "burstable": _pod("b", cri.Container("app", {"cpu": 500, "memory": GI}, {"cpu": 1000, "memory": GI})),
        "burstable-memory": _pod("bm", cri.Container("app", {"cpu": 1000, "memory": GI // 2},
                                                     {"cpu": 1000, "memory": GI})),
        "burstable-sidecar": _pod("bs", guaranteed(), cri.Container("sidecar", {"cpu": 100})),
        "besteffort": _pod("be", cri.Container("app")),
    }
    expected = {"guaranteed": "Guaranteed", "burstable": "Burstable", "burstable-memory": "Burstable",
                "burstable-sidecar": "Burstable", "besteffort": "BestEffort"}
    started = {}
    for key, pod in pods.items():
        assert pod.qos == expected[key]
        try:
            started[key] = kubelet.run_all(pod)
        except Exception as exc:  # grpc.RpcError: the hook refused, kubelet would retry forever
            pytest.fail(f"{key}: {exc}")
    grants = node.grants()
    g_sandbox, (g_app,) = started["guaranteed"]
    assert grants[g_app].kind == "exclusive" and grants[g_app].cpus == frozenset({1})
    assert _allowed(kubelet, g_app) == "1"
    for key, (_, ids) in started.items():
        for cid in ids:
            if cid != g_app:
                assert grants[cid].kind == "shared" and not grants[cid].cpus, key
                assert _allowed(kubelet, cid) == "0", key
    # pause containers keep every CPU: numa-pin never sees them (kubelet's CPU manager leaves them too)
    every_cpu = Path("/sys/devices/system/cpu/online").read_text().strip()
    for sandbox, _ in started.values():
        assert sandbox not in grants
        assert harness.proc_allowed(int(kubelet.sandbox_info(sandbox)["pid"]))[0] == every_cpu
    # explain says the pod's class and where it was read
    for key, cid in (("guaranteed", g_app), ("burstable", started["burstable"][1][0])):
        shown = node.cli("explain", cid, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["qos"]["class"] == expected[key]


def test_pod_scope_per_container_annotations_and_pod_names(node, kubelet):
    """Pod annotations reach numa-pin through the shipped snippet's pod_annotations; the
    per-container key asks for one container only, the pod-wide scope groups by sandbox, and
    status names the pod."""
    pod = _pod("scoped", cri.Container("app"), cri.Container("sidecar"),
               **{"numa-pin.io/scope": "pod", "numa-pin.io/cpus.app": "1"})
    sandbox, (app, sidecar) = kubelet.run_all(pod)
    grants = node.grants()
    assert grants[app].cpus == frozenset({1}) and _allowed(kubelet, app) == "1"
    assert grants[sidecar].kind == "shared" and _allowed(kubelet, sidecar) == "0"
    assert {grants[c].pod_id for c in (app, sidecar)} == {sandbox}
    assert {grants[c].scope for c in (app, sidecar)} == {"pod"}
    status = node.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    listed = {g["container_id"]: g for g in json.loads(status.stdout)["grants"]}
    assert (listed[app]["pod"], listed[app]["name"]) == (f"{pod.namespace}/{pod.name}", "app")
    assert (listed[sidecar]["pod"], listed[sidecar]["name"]) == (f"{pod.namespace}/{pod.name}", "sidecar")


def test_refusal_reaches_start_container_as_one_line(node, kubelet):
    holder = _pod("holder", guaranteed())
    kubelet.run_all(holder)
    refused = _pod("refused", guaranteed())
    sandbox = kubelet.run_pod(refused)
    cid = kubelet.create(sandbox, refused, refused.containers[0])
    with pytest.raises(Exception) as err:  # grpc.RpcError
        kubelet.start(cid)
    details = err.value.details()  # type: ignore[attr-defined]
    assert f"numa-pin: rejected {cid}: TopologyAffinityError:" in details, details
    assert "free per node: 0=0" in details and "\n" not in details.split("numa-pin: rejected", 1)[1]
    assert cid not in node.grants()


def test_exit_releases_and_restart_takes_the_cpu_again(node, kubelet):
    """A container's grant goes when it exits (containerd deletes the task at once), before
    kubelet removes it; the restart (attempt 1) is admitted again; StopPodSandbox releases."""
    pod = _pod("exits", guaranteed(command=("sh", "-c", "sleep 1")))
    sandbox, (first,) = kubelet.run_all(pod)
    assert node.grants()[first].cpus == frozenset({1})
    assert kubelet.wait_exited(first).state == cri.EXITED
    assert node.wait_for(lambda: first not in node.grants()), "released at exit, before RemoveContainer"
    kubelet.remove(first)
    pod.containers[0].command = ("sleep", "3600")
    second = kubelet.create(sandbox, pod, pod.containers[0], attempt=1)
    kubelet.start(second)
    assert node.grants()[second].cpus == frozenset({1}) and _allowed(kubelet, second) == "1"
    kubelet.stop_pod(sandbox)
    assert node.wait_for(lambda: second not in node.grants()), "StopPodSandbox released the grant"
    after = _pod("after", guaranteed())
    _, (cid,) = kubelet.run_all(after)
    assert node.grants()[cid].cpus == frozenset({1})


def test_grants_survive_a_containerd_restart(node, kubelet):
    pod = _pod("survivor", guaranteed())
    sandbox, (cid,) = kubelet.run_all(pod)
    pid = node.grants()[cid].pid
    node.stop()
    node.start()
    kubelet = node.kubelet
    assert node.grants()[cid].cpus == frozenset({1}) and node.grants()[cid].pid == pid
    status, _ = kubelet.status(cid)
    assert status.state == cri.RUNNING and _allowed(kubelet, cid) == "1"
    kubelet.stop_pod(sandbox)
    assert node.wait_for(lambda: cid not in node.grants()), "StopPodSandbox after the restart released it"


#: what differs between two pods for their ids alone
def _normalised(spec: dict, pod: cri.Pod, sandbox: str, cid: str) -> dict:
    text = json.dumps(spec, sort_keys=True)
    for value, name in ((cid, "<container>"), (sandbox, "<sandbox>"), (pod.uid, "<uid>"),
                        (pod.uid.replace("-", "_"), "<uid>"), (pod.name, "<pod>")):
        text = text.replace(value, name)
    return json.loads(re.sub(r"/proc/[0-9]+/ns/", "/proc/<sandbox pid>/ns/", text))


def _flat(doc, path: str = "") -> dict[str, object]:
    if isinstance(doc, dict):
        out: dict[str, object] = {}
        for key, value in doc.items():
            out.update(_flat(value, f"{path}.{key}" if path else key))
        return out if doc else {path: {}}
    return {path: doc}


def test_base_spec_changes_nothing_but_the_hooks(node, kubelet):
    """The same container, created by the CRI plugin with numa-pin's base spec and without any
    (containerd's own spec): every field is equal but ``hooks`` (``ctr oci spec`` has
    RLIMIT_NOFILE 1024/1024, which containerd's own spec has not). The pod's sandbox too."""
    specs = []
    for handler in ("", PLAIN):
        kubelet.handler = handler
        pod = _pod("rlimits", cri.Container("app", {"cpu": 250, "memory": GI // 4}, {"memory": GI // 2}))
        sandbox = kubelet.run_pod(pod)
        cid = kubelet.create(sandbox, pod, pod.containers[0])
        _, info = kubelet.status(cid)
        specs.append([_normalised(spec, pod, sandbox, cid)
                      for spec in (info["runtimeSpec"], kubelet.sandbox_info(sandbox)["runtimeSpec"])])
    (app_hooked, sandbox_hooked), (app_plain, sandbox_plain) = specs
    assert set(app_hooked.pop("hooks")) == {"createRuntime", "poststop"} and "hooks" not in app_plain
    # containerd makes the sandbox (pause) container from its own default spec, never the base spec
    assert "hooks" not in sandbox_hooked and "hooks" not in sandbox_plain
    for hooked, plain in ((app_hooked, app_plain), (sandbox_hooked, sandbox_plain)):
        hooked_flat, plain_flat = _flat(hooked), _flat(plain)
        differ = {k: (hooked_flat.get(k), plain_flat.get(k)) for k in hooked_flat.keys() | plain_flat.keys()
                  if hooked_flat.get(k) != plain_flat.get(k)}
        assert differ == {}


def test_parallel_pod_starts_hand_the_cpu_out_once(node, kubelet):
    """Kubelet starts pods in parallel: of four Guaranteed pods racing for the one exclusive CPU
    exactly one gets it, the others are refused, and Burstable pods beside them all start."""
    from concurrent.futures import ThreadPoolExecutor

    racing = [_pod(f"race{i}", guaranteed()) for i in range(4)]
    shared = [_pod(f"shared{i}", cri.Container("app", {"cpu": 500}, {"cpu": 1000, "memory": GI})) for i in range(2)]

    def start(pod: cri.Pod):
        try:
            return kubelet.run_all(pod)
        except Exception as exc:  # grpc.RpcError: refused
            return exc

    with ThreadPoolExecutor(len(racing) + len(shared)) as pool:
        results = list(pool.map(start, racing + shared))
    won = [r for r in results[: len(racing)] if isinstance(r, tuple)]
    lost = [r for r in results[: len(racing)] if not isinstance(r, tuple)]
    assert len(won) == 1 and len(lost) == len(racing) - 1, results
    for exc in lost:
        assert "TopologyAffinityError" in exc.details()  # type: ignore[attr-defined]
    assert all(isinstance(r, tuple) for r in results[len(racing):]), results
    grants = node.grants()
    assert [cid for cid, g in grants.items() if g.cpus] == won[0][1]
    assert grants[won[0][1][0]].cpus == frozenset({1}) and _allowed(kubelet, won[0][1][0]) == "1"
