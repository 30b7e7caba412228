"""Knobs 2 to 5 of issue 24 on a real kernel: the 2-node qemu guest (cgroup v2), runc inside.

One container asks ``cpu-load-balancing.crio.io: disable`` and ``irq-load-balancing.crio.io:
disable`` for 2 exclusive CPUs (node 1, CPUs 2-3). Its cgroup sits at the top of the hierarchy,
so the guest's Debian 12 kernel (6.1, no ``cpuset.cpus.exclusive``) can make it a partition; a
nested one asking the same is rejected there with one line. The oracle is the kernel: the
partition file it reads back, ``/proc/irq/*/smp_affinity_list`` and ``default_smp_affinity``
(the guest's virtio IRQs among them), before, while the container runs, after outside writers
changed them and ``numa-pin reconcile`` ran, and after the container ended.

In the same boot, a second container asks ``cpu-c-states.crio.io: disable`` and
``cpu-quota.crio.io: disable`` (its spec asks a CFS quota, the original to restore): each
exclusive CPU's ``power/pm_qos_resume_latency_us`` reads ``n/a`` (what CRI-O writes) and its
``cpu.max`` ``max <period>`` while the grant lives, ``reconcile`` writes both back after outside
writers changed them, and ``release --force`` (the cgroup still there) restores both originals.
The guest has no cpufreq: a third asking a governor is refused with one line, and the C-state
limit it asks beside it is never written.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list

from .guest import DEFAULT_NUMA, GuestResult, run_in_guest_with_retry, unavailable_reason

pytestmark = pytest.mark.vm

GUEST_SCRIPT = r"""
set -u
"$NP_PY" "$NP_SHARED/iso_driver.py" > "$NP_SHARED/driver.out" 2>&1
"""

GUEST_DRIVER = r'''
import json, os, subprocess
from pathlib import Path

import harness

shared = Path(os.environ["NP_SHARED"])
hook = os.environ["NP_HOOK"]
cli = str(Path(hook).with_name("numa-pin"))
work = Path("/run/np-iso")
work.mkdir(parents=True, exist_ok=True)
config = work / "config.yaml"
config.write_text(f"policy: single-numa-node\nstate_dir: {work / 'state'}\nsyslog: false\n")
env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"NUMA_PIN_CACHE_DIR={work / 'cache'}",
       "PYTHONDONTWRITEBYTECODE=1"]
# TCG on a busy host: a hook start can take tens of seconds here
hooks = {stage: [harness.hook_entry(hook, ["numa-pin-hook", "--config", str(config), stage], env=env, timeout=240)]
         for stage in ("createRuntime", "poststop")}
rootfs = harness.make_rootfs(work / "rootfs")
rt = harness.runtime("runc", work / "runc")
cgroot = Path("/sys/fs/cgroup")
report = {"kernel": os.uname().release, "has_exclusive": (cgroot / "cpuset.cpus.exclusive").exists() or any(
    (d / "cpuset.cpus.exclusive").exists() for d in cgroot.iterdir() if d.is_dir())}

def irqs():
    out = {}
    for d in sorted(Path("/proc/irq").iterdir()):
        f = d / "smp_affinity_list"
        if d.name.isdigit() and f.exists():
            out[d.name] = f.read_text().strip()
    out["default"] = Path("/proc/irq/default_smp_affinity").read_text().strip()
    return out

def virtio():
    names = {}
    for line in Path("/proc/interrupts").read_text().splitlines()[1:]:
        irq, _, rest = line.partition(":")
        if "virtio" in rest and irq.strip().isdigit():
            names[irq.strip()] = rest.split()[-1]
    return names

def cli_run(*args):
    res = subprocess.run([cli, *args, "--config", str(config)], capture_output=True, text=True, timeout=120)
    return {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}

def bundle(name, annotations, args, cgroups_path):
    return harness.make_bundle(work / "bundles" / name, args=args, rootfs=rootfs, annotations=annotations,
                               hooks=hooks, cgroups_path=cgroups_path)

asks = {"numa-pin.io/cpus": "2", "cpu-load-balancing.crio.io": "disable", "irq-load-balancing.crio.io": "disable"}
report["before"] = irqs()
report["virtio"] = virtio()
cg = cgroot / "np-iso"
cid = harness.new_container_id("iso")
try:
    with harness.running_container(rt, bundle("iso", asks, ["sleep", "1000"], "/np-iso"), cid, timeout=180) as st:
        report["held"] = {"partition": (cg / "cpuset.cpus.partition").read_text().strip(),
                          "cpus": (cg / "cpuset.cpus.effective").read_text().strip(), "irqs": irqs()}
        report["explain"] = cli_run("explain", cid, "--json")
        # outside writers: the partition turned back into a member, a moved IRQ back on every CPU
        (cg / "cpuset.cpus.partition").write_text("member\n")
        moved = [i for i, v in report["held"]["irqs"].items() if i != "default" and v != report["before"][i]]
        drifted = {}
        for irq in moved[:1]:
            Path(f"/proc/irq/{irq}/smp_affinity_list").write_text(report["before"][irq] + "\n")
            drifted[irq] = Path(f"/proc/irq/{irq}/smp_affinity_list").read_text().strip()
        report["drift"] = {"partition": (cg / "cpuset.cpus.partition").read_text().strip(), "irqs": drifted}
        report["reconcile"] = cli_run("reconcile")
        report["repaired"] = {"partition": (cg / "cpuset.cpus.partition").read_text().strip(), "irqs": irqs()}
except Exception as exc:
    report["error"] = repr(exc)
report["after"] = {"irqs": irqs(), "cgroup": cg.exists(), "status": cli_run("status", "--json")}
res = rt.run(bundle("nested", {"numa-pin.io/cpus": "1", "cpu-load-balancing.crio.io": "disable"}, ["true"],
                    "/np-nest/ctr"), "nested", timeout=180)
report["nested"] = {"rc": res.returncode, "stderr": res.stderr,
                    "partition": [p.read_text().strip() for p in (cgroot / "np-nest").rglob("cpuset.cpus.partition")]}

def pmqos():
    return {p.parent.parent.name: p.read_text().strip()
            for p in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/power/pm_qos_resume_latency_us"))}

# knobs 4 and 5: no C-state, no CFS quota (the spec asks a quota: its original to restore)
report["pmqos_before"] = pmqos()
qcg = cgroot / "np-quota"
qasks = {"numa-pin.io/cpus": "2", "cpu-c-states.crio.io": "disable", "cpu-quota.crio.io": "disable"}
qbundle = harness.make_bundle(work / "bundles" / "quota", args=["sleep", "1000"], rootfs=rootfs, annotations=qasks,
                              hooks=hooks, cgroups_path="/np-quota",
                              resources={"cpu": {"quota": 50000, "period": 100000}})
qid = harness.new_container_id("quota")
q = report["quota"] = {}
try:
    with harness.running_container(rt, qbundle, qid, timeout=180):
        q["held"] = {"pmqos": pmqos(), "cpu_max": (qcg / "cpu.max").read_text().strip(),
                     "cpus": (qcg / "cpuset.cpus.effective").read_text().strip()}
        # outside writers: one exclusive CPU's limit lifted, the quota put back
        first = next(c for c, v in q["held"]["pmqos"].items() if v != report["pmqos_before"][c])
        Path(f"/sys/devices/system/cpu/{first}/power/pm_qos_resume_latency_us").write_text("0\n")
        (qcg / "cpu.max").write_text("50000 100000\n")
        q["drift"] = {"pmqos": pmqos(), "cpu_max": (qcg / "cpu.max").read_text().strip()}
        q["reconcile"] = cli_run("reconcile")
        q["repaired"] = {"pmqos": pmqos(), "cpu_max": (qcg / "cpu.max").read_text().strip()}
        # release while the cgroup lives (--force: it stays, shared): both originals back
        q["release"] = cli_run("release", qid, "--force", "--json")
        q["released"] = {"pmqos": pmqos(), "cpu_max": (qcg / "cpu.max").read_text().strip()}
except Exception as exc:
    q["error"] = repr(exc)
q["after"] = {"pmqos": pmqos(), "status": cli_run("status", "--json")}

# no cpufreq in the guest: a governor is refused with one line, the C-state limit asked beside it not written
cpufreq = Path("/sys/devices/system/cpu/cpufreq")
report["cpufreq"] = sorted(p.name for p in cpufreq.glob("policy*")) if cpufreq.is_dir() else []
res = rt.run(bundle("gov", {"numa-pin.io/cpus": "1", "cpu-c-states.crio.io": "disable",
                            "cpu-freq-governor.crio.io": "performance"}, ["true"], "/np-gov"), "gov", timeout=180)
report["governor"] = {"rc": res.returncode, "stderr": res.stderr, "pmqos": pmqos()}
(shared / "iso_report.json").write_text(json.dumps(report, indent=2))
'''

ISOLATED = DEFAULT_NUMA[1].cpus  # the one node with 2 free CPUs (CPU 0 is reserved)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from . import guest as guest_mod

    hook = guest_mod.REPO / ".venv" / "bin" / "numa-pin-hook"
    if not hook.exists():
        pytest.skip("numa-pin-hook is not installed in .venv")

    def make_shared() -> Path:
        shared = tmp_path_factory.mktemp("isoguest")
        (shared / "iso_driver.py").write_text(textwrap.dedent(GUEST_DRIVER))
        return shared

    result: GuestResult = run_in_guest_with_retry(make_shared, f"export NP_HOOK={hook}\n" + GUEST_SCRIPT, timeout=900)
    assert "iso_report.json" in result.files, (
        f"rc={result.rc}\n{result.files.get('driver.out', b'').decode()}\nconsole:{result.console[-2000:]}"
    )
    print(f"guest boot + isolation checks + poweroff: {result.elapsed_s:.1f}s")
    out = json.loads(result.text("iso_report.json"))
    if "held" in out:
        held = out["held"]["irqs"]
        stuck = json.loads(out["explain"]["stdout"] or "{}").get("irq_unmovable", {})
        print(f"kernel {out['kernel']}: {len(out['virtio'])} virtio IRQs, "
              f"{sum(held[i] != out['before'][i] for i in out['virtio'])} moved, unmovable {sorted(stuck)}")
    return out


def _off(text: str) -> bool:
    return not parse_list(text) & parse_list(ISOLATED)


def test_the_container_is_an_isolated_partition_while_it_runs(report):
    assert "error" not in report, report.get("error")
    held = report["held"]
    assert held["cpus"] == ISOLATED
    assert held["partition"] == "isolated", "the kernel's own word, read back"


def test_virtio_and_every_movable_irq_leave_its_cpus(report):
    held, before = report["held"]["irqs"], report["before"]
    stuck = json.loads(report["explain"]["stdout"]).get("irq_unmovable", {})
    assert report["virtio"], "the guest has virtio IRQs"
    for irq in before:
        if irq == "default":
            continue
        assert irq in stuck or _off(held[irq]), f"IRQ {irq}: {before[irq]} -> {held[irq]} (unmovable: {stuck})"
    moved_virtio = [i for i in report["virtio"] if held[i] != before[i]]
    assert moved_virtio, f"some virtio IRQ moved: {report['virtio']} {held} {stuck}"
    mask = int(held["default"].replace(",", ""), 16)
    assert not any(mask >> c & 1 for c in parse_list(ISOLATED)), "new IRQs start off them too"


def test_reconcile_repairs_what_outside_writers_changed(report):
    drift, repaired = report["drift"], report["repaired"]
    assert drift["partition"] == "member" and drift["irqs"], drift
    assert report["reconcile"]["rc"] == 0, report["reconcile"]
    assert repaired["partition"] == "isolated"
    for irq in drift["irqs"]:
        assert not _off(drift["irqs"][irq]) and _off(repaired["irqs"][irq]), (irq, drift, repaired["irqs"][irq])


def test_release_restores_every_irq_and_the_partition_goes_with_the_cgroup(report):
    after = report["after"]
    assert after["irqs"] == report["before"]
    assert not after["cgroup"]
    assert json.loads(after["status"]["stdout"])["grants"] == []


def test_a_nested_cgroup_without_cpus_exclusive_is_rejected_with_one_line(report):
    if report["has_exclusive"]:
        pytest.skip(f"kernel {report['kernel']} has cpuset.cpus.exclusive")
    nested = report["nested"]
    assert nested["rc"] != 0
    said = nested["stderr"][nested["stderr"].find("numa-pin:"):]  # runc quotes the hook's one line
    assert said.startswith("numa-pin: rejected nested: IsolationError") and "Linux 6.7" in said, nested["stderr"]
    assert "rollback" not in said, "refused before the first write: nothing to roll back"
    assert all(p in ("member", "") for p in nested["partition"]), "nothing was half-applied"


QUOTA_ORIGINAL = "50000 100000"  # what the second container's spec asks (runc writes it)


def _quota(report: dict) -> dict:
    q = report["quota"]
    assert "error" not in q, q.get("error")
    return q


def test_c_states_off_and_no_quota_while_the_grant_lives(report):
    q, before = _quota(report), report["pmqos_before"]
    assert q["held"]["cpus"] == ISOLATED
    mine = {f"cpu{c}" for c in parse_list(q["held"]["cpus"])}
    assert mine and mine <= set(before), (mine, before)
    for cpu, value in q["held"]["pmqos"].items():
        assert value == ("n/a" if cpu in mine else before[cpu]), (cpu, before[cpu], value)
    assert all(before[c] != "n/a" for c in mine), "the kernel's default is not what the grant asks"
    assert q["held"]["cpu_max"] == "max " + QUOTA_ORIGINAL.split()[1], "no quota, the spec's period kept"


def test_reconcile_rewrites_pm_qos_and_cpu_max_after_outside_writers(report):
    q = _quota(report)
    drifted = [c for c, v in q["drift"]["pmqos"].items() if v != q["held"]["pmqos"][c]]
    assert len(drifted) == 1 and q["drift"]["cpu_max"] == QUOTA_ORIGINAL, q["drift"]
    assert q["reconcile"]["rc"] == 0, q["reconcile"]
    assert q["repaired"] == {"pmqos": q["held"]["pmqos"], "cpu_max": q["held"]["cpu_max"]}


def test_release_restores_pm_qos_and_cpu_max(report):
    q = _quota(report)
    assert q["release"]["rc"] == 0 and json.loads(q["release"]["stdout"])["moved_to_shared"], q["release"]
    assert q["released"] == {"pmqos": report["pmqos_before"], "cpu_max": QUOTA_ORIGINAL}
    assert q["after"]["pmqos"] == report["pmqos_before"]
    assert json.loads(q["after"]["status"]["stdout"])["grants"] == []


def test_a_node_without_cpufreq_refuses_a_governor_with_one_line(report):
    if report["cpufreq"]:
        pytest.skip(f"kernel {report['kernel']} has cpufreq policies {report['cpufreq']}")
    gov = report["governor"]
    assert gov["rc"] != 0
    said = gov["stderr"][gov["stderr"].find("numa-pin:"):]  # runc quotes the hook's one line
    assert said.startswith("numa-pin: rejected gov: IsolationError") and "no cpufreq policy" in said, gov["stderr"]
    assert "rollback" not in said, "refused before the first write: nothing to roll back"
    assert gov["pmqos"] == report["pmqos_before"], "the C-state limit asked beside it was not half-applied"
