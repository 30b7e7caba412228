"""What runs inside the NRI guest (Debian 13 with containerd 1.7, or sid with containerd 2.x; NRI
on): kubelet's CRI calls against the node's own containerd, with numa-pin as its NRI plugin
(``numa-pin-nri.service``).

Run by the scenario unit with ``/usr/bin/python3`` (Debian's python3-grpcio and protobuf);
``tests/e2e/cri.py`` and cri-api's ``api.proto`` sit beside it. It asserts nothing: it writes
what it saw to ``$NP_OUT/facts.json`` (each step's CPUs from ``/proc/<pid>/status``, the ledger's
grants, the errors the CRI returned, the plugin's registrations) and the journals of the plugin
and containerd; tests/vm/test_vm_nri.py judges them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cri  # noqa: E402  (beside this file in the guest)

OUT = Path(os.environ.get("NP_OUT", "/tmp/np-out"))
SOCK = "/run/containerd/containerd.sock"
IMAGE = "numa-pin.test/busybox:1"
MI = 1 << 20
#: containerd with NRI on (the one switch), the sandbox image from this guest, and a longer NRI
#: request timeout: under TCG everything runs 20-50 times slower than on hardware (one
#: ``systemctl show`` took over 10 s in CI), so the plugin's deadline is 40 s, not 20 s
CONTAINERD_TOML = f"""version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  plugin_request_timeout = "60s"
"""
#: the same for containerd 2.x: configuration version 3, where the CRI plugin is split in two and
#: the sandbox image is a pinned image (2.x also reads version 2, converting it; users write this)
CONTAINERD2_TOML = f"""version = 3
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{IMAGE}"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  plugin_request_timeout = "60s"
"""
facts: dict[str, object] = {}


def log(text: str) -> None:
    with open(OUT / "driver.log", "a") as out:
        out.write(f"{time.strftime('%H:%M:%S')} {text}\n")


def sh(*argv: str, check: bool = True, timeout: float = 300) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    log(f"$ {' '.join(argv)} -> {done.returncode}\n{done.stdout}{done.stderr}")
    if check and done.returncode:
        raise RuntimeError(f"{argv} failed: {done.stderr}")
    return done.stdout


def cpus_of(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            out: list[int] = []
            for part in line.split(":", 1)[1].strip().split(","):
                lo, _, hi = part.partition("-")
                out += range(int(lo), int(hi or lo) + 1)
            return out
    return []


def grants() -> dict[str, dict[str, object]]:
    from numa_pin.config.load import load_config
    from numa_pin.ledger.store import Ledger

    state = Ledger(load_config(None, {}).state_dir).read()
    return {cid: {"kind": g.kind, "cpus": sorted(g.cpus), "mems": sorted(g.mems), "pod": g.pod_id, "scope": g.scope,
                  "devices": {r: list(ids) for r, ids in g.devices.items()}}
            for cid, g in state.grants.items()}


def bind_vfio(resources: Path) -> dict[str, object]:
    """Bind the PCI function qemu gave this guest (tests/vm/sysimage.py's ``DEVICE``, named in
    ``resources`` with the device resources to configure) to vfio-pci; what the kernel says of it."""
    want = json.loads(resources.read_text())
    sh("modprobe", "vfio-pci")
    for dev in sorted(Path("/sys/bus/pci/devices").iterdir()):
        if [(dev / f).read_text().strip() for f in ("vendor", "device")] == want["ids"]:
            (dev / "driver_override").write_text("vfio-pci")
            Path("/sys/bus/pci/drivers_probe").write_text(dev.name)
            group = os.readlink(dev / "iommu_group").rsplit("/", 1)[1]
            node = int((dev / "numa_node").read_text())
            return {"address": dev.name, "driver": os.readlink(dev / "driver").rsplit("/", 1)[1], "group": group,
                    "numa_node": node, "dev": Path(f"/sys/class/vfio/{group}/dev").read_text().strip(),
                    "node_cpus": Path(f"/sys/devices/system/node/node{node}/cpulist").read_text().strip(),
                    "container_dev": Path("/sys/class/misc/vfio/dev").read_text().strip()}
    raise RuntimeError(f"no PCI function {want['ids']}")


def container_devices(pid: int) -> dict[str, object]:
    """The container's ``/dev/vfio`` (each node's major:minor) and its ``PCIDEVICE_*`` variables."""
    vfio = Path(f"/proc/{pid}/root/dev/vfio")
    nodes = {p.name: f"{os.major(p.stat().st_rdev)}:{os.minor(p.stat().st_rdev)}"
             for p in (sorted(vfio.iterdir()) if vfio.is_dir() else [])}
    env = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v)
    return {"vfio": nodes, "env": {k: v for k, v in env.items() if k.startswith("PCIDEVICE_")}}


def registrations() -> int:
    text = sh("journalctl", "-u", "numa-pin-nri.service", "-o", "cat", "--no-pager", check=False)
    return text.count("registered as 50-numa-pin")


def wait_registered(before: int, timeout: float = 240) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if registrations() > before:
            time.sleep(3)  # Configure and Synchronize follow the registration
            return True
        time.sleep(1)
    return False


def restart_containerd() -> None:
    """Restart containerd and wait until it answers (under TCG on a busy host it takes a while)."""
    sh("systemctl", "restart", "containerd")
    deadline = time.monotonic() + 300
    while subprocess.run(["ctr", "--timeout", "10s", "version"], capture_output=True, timeout=60).returncode:
        if time.monotonic() > deadline:
            raise RuntimeError("containerd does not answer after its restart")
        time.sleep(2)


def rootfs(root: Path) -> Path:
    (root / "bin").mkdir(parents=True, exist_ok=True)
    for d in ("proc", "sys", "dev", "tmp", "etc"):
        (root / d).mkdir(exist_ok=True)
    sh("cp", "/bin/busybox", str(root / "bin" / "busybox"))
    for applet in ("sh", "sleep", "cat", "grep"):
        (root / "bin" / applet).symlink_to("busybox")
    return root


class Node:
    def __init__(self) -> None:
        self.kubelet = self.connect()
        self.pids: dict[str, int] = {}

    def connect(self) -> cri.Kubelet:
        kubelet = cri.Kubelet(SOCK, Path("/var/tmp/cri-build"), Path("/var/tmp/cri-logs"), driver="systemd")
        kubelet.image = IMAGE
        kubelet.wait_ready(timeout=180)
        self.kubelet = kubelet
        return kubelet

    def run(self, pod: cri.Pod) -> tuple[str, str]:
        sandbox, (cid,) = self.kubelet.run_all(pod)
        self.pids[pod.name] = int(self.kubelet.status(cid)[1]["pid"])
        return sandbox, cid

    def seen(self, name: str) -> list[int]:
        return cpus_of(self.pids[name])


def guaranteed(name: str, cpus: int) -> cri.Pod:
    return cri.Pod(name, [cri.Container("c", {"cpu": cpus * 1000, "memory": 64 * MI},
                                        {"cpu": cpus * 1000, "memory": 64 * MI})])


def step(name: str, fn) -> None:
    log(f"== {name}")
    began = time.monotonic()
    try:
        facts[name] = fn()
    except Exception:
        facts[name] = {"traceback": traceback.format_exc()[-2000:]}
        log(traceback.format_exc())
    facts.setdefault("took_s", {})[name] = round(time.monotonic() - began, 1)
    (OUT / "facts.json").write_text(json.dumps(facts, indent=1, default=str))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    # TCG: a hook may hold the ledger for as long as its admission's 40 s, so another waits as long
    resources = HERE / "devices.json"
    devices = json.loads(resources.read_text())["devices"] if resources.exists() else {}
    Path("/etc/numa-pin/config.yaml").write_text("policy: restricted\nscope: container\nsyslog: true\n"
                                                 "admission_timeout_s: 40\nlock_timeout_s: 40\n"
                                                 f"devices: {json.dumps(devices)}\n")
    if devices:
        step("vfio", lambda: bind_vfio(resources))
    facts["containerd"] = sh("containerd", "--version").strip()
    major = re.search(r" v?(\d+)\.\d+\.", facts["containerd"])
    two = major is not None and int(major.group(1)) >= 2
    Path("/etc/containerd/config.toml").write_text(CONTAINERD2_TOML if two else CONTAINERD_TOML)
    facts["nodes"] = [Path(p).read_text().strip() for p in sorted(Path("/sys/devices/system/node").glob("node*/cpulist"))]
    restart_containerd()
    tar = cri.image_archive(rootfs(Path("/var/tmp/rootfs")), Path("/var/tmp/image.tar"), IMAGE, ["sleep", "100000"])
    sh("ctr", "--timeout", "120s", "-n", "k8s.io", "images", "import", str(tar))
    # containerd 1.7 does not announce its request timeout: tell the plugin the one set above
    dropin = Path("/etc/systemd/system/numa-pin-nri.service.d")
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "timeout.conf").write_text("[Service]\nExecStart=\n"
                                         "ExecStart=/usr/bin/numa-pin serve --nri --nri-request-timeout 60\n")
    sh("systemctl", "daemon-reload")
    sh("systemctl", "start", "numa-pin-nri.service")
    facts["registered_at_start"] = wait_registered(0)
    node = Node()
    pods: dict[str, tuple[str, str]] = {}

    def first_pods() -> dict[str, object]:
        pods["g"] = node.run(guaranteed("g", 1))
        pods["bu"] = node.run(cri.Pod("bu", [cri.Container("c", {"cpu": 100}, {"cpu": 500})]))
        pods["be"] = node.run(cri.Pod("be", [cri.Container("c")]))
        return {"seen": {n: node.seen(n) for n in ("g", "bu", "be")}, "ids": {n: pods[n][1] for n in pods},
                "grants": grants()}

    step("pods", first_pods)

    def refusal() -> dict[str, object]:
        pod = guaranteed("big", 3)  # more CPUs than a NUMA node of this guest has
        sandbox = node.kubelet.run_pod(pod)
        try:
            node.kubelet.create(sandbox, pod, pod.containers[0])
            return {"created": True}
        except Exception as exc:  # grpc.RpcError: what kubelet puts in the pod's event
            details = exc.details() if hasattr(exc, "details") else str(exc)
            return {"created": False, "error": details, "grants": grants()}
        finally:
            node.kubelet.stop_pod(sandbox)
            node.kubelet.remove_pod(sandbox)

    step("refusal", refusal)

    def containerd_restart() -> dict[str, object]:
        before = registrations()
        restart_containerd()
        node.connect()
        back = wait_registered(before)
        return {"reregistered": back, "seen": {n: node.seen(n) for n in ("g", "bu", "be")}, "grants": grants()}

    step("containerd_restart", containerd_restart)

    def plugin_restart() -> dict[str, object]:
        before = registrations()
        sh("systemctl", "restart", "numa-pin-nri.service")
        back = wait_registered(before)
        return {"reregistered": back, "seen": {n: node.seen(n) for n in ("g", "bu", "be")}, "grants": grants()}

    step("plugin_restart", plugin_restart)

    def plugin_down() -> dict[str, object]:
        sh("systemctl", "stop", "numa-pin-nri.service")
        pods["late"] = node.run(guaranteed("late", 1))
        while_down = {"late": node.seen("late"), "grants": grants()}
        before = registrations()
        sh("systemctl", "start", "numa-pin-nri.service")
        back = wait_registered(before)
        time.sleep(5)
        return {"while_down": while_down, "reregistered": back, "id": pods["late"][1],
                "seen": {n: node.seen(n) for n in ("g", "bu", "be", "late")}, "grants": grants()}

    step("plugin_down", plugin_down)

    def release() -> dict[str, object]:
        sandbox, cid = pods.pop("g")
        node.kubelet.stop(cid)
        node.kubelet.remove(cid)
        node.kubelet.stop_pod(sandbox)
        node.kubelet.remove_pod(sandbox)
        time.sleep(3)
        return {"seen": {n: node.seen(n) for n in ("bu", "be", "late")}, "grants": grants()}

    step("release", release)

    def pod_scope() -> dict[str, object]:
        """The pod's annotations reach numa-pin with no pod_annotations passthrough in containerd."""
        pod = cri.Pod("scoped", [cri.Container("app"), cri.Container("sidecar")],
                      annotations={"numa-pin.io/scope": "pod", "numa-pin.io/cpus.app": "1"})
        sandbox, (app, sidecar) = node.kubelet.run_all(pod)
        pids = {n: int(node.kubelet.status(c)[1]["pid"]) for n, c in (("app", app), ("sidecar", sidecar))}
        return {"sandbox": sandbox, "ids": {"app": app, "sidecar": sidecar},
                "seen": {n: cpus_of(pid) for n, pid in pids.items()}, "grants": grants()}

    step("pod_scope", pod_scope)

    def parallel_pods() -> dict[str, object]:
        """kubelet's pod workers run in parallel: a BestEffort container created before a
        Guaranteed pod takes its CPU and started after it, then a burst of pods started at
        once. Every container's allowed CPUs are sampled while they run."""
        kubelet = node.kubelet
        listed = kubelet.runtime.ListPodSandbox(kubelet.pb.ListPodSandboxRequest(), timeout=60).items
        for item in listed:  # room for one more exclusive CPU on this small guest
            if item.metadata.name in ("scoped", "late"):
                kubelet.stop_pod(item.id)
                kubelet.remove_pod(item.id)
        time.sleep(3)
        early = cri.Pod("early", [cri.Container("c")])
        sandbox = node.kubelet.run_pod(early)
        early_id = node.kubelet.create(sandbox, early, early.containers[0])  # created, not started
        pods["pg"] = node.run(guaranteed("pg", 1))
        node.kubelet.start(early_id)
        node.pids["early"] = int(node.kubelet.status(early_id)[1]["pid"])
        burst = [cri.Pod(f"burst{i}", [cri.Container("c")]) for i in range(3)]
        threads = [threading.Thread(target=lambda p=p: pods.__setitem__(p.name, node.run(p))) for p in burst]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        names = ["early", "bu", "be", *(p.name for p in burst)]
        samples = []
        for _ in range(10):
            samples.append({n: node.seen(n) for n in names})
            time.sleep(0.5)
        return {"exclusive": node.seen("pg"), "samples": samples, "grants": grants(), "id": pods["pg"][1]}

    step("parallel_pods", parallel_pods)

    def matrix() -> dict[str, object]:
        """The every-path table (tests/nri/test_every_path.py's rows, handed over as matrix.json):
        each row a pod of its own on an emptied node, its annotations on the pod."""
        kubelet = node.kubelet
        for item in kubelet.runtime.ListPodSandbox(kubelet.pb.ListPodSandboxRequest(), timeout=60).items:
            kubelet.stop_pod(item.id)
            kubelet.remove_pod(item.id)
        time.sleep(3)
        out: dict[str, object] = {"grants_before": grants()}
        for row in json.loads((Path(__file__).parent / "matrix.json").read_text()):
            pod = cri.Pod(f"m-{row['id']}", [cri.Container("c")], annotations=row["annotations"])
            sandbox = kubelet.run_pod(pod)
            try:
                cid = kubelet.create(sandbox, pod, pod.containers[0])
                kubelet.start(cid)
                pid = int(kubelet.status(cid)[1]["pid"])
                grant = grants().get(cid)
                out[row["id"]] = {"admitted": True, "seen": cpus_of(pid), "grant": grant,
                                  "host": host_facts(pid, grant["cpus"] if grant else []),
                                  "devices": container_devices(pid)}
            except Exception as exc:  # grpc.RpcError: the refusal kubelet would show
                out[row["id"]] = {"admitted": False, "error": exc.details() if hasattr(exc, "details") else str(exc)}
            finally:
                kubelet.stop_pod(sandbox)
                kubelet.remove_pod(sandbox)
            time.sleep(1)
        out["grants_after"] = grants()
        return out

    def host_facts(pid: int, cpus: list[int]) -> dict[str, object]:
        """What the isolation knobs write, read while the container runs: its cgroup's ``cpu.max``
        and partition, its CPUs' PM QoS latency, the affinity new IRQs get."""
        cgroup = Path("/sys/fs/cgroup", Path(f"/proc/{pid}/cgroup").read_text().strip().split("::", 1)[1].lstrip("/"))

        def read(path: Path) -> str | None:
            return path.read_text().strip() if path.exists() else None

        return {"cpu.max": read(cgroup / "cpu.max"), "partition": read(cgroup / "cpuset.cpus.partition"),
                "pm_qos": {c: read(Path(f"/sys/devices/system/cpu/cpu{c}/power/pm_qos_resume_latency_us"))
                           for c in cpus},
                "irq_default": read(Path("/proc/irq/default_smp_affinity"))}

    step("matrix", matrix)

    def chain(pid: int) -> dict[str, str]:
        """``cpuset.cpus.partition`` of every cgroup from the process's up to the root's child."""
        rel = Path("/proc", str(pid), "cgroup").read_text().strip().split("::", 1)[1]
        out: dict[str, str] = {}
        parts = [p for p in rel.split("/") if p]
        for depth in range(len(parts), 0, -1):
            path = Path("/sys/fs/cgroup", *parts[:depth], "cpuset.cpus.partition")
            if path.exists():
                out["/" + "/".join(parts[:depth])] = path.read_text().strip()
        return out

    def partition_nri() -> dict[str, object]:
        """An isolated partition nested in the pod's cgroup (NRI):
        ``cpu-load-balancing.crio.io: disable`` on a kernel with ``cpuset.cpus.exclusive``."""
        kubelet = node.kubelet
        pod = guaranteed("iso", 1)
        pod.annotations["cpu-load-balancing.crio.io"] = "disable"
        sandbox, (cid,) = kubelet.run_all(pod)
        pid = int(kubelet.status(cid)[1]["pid"])
        out: dict[str, object] = {"kernel": os.uname().release, "seen": cpus_of(pid), "chain": chain(pid),
                                  "grant": grants().get(cid)}
        kubelet.stop_pod(sandbox)
        kubelet.remove_pod(sandbox)
        time.sleep(2)
        out["after"] = grants()
        return out

    step("partition_nri", partition_nri)

    def partition_podman() -> dict[str, object]:
        """The same through podman's precreate hook, its container nested in podman's cgroup."""
        name = "iso-podman"
        sh("podman", "run", "-d", "--name", name, "--network", "none", "--annotation", "numa-pin.io/cpus=1",
           "--annotation", "cpu-load-balancing.crio.io=disable", "--rootfs", "/var/tmp/rootfs", "sleep", "100000",
           timeout=300)
        pid = int(sh("podman", "inspect", "-f", "{{.State.Pid}}", name).strip())
        podman_id = sh("podman", "inspect", "-f", "{{.Id}}", name).strip()
        out: dict[str, object] = {"kernel": os.uname().release, "seen": cpus_of(pid), "chain": chain(pid),
                                  "grant": grants().get(podman_id)}
        sh("podman", "rm", "-f", "-t", "0", name, timeout=300)
        time.sleep(2)
        out["after"] = grants()
        return out

    step("partition_podman", partition_podman)

    def exec_affinity() -> dict[str, object]:
        """podman with runc and ``numa-pin.io/exec-cpu-affinity: first`` on two exclusive CPUs:
        where the container runs, and where a process ``podman exec`` starts in it runs."""
        name = "exec-aff"
        sh("podman", "--runtime", "runc", "run", "-d", "--name", name, "--network", "none", "--annotation",
           "numa-pin.io/cpus=2", "--annotation", "numa-pin.io/exec-cpu-affinity=first", "--rootfs",
           "/var/tmp/rootfs", "sleep", "100000", timeout=300)
        pid = int(sh("podman", "inspect", "-f", "{{.State.Pid}}", name).strip())
        podman_id = sh("podman", "inspect", "-f", "{{.Id}}", name).strip()
        status = sh("podman", "exec", name, "cat", "/proc/self/status")
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
        out: dict[str, object] = {"runc": sh("runc", "--version").splitlines()[0], "seen": cpus_of(pid),
                                  "exec": line.split(":", 1)[1].strip(), "grant": grants().get(podman_id)}
        sh("podman", "rm", "-f", "-t", "0", name, timeout=300)
        return out

    step("exec_affinity", exec_affinity)
    archive = HERE / "numa-pin-image.tar"
    if archive.exists():  # the DaemonSet's pod in place of the packaged plugin, then the packaged one again
        import daemonset_guest

        def daemonset() -> dict[str, object]:
            try:
                return daemonset_guest.run(node.kubelet, cri, HERE / "numa-pin.yaml", archive, sh, grants, cpus_of,
                                           guaranteed)
            finally:
                sh("systemctl", "start", "numa-pin-nri.service", check=False)

        step("daemonset", daemonset)
    (OUT / "plugin.log").write_text(sh("journalctl", "-u", "numa-pin-nri.service", "-o", "cat", "--no-pager",
                                       check=False))
    (OUT / "containerd.log").write_text(sh("journalctl", "-u", "containerd.service", "-o", "cat", "--no-pager",
                                           check=False)[-200000:])
    (OUT / "system.log").write_text(sh("journalctl", "-b", "-o", "short-monotonic", "--no-pager",
                                       check=False)[-400000:])


if __name__ == "__main__":
    try:
        main()
    finally:
        (OUT / "facts.json").write_text(json.dumps(facts, indent=1, default=str))
