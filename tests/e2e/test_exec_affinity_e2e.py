"""What the real runtimes and podman do with ``process.execCPUAffinity`` (``docs/exec-affinity.md``).

A container on CPUs 0-1 whose config carries what numa-pin's precreate writes for ``first``
(``final``: one of its CPUs), and one exec whose own process document carries it too (crun reads
it from there only). The oracle is the kernel's ``Cpus_allowed_list`` of the exec'd process,
against the versions the runtimes' sources name: runc 1.3.0 and crun 1.19 apply it; older ones
ignore the field and the exec gets the container's whole cpuset (Debian 12: runc 1.1.5, crun
1.8.1; Debian 13's crun 1.21 applies it).

Through podman, the config's ``ociVersion`` is the oracle: podman decodes a precreate hook's output
into its own runtime-spec structures, so a podman whose config is older than runtime-spec 1.2
(4.3 writes ``1.0.2-dev``) drops the field, and numa-pin's precreate refuses the annotation there
in one line; a newer one keeps what numa-pin writes.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.hook.precreate import EXEC_AFFINITY_SINCE, runtime_features

from . import harness
from .test_hook_e2e import ONE_CPU, PRECREATE_ONLY, _hooks_dir, _oci_config

#: the first release of each runtime that applies process.execCPUAffinity to an exec
HONOURED_SINCE = {"runc": (1, 3, 0), "crun": (1, 19)}
CONTAINER_CPUS, FINAL = "0-1", "1"


def _version(rt: harness.OciRuntime) -> tuple[int, ...]:
    out = harness.execute([rt.binary, "--version"], timeout=30).stdout
    found = re.search(r"version (\d+(?:\.\d+)*)", out)
    assert found, out
    return tuple(int(p) for p in found.group(1).split("."))


def _allowed(text: str) -> frozenset[int]:
    found = re.search(r"Cpus_allowed_list:\s*(\S+)", text)
    assert found, text
    return parse_list(found.group(1))


def test_an_exec_runs_where_the_runtime_applies_exec_cpu_affinity(oci_rt, busybox_rootfs, tmp_path, cid):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two CPUs")
    bundle = harness.make_bundle(tmp_path / "bundle", args=["sleep", "1000"], rootfs=busybox_rootfs,
                                 cgroups_path=f"/{cid}", resources={"cpu": {"cpus": CONTAINER_CPUS, "mems": "0"}})
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["execCPUAffinity"] = {"final": FINAL}
    (bundle / "config.json").write_text(json.dumps(spec))
    process = tmp_path / "process.json"
    process.write_text(json.dumps({**spec["process"], "args": ["grep", "Cpus_allowed_list", "/proc/self/status"]}))
    with harness.running_container(oci_rt, bundle, cid):
        init = oci_rt._exec("exec", cid, "grep", "Cpus_allowed_list", "/proc/1/status", timeout=30)
        by_config = oci_rt._exec("exec", cid, "grep", "Cpus_allowed_list", "/proc/self/status", timeout=30)
        by_document = oci_rt._exec("exec", "--process", str(process), cid, timeout=30)
    whole, first = parse_list(CONTAINER_CPUS), parse_list(FINAL)
    honours = _version(oci_rt) >= HONOURED_SINCE[oci_rt.name]
    assert _allowed(init.stdout) == whole, "never the container's init"
    assert _allowed(by_document.stdout) == (first if honours else whole), by_document.stderr
    # runc takes the config's value as every exec's default; crun reads the exec's document only
    assert _allowed(by_config.stdout) == (first if honours and oci_rt.name == "runc" else whole), by_config.stderr


def _podman_keeps_it(store, busybox_rootfs, tmp_path) -> tuple[dict, bool]:
    """A precreate hook of its own adds the field and a variable; the config podman handed the
    runtime, and whether the field survived."""
    hook = tmp_path / "add-exec-affinity"
    hook.write_text("#!/bin/sh\nexec jq -c '.process.execCPUAffinity={\"final\":\"0\"}"
                    " | .process.env += [\"EXEC_AFFINITY_HOOK=1\"]'\n")
    hook.chmod(0o755)
    hooks = tmp_path / "hooks.d"
    hooks.mkdir()
    (hooks / "add.json").write_text(json.dumps({"version": "1.0.0", "hook": {"path": str(hook)},
                                                "when": {"always": True}, "stages": ["precreate"]}))
    name = harness.new_container_id()
    res = harness.run_podman(busybox_rootfs, args=["true"], store=store, hooks_dir=hooks, name=name, remove=False)
    assert res.returncode == 0, res.stderr
    config = _oci_config(store, name)
    harness.execute(store.argv("rm", name), timeout=60)
    assert "EXEC_AFFINITY_HOOK=1" in config["process"]["env"], "the hook ran and podman took its output"
    return config, "execCPUAffinity" in config["process"]


def test_podman_keeps_a_precreate_exec_affinity_only_from_runtime_spec_1_2(podman_runc, busybox_rootfs, tmp_path):
    if harness.find_binary("jq") is None:
        pytest.skip("jq is not installed")
    config, kept = _podman_keeps_it(podman_runc, busybox_rootfs, tmp_path)
    assert kept is runtime_features(config).exec_affinity, config["ociVersion"]


def test_numa_pin_precreate_carries_or_refuses_it_as_podman_keeps_it(podman_runc, node, busybox_rootfs, tmp_path):
    hooks = _hooks_dir(node, tmp_path / "hooks.d", PRECREATE_ONLY)
    name = harness.new_container_id()
    ask = {**ONE_CPU, "numa-pin.io/exec-cpu-affinity": "first"}
    res = harness.run_podman(busybox_rootfs, args=["true"], store=podman_runc, annotations=ask, hooks_dir=hooks,
                             name=name, remove=False)
    if res.returncode != 0:  # a podman whose config has no process.execCPUAffinity: refused, nothing kept
        (reason,) = [json.loads(p.read_text()) for p in (node.state / "reasons").glob("*.json")]
        assert "PathLimitError" in reason["line"] and "no process.execCPUAffinity (1.2 or later)" in reason["line"]
        assert node.grants() == {}
        harness.execute(podman_runc.argv("rm", "--force", name), timeout=60)
        return
    config = _oci_config(podman_runc, name)
    harness.execute(podman_runc.argv("rm", name), timeout=60)
    assert runtime_features(config).exec_affinity, f"admitted on a runtime-spec {config['ociVersion']} config"
    assert config["process"]["execCPUAffinity"] == {"final": config["linux"]["resources"]["cpu"]["cpus"]}
    assert EXEC_AFFINITY_SINCE == (1, 2, 0)
