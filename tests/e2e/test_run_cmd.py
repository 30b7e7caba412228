"""``numa-pin run`` on this machine: a plain process gets the same decision a container would."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from numa_pin.ledger.store import Ledger

pytestmark = pytest.mark.e2e
NUMA_PIN = Path(sys.executable).with_name("numa-pin")


@pytest.fixture
def cfg(state_dir: Path) -> Path:
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


def test_the_command_sees_its_grant(cfg):
    """The variables name the grant the ledger recorded, and the grant file says the same;
    the file is gone once the job ends."""
    script = ('echo "cpus=$NUMA_PIN_CPUS mems=$NUMA_PIN_MEMS file=$NUMA_PIN_GRANT_FILE"; cat "$NUMA_PIN_GRANT_FILE"; '
              'grep Cpus_allowed_list /proc/self/status')
    res = run(cfg, "--cpus", "1", "--name", "sees", "--", "sh", "-c", script)
    assert res.returncode == 0, res.stderr
    head, rest = res.stdout.split("\n", 1)
    fields = dict(part.split("=", 1) for part in head.split())
    allowed = rest.rsplit("Cpus_allowed_list:", 1)[1].strip()
    assert fields["cpus"] == allowed == "1"
    doc = json.loads(rest.rsplit("Cpus_allowed_list:", 1)[0])
    assert (doc["id"], doc["cpus"], [str(m) for m in doc["mems"]]) == ("sees", [1], fields["mems"].split(","))
    assert not os.path.exists(fields["file"])


def test_ranks_each_run_bound_and_the_worst_status_wins(cfg):
    script = 'echo "$NUMA_PIN_RANK/$NUMA_PIN_RANKS $NUMA_PIN_CPUS $(grep Cpus_allowed_list /proc/self/status)"; ' \
             'exit $((NUMA_PIN_RANK * 2))'
    res = run(cfg, "--cpus", "1", "--ranks", "3", "--", "sh", "-c", script)
    assert res.returncode == 4, res.stderr  # ranks exit 0, 2, 4
    lines = sorted(res.stdout.split("\n")[:-1])
    assert [line.split()[0] for line in lines] == ["0/3", "1/3", "2/3"]
    assert all(line.split()[1] == line.split()[-1] == "1" for line in lines), lines


@pytest.mark.parametrize("args", [("--ranks", "2"), ("--ranks", "0", "--cpus", "1")], ids=["shared", "zero"])
def test_bad_ranks_are_one_line(cfg, args):
    marker = cfg.parent / "ran"
    res = run(cfg, *args, "--", "touch", str(marker))
    assert res.returncode == 2 and "--ranks" in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr
    assert not marker.exists()


def test_an_explicit_cpu_list_is_reserved_and_refused_when_taken(cfg):
    res = run(cfg, "--cpu-list", "1", "--", "sh", "-c", "echo $NUMA_PIN_CPUS")
    assert (res.returncode, res.stdout.strip()) == (0, "1"), res.stderr
    with holding_job(cfg):
        marker = cfg.parent / "ran"
        res = run(cfg, "--cpu-list", "1", "--", "touch", str(marker))
        assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
        assert "Traceback" not in res.stderr and not marker.exists()
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
