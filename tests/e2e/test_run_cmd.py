"""``numa-pin run`` on this machine: a plain process gets the same decision a container would."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from numa_pin.ledger.store import Ledger

from . import harness

pytestmark = pytest.mark.e2e
NUMA_PIN = Path(sys.executable).with_name("numa-pin")


@pytest.fixture
def cfg(state_dir: Path) -> Path:
    if not harness.is_root():
        pytest.skip("numa-pin run creates cgroups: needs root")
    path = state_dir / "config.yaml"
    path.write_text(f"policy: restricted\nstate_dir: {state_dir / 'ledger'}\nsyslog: false\n")
    return path


def run(cfg: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(NUMA_PIN), "run", "--config", str(cfg), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_process_gets_the_exclusive_cpu_and_releases_it(cfg):
    res = run(cfg, "--cpus", "1", "--name", "job-a", "--", "sh", "-c", "grep Cpus_allowed_list /proc/self/status")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split(":")[1].strip() == "1"
    assert Ledger(str(cfg.parent / "ledger")).read().grants == {}
    assert not os.path.exists("/sys/fs/cgroup/cpuset/numa-pin/job-a")


@pytest.mark.parametrize("script, code", [("exit 3", 3), ("kill -TERM $$", 128 + 15), ("true", 0)],
                         ids=["exit-code", "killed-by-signal", "success"])
def test_exit_status_is_the_commands(cfg, script, code):
    assert run(cfg, "--", "sh", "-c", script).returncode == code


@contextlib.contextmanager
def holding_job(cfg: Path) -> Iterator[Ledger]:
    """``numa-pin run --cpus 1 --name holder -- sleep 30`` until the block ends; yields the
    ledger once the job's grant is in it."""
    holder = subprocess.Popen([str(NUMA_PIN), "run", "--config", str(cfg), "--cpus", "1", "--name", "holder", "--",
                               "sleep", "30"], stderr=subprocess.PIPE, text=True)
    try:
        ledger = Ledger(str(cfg.parent / "ledger"))
        for _ in range(200):
            if "holder" in ledger.read().grants:
                break
            time.sleep(0.05)
        yield ledger
    finally:
        holder.terminate()
        holder.wait(timeout=30)


def test_second_job_is_rejected_while_the_first_holds_the_cpu(cfg):
    with holding_job(cfg) as ledger:
        assert ledger.read().grants["holder"].cpus == frozenset({1})
        marker = cfg.parent / "ran"
        res = run(cfg, "--cpus", "1", "--", "touch", str(marker))
        assert res.returncode == 1
        assert "TopologyAffinityError" in res.stderr and "Traceback" not in res.stderr
        assert not marker.exists(), "a rejected command never runs"
    assert Ledger(str(cfg.parent / "ledger")).read().grants == {}


def test_no_command_is_a_usage_error(cfg):
    res = run(cfg, "--cpus", "1")
    assert res.returncode == 2 and "no command given" in res.stderr


def test_a_live_name_is_refused(cfg):
    """A second ``--name holder`` must not take over (and later release) the first job's grant."""
    with holding_job(cfg) as ledger:
        first = ledger.read().grants["holder"]
        marker = cfg.parent / "ran"
        res = run(cfg, "--name", "holder", "--", "touch", str(marker))
        assert res.returncode == 2, res.stderr
        assert res.stderr.startswith(
            "numa-pin: RequestError: --name: 'holder' is the name of a live grant "
            f"(pid {first.pid}, cpus 1); choose another --name"), res.stderr
        assert not marker.exists(), "a refused command never runs"
        assert ledger.read().grants["holder"] == first, "the first job keeps its grant"
        assert os.path.isdir("/sys/fs/cgroup/cpuset/numa-pin/holder")
    assert Ledger(str(cfg.parent / "ledger")).read().grants == {}


#: what /proc/<pid>/numa_maps prints for each policy on node 0 (the kernel's mpol_to_str)
POLICY_WORDS = {"interleave": "interleave:0", "bind": "bind:0", "preferred-many": "prefer (many):0",
                "weighted-interleave": "weighted interleave:0"}


@pytest.mark.parametrize("mode", sorted(POLICY_WORDS))
def test_memory_policy_is_set_on_the_command_before_exec(cfg, mode):
    """The kernel's own account (numa_maps of the exec'd command) shows the policy on its
    mappings: it was set in the child, before exec, and survived exec."""
    if mode == "weighted-interleave" and not os.path.isdir("/sys/kernel/mm/mempolicy/weighted_interleave"):
        pytest.skip("weighted interleave needs kernel 6.9 or later")
    res = run(cfg, "--cpus", "1", "--memory", "64Mi", "--memory-policy", mode, "--", "sh", "-c",
              "head -n 3 /proc/self/numa_maps")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines and all(POLICY_WORDS[mode] in line for line in lines), res.stdout


def test_without_a_policy_the_command_keeps_the_default(cfg):
    res = run(cfg, "--cpus", "1", "--", "sh", "-c", "head -n 1 /proc/self/numa_maps")
    assert res.returncode == 0 and " default " in res.stdout, res.stdout
