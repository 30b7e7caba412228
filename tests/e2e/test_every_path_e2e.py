"""The matrix of docs/paths.md through the real runtimes of this machine (2 CPUs, 1 NUMA node,
CPU 0 reserved, so CPU 1 is the only CPU an exclusive grant can take).

Each request runs through runc's prestart hook (a bundle with numa-pin's hooks) and podman's
precreate hook (podman 4.3 with runc: its config says runtime-spec 1.0.2, so no
``linux.memoryPolicy``). The oracle is what the kernel shows the container's process
(``Cpus_allowed_list``), or the one line and kind of the refusal; both paths must agree, row
by row, and nothing may stay held after the container is gone.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from . import harness
from .test_hook_e2e import PRECREATE_ONLY, _bundle, _cpus_allowed, _hooks_dir

pytestmark = pytest.mark.e2e

#: (id, annotations, what every path must give: "admitted" or the refusal's kind)
ROWS = [
    ("one-cpu", {"numa-pin.io/cpus": "1"}, "admitted"),
    ("memory-only", {"numa-pin.io/memory": "64Mi"}, "admitted"),
    ("two-cpus", {"numa-pin.io/cpus": "2"}, "refused"),  # one CPU of this machine can be exclusive
    ("memory-policy", {"numa-pin.io/cpus": "1", "numa-pin.io/memory-policy": "interleave"}, "PathLimitError"),
    # mixed CPUs: its exclusive CPU 1 and the shared pool (CPU 0, reserved but shared) in one cpuset
    ("cpu-shared", {"numa-pin.io/cpus": "1", "numa-pin.io/cpu-shared": "true"}, "admitted"),
    ("cpu-shared-no-cpus", {"numa-pin.io/memory": "64Mi", "numa-pin.io/cpu-shared": "true"}, "RequestError"),
]
#: a refusal's line: ``rejected`` by the decision, or ``error`` for a request it cannot mean (both exit 1)
KIND = re.compile(r"numa-pin: (?:rejected|error) \S+: (\w+): ")


def _runc(runc_rt, node, rootfs: Path, tmp_path: Path, annotations: dict[str, str]) -> tuple[str, str]:
    cid = harness.new_container_id()
    res = runc_rt.run(_bundle(tmp_path, cid, node, rootfs, annotations, args=("cat", "/proc/self/status")), cid)
    if res.returncode == 0:
        return "admitted", _cpus_allowed(res.stdout)
    found = KIND.search(res.stderr)
    assert found, res.stderr
    return "refused", found.group(1)


def _podman(store, node, rootfs: Path, tmp_path: Path, annotations: dict[str, str]) -> tuple[str, str]:
    hooks = _hooks_dir(node, tmp_path / "hooks.d", PRECREATE_ONLY)
    res = harness.run_podman(rootfs, args=["cat", "/proc/self/status"], store=store, annotations=annotations,
                             hooks_dir=hooks, name=harness.new_container_id())
    if res.returncode == 0:
        return "admitted", _cpus_allowed(res.stdout)
    (reason,) = [json.loads(p.read_text()) for p in (node.state / "reasons").glob("*.json")]
    found = KIND.search(reason["line"])
    assert found and "\n" not in reason["line"], reason
    return "refused", found.group(1)


@pytest.mark.parametrize("row, annotations, want", ROWS, ids=[r[0] for r in ROWS])
def test_one_request_one_result_through_runc_and_podman(runc_rt, podman_runc, node, busybox_rootfs, tmp_path,
                                                        row, annotations, want):
    through_runc = _runc(runc_rt, node, busybox_rootfs, tmp_path / "runc", annotations)
    assert node.grants() == {}, "runc's poststop released it"
    for reasons in (node.state / "reasons").glob("*.json"):
        reasons.unlink()  # the next path's refusal is read from its own reason file
    through_podman = _podman(podman_runc, node, busybox_rootfs, tmp_path / "podman", annotations)
    assert node.grants() == {}, "podman's poststop released it, or the refusal kept nothing"
    assert through_runc == through_podman
    verdict, detail = through_runc
    if want == "admitted":
        assert verdict == "admitted"
        exclusive_only = "numa-pin.io/cpus" in annotations and "numa-pin.io/cpu-shared" not in annotations
        assert detail == ("1" if exclusive_only else "0-1")
    else:
        assert verdict == "refused" and (want == "refused" or detail == want), detail


#: what ``numa-pin run`` gives each row where it differs from the hooks: it sets a memory policy
#: itself (``set_mempolicy`` before exec), and it has no flag for mixed CPUs (``None``: not asked)
RUN = {"memory-policy": "admitted", "cpu-shared": None, "cpu-shared-no-cpus": None}
#: the annotations whose value ``numa-pin run`` takes as a flag of the same name
RUN_FLAGS = ("cpus", "memory", "hugepages-2Mi", "hugepages-1Gi", "devices", "policy", "scope", "pod",
             "memory-policy", "memory-tier")


def _run_args(annotations: dict[str, str]) -> list[str] | None:
    """``numa-pin run``'s flags for ``annotations`` (None where one has no flag)."""
    args: list[str] = []
    for key, value in annotations.items():
        name = key.removeprefix("numa-pin.io/")
        if name not in RUN_FLAGS:
            return None
        args += [f"--{name}", value]
    return args


@pytest.mark.parametrize("row, annotations, want", ROWS, ids=[r[0] for r in ROWS])
def test_one_request_one_result_through_numa_pin_run(node, row, annotations, want):
    """The same rows as a plain process's: the same verdict as the hooks', the same CPUs."""
    want = RUN.get(row, want)
    args = _run_args(annotations)
    assert (args is None) == (want is None), "a row run has no flag for is one it cannot be asked"
    if args is None:
        return
    res = subprocess.run([str(node.path.with_name("numa-pin")), "run", "--config", str(node.cfg), *args, "--",
                          "grep", "Cpus_allowed_list", "/proc/self/status"], capture_output=True, text=True, timeout=60)
    assert node.grants() == {}, "the run released it"
    if want == "admitted":
        assert res.returncode == 0, res.stderr
        exclusive = "numa-pin.io/cpus" in annotations
        assert res.stdout.split(":")[1].strip() == ("1" if exclusive else "0-1")
        return
    found = KIND.search(res.stderr)
    assert res.returncode == 1 and found and "\n" not in res.stderr.strip(), res.stderr
    assert want == "refused" or found.group(1) == want


def test_podman_tells_a_mixed_container_its_exclusive_and_shared_cpus(podman_runc, node, busybox_rootfs, tmp_path):
    """precreate sets CRI-O's variables and numa-pin's (prestart cannot: the process exists)."""
    hooks = _hooks_dir(node, tmp_path / "hooks.d", PRECREATE_ONLY)
    script = "echo $OPENSHIFT_ISOLATED_CPUS/$NUMA_PIN_EXCLUSIVE_CPUS/$OPENSHIFT_SHARED_CPUS/$NUMA_PIN_SHARED_CPUS"
    annotations = next(r[1] for r in ROWS if r[0] == "cpu-shared")
    res = harness.run_podman(busybox_rootfs, args=["sh", "-c", script], store=podman_runc, annotations=annotations,
                             hooks_dir=hooks, name=harness.new_container_id())
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1/1/0/0"
    assert node.grants() == {}
