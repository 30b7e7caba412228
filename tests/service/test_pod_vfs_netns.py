"""The pod VF flow with real network namespaces (root): a dummy link stands in for the VF.

Everything runs in a child process started by ``unshare -n``, so the "host" netns is private
to the test and the dummy can carry the kit's VF name (``ens2f0v1``, what the kit's sysfs names
VF 0000:32:01.1) without touching the machine's own. In it, ``unshare -n sleep`` is the pod's
sandbox (pause) and two ``nsenter --net=... sleep`` processes are its containers; the FakeNode's
``proc/<pid>/ns/net`` link to the real ones, so the service opens real namespaces. ``ip`` in and
out of the pod's netns is the oracle for where the device is.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "unshare", "nsenter")),
                       reason="needs ip, unshare and nsenter (iproute2, util-linux)"),
]

SCRIPT = textwrap.dedent('''
    import json, os, subprocess, sys, time
    from pathlib import Path

    from numa_pin.requests.request import request_from_oci
    from numa_pin.config.schema import config_from_dict
    from numa_pin.service.node import NodeService
    from numa_pin.testing.node import FakeNode

    VF, HOST_NAME = "0000:32:01.1", "ens2f0v1"

    def ip_links(pid=None):
        cmd = ["ip", "-j", "link", "show"]
        if pid is not None:
            cmd = ["nsenter", f"--net=/proc/{pid}/ns/net"] + cmd
        return sorted(ln["ifname"] for ln in json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                                                            text=True).stdout))

    def wait_in(proc, target):
        for _ in range(3000):
            try:
                if os.stat(f"/proc/{proc.pid}/ns/net").st_ino == os.stat(target).st_ino:
                    return
            except OSError:
                pass
            time.sleep(0.001)
        raise SystemExit(f"pid {proc.pid} never reached {target}")

    def wait_out(proc):
        own = os.stat("/proc/self/ns/net").st_ino
        for _ in range(3000):
            if os.stat(f"/proc/{proc.pid}/ns/net").st_ino != own:
                return
            time.sleep(0.001)
        raise SystemExit("unshare -n failed")

    root, machines = Path(sys.argv[1]), Path(sys.argv[2])
    for kind in (["dummy"], ["veth", "peer", "name", "vfpeer"], ["ifb"]):  # dummy where the kernel has it
        if subprocess.run(["ip", "link", "add", HOST_NAME, "type", *kind], capture_output=True).returncode == 0:
            break
    else:
        raise SystemExit("no virtual link can be created")
    pause = subprocess.Popen(["unshare", "-n", "sleep", "120"])
    wait_out(pause)
    pod_ns = f"/proc/{pause.pid}/ns/net"
    procs = {c: subprocess.Popen(["nsenter", f"--net={pod_ns}", "sleep", "120"]) for c in ("c1", "c2")}
    for p in procs.values():
        wait_in(p, pod_ns)
    node = FakeNode(root, "gpu8-sriov", machines=machines, cpus="0-127", mems="0-3")
    (node.proc_root / "self" / "ns").mkdir()
    (node.proc_root / "self" / "ns" / "net").symlink_to("/proc/self/ns/net")
    for pid in [pause.pid] + [p.pid for p in procs.values()]:
        (node.proc_root / str(pid) / "ns").mkdir(parents=True)
        (node.proc_root / str(pid) / "ns" / "net").symlink_to(f"/proc/{pid}/ns/net")
    for c, p in procs.items():
        node.add_container(c, p.pid)
    config = config_from_dict(node.config_dict(policy="best-effort", scope="pod", devices={
        "example.com/vf": [{"is_vf": True, "has_netdev": True}]}))
    svc = NodeService(config)
    # what a VF container is told (devices.env) is written from inside its mount namespace, which
    # these sleeps share with the host: kept here instead of written there
    import numa_pin.enforcer.devnodes as devnodes
    told = []
    devnodes.create_device_nodes = lambda pid, nodes, *a, env_text=None, **k: told.append(env_text) or ()

    def admit(c):
        req = request_from_oci(c, {"io.kubernetes.cri.sandbox-id": "pod-a"}, {"PCIDEVICE_EXAMPLE_COM_VF": VF})
        svc.admit(req, procs[c].pid)

    def stop(c):
        procs[c].kill()
        procs[c].wait()
        node.stop_container(c, procs[c].pid)

    seen = {}
    admit("c1")
    seen["c1_admitted"] = {"host": ip_links(), "pod": ip_links(pause.pid),
                           "ledger": [n.ifname for n in svc.ledger.read().pods["pod-a"].netdevs], "told": told[:]}
    admit("c2")
    seen["c2_admitted"] = {"host": ip_links(), "pod": ip_links(pause.pid)}
    stop("c1")
    svc.release("c1")
    seen["c1_released"] = {"host": ip_links(), "pod": ip_links(pause.pid)}
    stop("c2")
    svc.release("c2")
    seen["c2_released"] = {"host": ip_links(), "pod": ip_links(pause.pid),
                           "pods": sorted(svc.ledger.read().pods)}
    pause.kill()
    print(json.dumps(seen))
''')


def test_pod_vf_lives_in_the_sandbox_netns_until_the_last_container_ends(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    out = subprocess.run(["unshare", "-n", sys.executable, str(tmp_path / "script.py"), str(tmp_path / "n"),
                          str(tmp_path / "machines")], capture_output=True, text=True, timeout=300)
    if out.returncode != 0 and ("unshare failed" in out.stderr or "no virtual link" in out.stderr):
        pytest.skip(out.stderr.strip().splitlines()[-1])
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    first = seen["c1_admitted"]
    assert "ens2f0v1" not in first["host"] and "net1" in first["pod"] and first["ledger"] == ["net1"]
    assert first["told"] == ["PCIDEVICE_EXAMPLE_COM_VF=0000:32:01.1\n"], "the container is told its VF's address"
    assert seen["c2_admitted"]["pod"] == first["pod"], "the second container moved nothing"
    assert "net1" in seen["c1_released"]["pod"], "the mover ended, the pod lives: the VF stays"
    last = seen["c2_released"]
    assert "ens2f0v1" in last["host"] and "net1" not in last["pod"] and last["pods"] == []
