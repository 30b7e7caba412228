"""The DaemonSet's pod as the node's NRI plugin, inside the Debian 13 NRI guest.

What kubelet does for ``deploy/kubernetes/numa-pin.yaml``'s DaemonSet on this node, through the
same CRI calls to the node's containerd: the image (``packaging/image/build-image.sh
--archive``, built on the host) imported into the ``k8s.io`` namespace; the pod sandbox with the
host's network and pid namespaces; the ConfigMap written where kubelet projects it and mounted
read-only; every hostPath volume mounted where the pod spec says (a ``DirectoryOrCreate`` one
made first); the container's command, args and environment (``NODE_NAME`` from the node's name,
as the downward API gives it), its capabilities, ``no_new_privs``, user, seccomp and AppArmor
profiles. Two values are the guest's, as a user sets them for a slow node: under TCG everything
runs 20-50 times slower than on hardware, so ``--nri-request-timeout`` is the guest containerd's
60 s (not 2) and the ConfigMap's config gets ``admission_timeout_s: 40`` and ``lock_timeout_s:
40``. There is no API server: the publisher logs why and retries, and admissions go on.

Run by ``nri_guest.py`` (the packaged plugin is stopped first and started again after).
It asserts nothing: :func:`run` returns what it saw.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

CONFIGMAP_DIR = Path("/var/lib/np-daemonset/configmap")
TIMEOUTS = {"--nri-request-timeout": "60"}
CONFIG_EXTRA = "admission_timeout_s: 40\nlock_timeout_s: 40\n"


def objects(manifest: Path) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(manifest.read_text()) if d}


def _args(args: list[str]) -> list[str]:
    out = list(args)
    for flag, value in TIMEOUTS.items():
        if flag in out:
            out[out.index(flag) + 1] = value
    return out


def _env(pb: Any, container: dict[str, Any]) -> list[Any]:
    out = []
    for item in container.get("env", []):
        value = item.get("value")
        if value is None and item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            value = socket.gethostname()
        out.append(pb.KeyValue(key=item["name"], value=str(value).encode()))
    return out


def _mounts(pb: Any, pod: dict[str, Any], container: dict[str, Any], configmap: dict[str, Any]) -> list[Any]:
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = []
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            CONFIGMAP_DIR.mkdir(parents=True, exist_ok=True)
            for name, text in configmap["data"].items():
                (CONFIGMAP_DIR / name).write_text(text + (CONFIG_EXTRA if name == "config.yaml" else ""))
            host = str(CONFIGMAP_DIR)
        else:
            host = volume["hostPath"]["path"]
            if volume["hostPath"].get("type") == "DirectoryOrCreate":
                os.makedirs(host, exist_ok=True)
        out.append(pb.Mount(container_path=mount["mountPath"], host_path=host,
                            readonly=bool(mount.get("readOnly", False))))
    return out


def _security(pb: Any, cri: Any, spec: dict[str, Any]) -> Any:
    caps = spec.get("capabilities", {})
    profile = pb.SecurityProfile.ProfileType
    return pb.LinuxContainerSecurityContext(
        capabilities=pb.Capability(add_capabilities=caps.get("add", []), drop_capabilities=caps.get("drop", [])),
        privileged=bool(spec.get("privileged", False)),
        namespace_options=pb.NamespaceOption(network=cri.NODE, pid=cri.NODE, ipc=cri.POD_NS),
        run_as_user=pb.Int64Value(value=int(spec.get("runAsUser", 0))),
        no_new_privs=not spec.get("allowPrivilegeEscalation", True),
        seccomp=pb.SecurityProfile(profile_type=profile.Value(spec["seccompProfile"]["type"])),
        apparmor=pb.SecurityProfile(profile_type=profile.Value(spec["appArmorProfile"]["type"])),
    )


def start_pod(kubelet: Any, cri: Any, manifest: Path, image: str) -> tuple[str, str, Path]:
    """Run the DaemonSet's pod; returns (sandbox id, container id, the container's log)."""
    pb, found = kubelet.pb, objects(manifest)
    pod_spec = found["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    pod = cri.Pod("numa-pin-ds", [cri.Container(container["name"], {"cpu": 50, "memory": 64 << 20},
                                                {"memory": 256 << 20})], namespace="numa-pin")
    sandbox_config = kubelet.sandbox_config(pod)
    sandbox_config.linux.security_context.namespace_options.CopyFrom(
        pb.NamespaceOption(network=cri.NODE, pid=cri.NODE, ipc=cri.POD_NS))
    sandbox = kubelet.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=sandbox_config), timeout=300).pod_sandbox_id
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=container["name"]),
        image=pb.ImageSpec(image=image),
        command=container["command"], args=_args(container["args"]), envs=_env(pb, container),
        mounts=_mounts(pb, pod_spec, container, found["ConfigMap"]),
        labels={"io.kubernetes.container.name": container["name"], "io.kubernetes.pod.name": pod.name,
                "io.kubernetes.pod.namespace": pod.namespace, "io.kubernetes.pod.uid": pod.uid},
        log_path=f"{container['name']}/0.log",
        linux=pb.LinuxContainerConfig(resources=kubelet.resources(pod, pod.containers[0]),
                                      security_context=_security(pb, cri, container["securityContext"])),
    )
    cid = kubelet.runtime.CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=sandbox, config=config, sandbox_config=sandbox_config), timeout=300).container_id
    kubelet.start(cid)
    return sandbox, cid, Path(sandbox_config.log_directory) / config.log_path


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1)
    return False


def run(kubelet: Any, cri: Any, manifest: Path, archive: Path, sh: Callable[..., str],
        grants: Callable[[], dict[str, Any]], cpus_of: Callable[[int], list[int]],
        guaranteed: Callable[[str, int], Any]) -> dict[str, object]:
    """Import the image, run the DaemonSet's pod in place of the packaged plugin, admit and
    release a Guaranteed pod through it, and stop it (the caller starts the packaged one again)."""
    sh("ctr", "--timeout", "600s", "-n", "k8s.io", "images", "import", str(archive), timeout=900)
    image = objects(manifest)["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["image"]
    out: dict[str, object] = {"images": sh("ctr", "-n", "k8s.io", "images", "ls", "-q").split()}
    sh("systemctl", "stop", "numa-pin-nri.service")
    sandbox, cid, log = start_pod(kubelet, cri, manifest, image)
    out["registered"] = wait_for(lambda: "registered as" in read(log), 600)
    out["plugin_pid"] = int(kubelet.status(cid)[1]["pid"])
    pod = guaranteed("via-ds", 2)
    g_sandbox, (g_cid,) = kubelet.run_all(pod)
    out["seen"] = cpus_of(int(kubelet.status(g_cid)[1]["pid"]))
    out["grant"] = grants().get(g_cid)
    kubelet.stop_pod(g_sandbox)
    kubelet.remove_pod(g_sandbox)
    out["released"] = wait_for(lambda: g_cid not in grants(), 120)
    out["log"] = read(log)[-6000:]
    kubelet.stop_pod(sandbox)
    kubelet.remove_pod(sandbox)
    return out
