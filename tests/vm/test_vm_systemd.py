"""The node as users run it: Debian 12 with systemd as init, cgroup v2, the deb installed.

One qemu run, two boots (tests/vm/sysimage.py builds and caches the guest;
tests/vm/systemd_scenario.sh is what runs inside): every runtime with the systemd cgroup driver
(podman with crun and runc, runc ``--systemd-cgroup`` with the shipped snippet, ``ctr run`` with
the recipe of docs/install.md); an exclusive and a shared container in systemd scopes through
``daemon-reload`` and another writer of ``AllowedCPUs``; ``numa-pin run`` in a scope of its own;
a reboot with live grants; the socket-activated agent; ``dpkg --purge``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list

from . import sysimage

pytestmark = pytest.mark.vm

HERE = Path(__file__).resolve().parent
#: the user doc whose ``ctr run --config`` recipe the guest runs as written
INSTALL_DOC = sysimage.REPO / "docs" / "install.md"
#: set to a directory to keep what the guest left there (scenario outputs, console, build log)
KEEP_ENV = "NUMA_PIN_VM_KEEP"
#: set to a .deb to install that instead of building one from this checkout (an older release)
DEB_ENV = "NUMA_PIN_VM_DEB"
#: set to the share a kept run left (``$NUMA_PIN_VM_KEEP/share``) to check it again without booting
REUSE_ENV = "NUMA_PIN_VM_REUSE"
CTR_MARKER = "<!-- ctr-recipe:"
#: the guest's CPUs (sysimage.NUMA)
ALL_CPUS = frozenset(range(2 * len(sysimage.NUMA)))


def ctr_recipe(text: str) -> str:
    """The shell block after the ctr-recipe marker of docs/install.md, unindented."""
    after = text[text.index(CTR_MARKER):]
    block = re.search(r"```sh\n(.*?)\n\s*```", after, re.S)
    assert block is not None, "the ctr recipe block of docs/install.md is missing"
    lines = block.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"


class Guest:
    """What the guest left in the share: ``out(boot, name)``, ``rc(boot, name)``."""

    def __init__(self, share: Path) -> None:
        self.share = share

    def out(self, boot: int, name: str) -> str:
        return (self.share / f"b{boot}" / f"{name}.out").read_text(errors="replace")

    def rc(self, boot: int, name: str) -> int:
        return int((self.share / f"b{boot}" / f"{name}.rc").read_text())

    def props(self, boot: int, name: str) -> dict[str, frozenset[int]]:
        """``unit_state`` output: AllowedCPUs, AllowedMemoryNodes and effective, as sets."""
        out = {}
        for line in self.out(boot, name).splitlines():
            key, _, value = line.partition("=")
            out[key] = parse_list(",".join(value.split()))  # systemctl shows "0 2-3"
        return out

    def status(self, boot: int, name: str) -> dict:
        return json.loads(self.out(boot, name))


@pytest.fixture(scope="module")
def guest() -> Iterator[Guest]:
    if os.environ.get(REUSE_ENV):
        yield Guest(Path(os.environ[REUSE_ENV]))
        return
    reason = sysimage.unavailable_reason()
    if reason:
        pytest.skip(reason)
    work = Path(tempfile.mkdtemp(prefix="np-systemd-guest-"))
    log = work / "build.log"
    try:
        base = sysimage.base_tree(log)
        deb = Path(os.environ[DEB_ENV]) if os.environ.get(DEB_ENV) else sysimage.build_deb(work, log)
        image = sysimage.make_image(
            base, deb, (HERE / "systemd_scenario.sh").read_text(), work, log,
            files={"/usr/local/share/np-readme-ctr.sh": ctr_recipe(INSTALL_DOC.read_text()).encode()},
        )
        share = work / "share"
        share.mkdir()
        sysimage.boot(image, share, timeout=1500, console_log=work / "console.log")
        image.unlink()
        if not (share / "boot2.rc").exists():
            console = (work / "console.log").read_text(errors="replace")[-4000:]
            logs = "".join((share / f"boot{n}.log").read_text(errors="replace")[-2000:]
                           for n in (1, 2) if (share / f"boot{n}.log").exists())
            pytest.fail(f"the guest did not finish both boots; scenario logs:\n{logs}\nconsole:\n{console}")
        yield Guest(share)
    finally:
        keep = os.environ.get(KEEP_ENV)
        if keep:
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(work, keep, symlinks=True, ignore=shutil.ignore_patterns("*.ext4", "*.deb", "tree"))
        shutil.rmtree(work, ignore_errors=True)


def cpus_allowed(text: str) -> frozenset[int]:
    found = re.search(r"^Cpus_allowed_list:\s*(\S+)", text, re.M)
    assert found, text
    return parse_list(found.group(1))


def test_the_guest_is_systemd_on_cgroup_v2_with_two_nodes(guest: Guest) -> None:
    assert (guest.share / "b1" / "init").read_text().strip() == "systemd"
    assert (guest.share / "b1" / "cgroupfs").read_text().strip() == "cgroup2fs"
    assert (guest.share / "b1" / "nodes").read_text().split() == [cpus for _, cpus in sysimage.NUMA]


@pytest.mark.parametrize("step", ["podman-crun", "podman-runc", "runc-plain"])
def test_a_container_that_asks_for_nothing_starts(guest: Guest, step: str) -> None:
    assert guest.rc(1, step) == 0, guest.out(1, step)
    assert cpus_allowed(guest.out(1, step)) == ALL_CPUS


@pytest.mark.parametrize("step", ["podman-crun-excl", "podman-runc-excl", "runc-excl", "run", "ctr-readme"])
def test_an_exclusive_container_is_pinned_to_one_cpu(guest: Guest, step: str) -> None:
    assert guest.rc(1, step) == 0, guest.out(1, step)
    assert len(cpus_allowed(guest.out(1, step))) == 1


def test_numa_pin_run_lives_in_a_transient_scope_of_its_own(guest: Guest) -> None:
    cgroup = re.search(r"^0::(\S+)$", guest.out(1, "run"), re.M)
    assert cgroup is not None and re.fullmatch(r"/system\.slice/numa-pin-run-\d+\.scope", cgroup.group(1))
    assert guest.rc(1, "run-no-root-cgroup") == 0, "no /sys/fs/cgroup/numa-pin is left"


def test_the_grant_is_set_through_systemd_and_survives_daemon_reload(guest: Guest) -> None:
    grants = {g["container_id"]: g for g in guest.status(1, "status-1")["grants"]}
    granted = parse_list(grants["np-excl"]["cpus"])
    assert len(granted) == 1
    for step in ("excl-granted", "excl-reload"):
        props = guest.props(1, step)
        assert props["AllowedCPUs"] == granted and props["effective"] == granted, (step, props)
        assert props["AllowedMemoryNodes"] == parse_list(grants["np-excl"]["mems"])


def test_a_shared_scope_stays_off_the_exclusive_cpus_across_daemon_reload(guest: Guest) -> None:
    grants = {g["container_id"]: g for g in guest.status(1, "status-1")["grants"]}
    granted = parse_list(grants["np-excl"]["cpus"])
    for step in ("shared-granted", "shared-reload"):
        props = guest.props(1, step)
        assert props["AllowedCPUs"] == ALL_CPUS - granted and props["effective"] == ALL_CPUS - granted, (step, props)


def test_another_writer_of_allowed_cpus_is_repaired_through_systemd(guest: Guest) -> None:
    grants = {g["container_id"]: g for g in guest.status(1, "status-1")["grants"]}
    granted = parse_list(grants["np-excl"]["cpus"])
    assert guest.props(1, "excl-other-writer")["effective"] == ALL_CPUS, "the other writer widened it"
    assert guest.rc(1, "reconcile") == 0, guest.out(1, "reconcile")
    assert "np-excl" in guest.out(1, "reconcile")
    for step in ("excl-reconciled", "excl-reconciled-reload"):
        props = guest.props(1, step)
        assert props["AllowedCPUs"] == granted and props["effective"] == granted, (step, props)


def test_after_a_reboot_no_grant_of_the_earlier_boot_is_held(guest: Guest) -> None:
    before = {g["container_id"] for g in guest.status(1, "status-before-reboot")["grants"]}
    assert {"np-excl", "np-shared"} <= before
    assert guest.status(2, "status-after-reboot")["grants"] == []
    journal = guest.out(2, "journal-released")
    for cid in ("np-excl", "np-shared"):
        assert re.search(rf"released {cid}:.*earlier boot", journal), journal


def test_after_a_crash_and_a_power_cut_this_boots_grant_gives_back_what_this_boot_had(guest: Guest) -> None:
    """Issue 35 item 1: an isolated grant (host services, C-states, IRQs) killed with -9, then the
    power cut, leaves the earlier boot's originals in the journal; the first isolated grant of the
    new boot saves this boot's own, and its release writes every one of them back."""
    assert guest.rc(1, "crash-start") == 0, guest.out(1, "crash-start")
    assert guest.rc(2, "again-start") == 0, guest.out(2, "again-start")
    assert guest.rc(2, "again-release") == 0, guest.out(2, "again-release")
    for boot, before, held in ((1, "crash-orig", "crash-held"), (2, "boot2-orig", "again-held")):
        orig, during = json.loads(guest.out(boot, before)), json.loads(guest.out(boot, held))
        assert "n/a" in during["pm_qos"].values() and "n/a" not in orig["pm_qos"].values(), (boot, during)
        assert during["system.slice"]["effective"] != orig["system.slice"]["effective"], (boot, during)
        assert during["irqs"] != orig["irqs"] or during["default_smp_affinity"] != orig["default_smp_affinity"]
    orig, after = json.loads(guest.out(2, "boot2-orig")), json.loads(guest.out(2, "again-after"))
    for key in sorted(orig):
        was, now = orig[key], after[key]
        if key.endswith((".scope", ".slice")) and was["cpus"] == "" and now["cpus"] == was["effective"]:
            # Linux before 6.7 refuses an empty cpuset.cpus on a populated cgroup (ENOSPC): what
            # stays is the value it inherited, through systemd the property is empty again
            # (docs/isolation.md, host services)
            now = {**now, "cpus": ""}
        assert now == was, (key, was, after[key])


def test_the_socket_activated_agent_serves_after_the_reboot(guest: Guest) -> None:
    assert guest.out(2, "agent-socket").strip() == "active"
    assert guest.rc(2, "podman-agent") == 0, guest.out(2, "podman-agent")
    assert len(cpus_allowed(guest.out(2, "podman-agent"))) == 1
    assert guest.out(2, "agent-service").strip() == "active"


def test_purge_leaves_no_unit_behind_and_containers_still_start(guest: Guest) -> None:
    assert guest.rc(2, "purge") == 0, guest.out(2, "purge")
    left = [line for line in guest.out(2, "units-after-purge").splitlines()
            if line.startswith("numa-pin") and not line.startswith(sysimage.SCENARIO_UNIT)]
    assert left == [], "units of the purged package are still listed (not-found)"
    assert guest.rc(2, "podman-after-purge") == 0, guest.out(2, "podman-after-purge")


def _loop_samples(text: str) -> tuple[list[int], list[frozenset[int]]]:
    """``sample_loops`` output: every sampled CPU (``/proc/<pid>/stat`` field 39) of the busy
    loops, and each loop's ``Cpus_allowed_list``."""
    cpus = [int(word) for line in text.splitlines() if not line.startswith("Cpus_allowed_list")
            for word in line.split()]
    allowed = [parse_list(line.split(":", 1)[1].strip()) for line in text.splitlines()
               if line.startswith("Cpus_allowed_list")]
    return cpus, allowed


def test_host_services_stay_off_an_exclusive_cpu_while_the_grant_lives(guest: Guest) -> None:
    """Issue 24, knob 1: busy loops started as host services (systemd-run) while a grant asking
    ``numa-pin.io/host-services: disable`` lives never run on its CPU, across a daemon-reload
    (``system.slice``'s AllowedCPUs say so), and run there again once it is released."""
    assert guest.rc(1, "hostiso-start") == 0, guest.out(1, "hostiso-start")
    grants = {g["container_id"]: g for g in guest.status(1, "hostiso-status")["grants"]}
    granted = parse_list(grants["np-hostiso"]["cpus"])
    assert len(granted) == 1
    explained = json.loads(guest.out(1, "hostiso-explain"))
    assert explained["grant"]["isolation"] == {"host": True}
    assert not explained["isolated"]["host"].startswith("cannot"), explained["isolated"]
    for step in ("hostiso-during", "hostiso-reload"):
        cpus, allowed = _loop_samples(guest.out(1, step))
        assert len(cpus) == 4 * 60 and not set(cpus) & granted, (step, sorted(set(cpus)))
        assert allowed == [ALL_CPUS - granted] * 4, (step, allowed)
    for step in ("hostiso-slice", "hostiso-slice-reload"):  # through systemd: daemon-reload keeps it
        props = guest.props(1, step)
        assert props["AllowedCPUs"] == ALL_CPUS - granted and props["effective"] == ALL_CPUS - granted, (step, props)
    assert guest.props(1, "hostiso-loop")["effective"] == ALL_CPUS - granted
    assert guest.rc(1, "hostiso-release") == 0, guest.out(1, "hostiso-release")
    assert "np-hostiso" not in {g["container_id"] for g in guest.status(1, "hostiso-status-after")["grants"]}
    assert guest.props(1, "hostiso-slice-after")["effective"] == ALL_CPUS
    cpus, allowed = _loop_samples(guest.out(1, "hostiso-after"))
    assert allowed == [ALL_CPUS] * 4
    assert set(cpus) & granted, f"no busy loop ran on CPU {sorted(granted)} after the release: {sorted(set(cpus))}"
