"""Grant NVIDIA GPUs to a container's device cgroup.

What a container needs to use GPU ``N`` (major 195 is fixed by the NVIDIA driver):

* ``c 195:N rwm``     ``/dev/nvidiaN`` (N is the *device minor*, never the NVML index)
* ``c 195:255 rwm``   ``/dev/nvidiactl``
* ``c U:0 rwm``, ``c U:1 rwm``  ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools``, where
  ``U`` is the ``nvidia-uvm`` major from ``/proc/devices`` (left out while the module is
  not loaded)

cgroup v1: the rules are appended to ``devices.allow`` of the container's ``devices``
cgroup, each recorded for undo as the same rule written to ``devices.deny``. Rules that
``devices.list`` already covers are not written (so undo never takes away access the
container had before).

cgroup v2 has no ``devices.allow``: access is decided by ``BPF_PROG_TYPE_CGROUP_DEVICE``
programs attached to the container's cgroup, and every one of them must allow an access.
:mod:`numa_pin.enforcer.bpfdev` replaces each program attached to the container's cgroup
(the pid's cgroup and, for crun's systemd ``container`` sub-cgroup, the scope above it) by a
copy that starts with an allow-prologue for the rules and then runs the original
instructions unchanged (:mod:`numa_pin.devices.devfilter`), swapped in atomically with
``BPF_F_ALLOW_MULTI | BPF_F_REPLACE``. The runtime's own rules are kept exactly; undo takes
the prologue out again, so the container loses the access and keeps what it had.

Why BPF and not systemd's ``DeviceAllow=``: the cgroupfs driver has no unit to set it on,
and with the systemd driver runc attaches its own program next to systemd's, which would
still deny the GPU; so the programs themselves have to change under either driver.
What the runtimes do to it later:

* ``runc update`` (runc 1.1.5; kubelet's CPU manager and in-place resize go through it) keeps
  it: runc sets ``SkipDevices`` on update precisely so that a plugin's device setup survives,
  and never reaches ``libcontainer/cgroups/ebpf``. That code (which replaces a single attached
  program via BPF_F_REPLACE and, with several attached, attaches its own and detaches *all*
  others) runs only when runc writes devices, at create, before the prestart hooks. Measured
  in the VM tier with one and with two programs attached: both keep the prologue.
* ``systemctl daemon-reload`` (systemd driver): systemd attaches a fresh program of its own
  and detaches its previous one, which is no longer attached (ours replaced it); the fresh one
  denies the GPU, so the container loses it (fail-closed, it never gains anything else) and
  our copy of systemd's old program stays attached until the container ends. Not measured
  (the guest has no systemd).

Programs attached to cgroups above the container's (a slice's device policy) are shared by
other containers and are not changed; if one of them denies the GPU, it stays denied. When
``oci_rules`` (see :func:`oci_rules_from_config`) are given and already allow every rule,
the runtime grants the GPU itself and nothing is changed.

Device nodes inside the container's ``/dev`` are created by :mod:`numa_pin.enforcer.devnodes`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from numa_pin.base.record import record, replace
from numa_pin.base.safefs import replace_private
from numa_pin.devices.devfilter import DeviceRule
from numa_pin.enforcer import cgroups
from numa_pin.enforcer.mounts import CgroupLayout
from numa_pin.enforcer.undo import UndoFn, UndoLog, describe_failures
from numa_pin.errors import EnforcementError
from numa_pin.topology.model import PciDevice

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
UVM_DEVICE_NAME = "nvidia-uvm"
DEVICES_ALLOW = "devices.allow"
DEVICES_DENY = "devices.deny"
DEVICES_LIST = "devices.list"
GPU_FILE = "run/numa-pin/gpus"



@record
class OciDeviceRule:
    """One ``linux.resources.devices`` entry of an OCI config: allow or deny ``rule`` (later
    entries win)."""

    allow: bool
    rule: DeviceRule

    def matches(self, wanted: DeviceRule, access: str) -> bool:
        """Whether this entry speaks about the ``access`` letter of ``wanted``."""
        return self.rule.covers(replace(wanted, access=access))


@record
class GpuGrant:
    """The result of :func:`allow_device_rules`.

    ``rules`` is what the GPUs need; ``added`` what was written to ``devices.allow`` (v1)
    or into the device programs of the cgroups in ``bpf_dirs`` (v2). ``verified``: the
    cgroup was read back and allows ``rules``.
    """

    version: int
    cgroup_dir: str | None
    rules: tuple[DeviceRule, ...]
    added: tuple[DeviceRule, ...]
    verified: bool
    bpf_dirs: tuple[str, ...] = ()


# ---- pure helpers --------------------------------------------------------------------
def parse_char_majors(text: str) -> dict[str, int]:
    """``name -> major`` of the "Character devices:" section of ``/proc/devices`` (pure)."""
    out: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_char = stripped == "Character devices:"
            continue
        if not in_char or not stripped:
            continue
        major_s, _, name = stripped.partition(" ")
        if major_s.isdigit() and name.strip():
            out.setdefault(name.strip(), int(major_s))
    return out


def nvidia_rules(minors: Iterable[int], uvm_major: int | None) -> tuple[DeviceRule, ...]:
    """The device rules GPUs with device ``minors`` need (pure); see the module doc."""
    rules = [DeviceRule("c", NVIDIA_MAJOR, m) for m in sorted(set(minors))]
    rules.append(DeviceRule("c", NVIDIA_MAJOR, NVIDIACTL_MINOR))
    if uvm_major is not None:
        rules.append(DeviceRule("c", uvm_major, 0))
        rules.append(DeviceRule("c", uvm_major, 1))
    return tuple(rules)


def oci_rules_from_config(config: Mapping[str, Any]) -> tuple[OciDeviceRule, ...]:
    """The device rules a runtime derives from an OCI ``config.json`` (pure).

    ``linux.resources.devices`` in order, then one allow-``rwm`` rule per
    ``linux.devices`` entry (runc and crun grant the devices they create). Raises
    EnforcementError for entries of the wrong shape.
    """
    linux = config.get("linux") or {}
    resources = linux.get("resources") or {}
    out: list[OciDeviceRule] = []
    try:
        for entry in resources.get("devices") or ():
            out.append(OciDeviceRule(bool(entry["allow"]), DeviceRule(
                type=str(entry.get("type") or "a"),
                major=None if entry.get("major") in (None, -1) else int(entry["major"]),
                minor=None if entry.get("minor") in (None, -1) else int(entry["minor"]),
                access=str(entry.get("access") or "rwm"),
            )))
        for dev in linux.get("devices") or ():
            kind = {"u": "c"}.get(str(dev["type"]), str(dev["type"]))
            if kind in ("b", "c"):  # FIFOs ("p") need no device rule
                out.append(OciDeviceRule(True, DeviceRule(kind, int(dev["major"]), int(dev["minor"]), "rwm")))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EnforcementError(
            f"config.json linux.resources.devices / linux.devices entry is malformed: {exc}"
        ) from exc
    return tuple(out)


def oci_allows(rules: Sequence[OciDeviceRule], wanted: DeviceRule) -> bool:
    """True when OCI rules grant every access letter of ``wanted`` (pure).

    For each letter the last matching rule decides; no matching rule means deny.
    """
    for access in wanted.access:
        decision = False
        for rule in rules:
            if rule.matches(wanted, access):
                decision = rule.allow
        if not decision:
            return False
    return True


# ---- I/O -----------------------------------------------------------------------------
def read_uvm_major(proc_root: str | os.PathLike[str]) -> int | None:
    """The ``nvidia-uvm`` character major from ``<proc_root>/devices``, or None.

    Raises EnforcementError naming the file when it cannot be read.
    """
    path = os.path.join(os.fspath(proc_root), "devices")
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        raise EnforcementError(f"cannot read: {exc.strerror or exc}", path=path) from exc
    return parse_char_majors(text).get(UVM_DEVICE_NAME)


def gpu_minors(gpus: Iterable[PciDevice]) -> list[int]:
    """The device minor of each GPU. Raises EnforcementError for one without (driver not loaded)."""
    minors: list[int] = []
    for gpu in gpus:
        if gpu.gpu_minor is None:
            raise EnforcementError(
                f"GPU {gpu.address} has no device minor (is the NVIDIA driver loaded? "
                f"/proc/driver/nvidia/gpus/{gpu.address}/information names it)"
            )
        minors.append(gpu.gpu_minor)
    return minors


def _read_devices_list(cgroup_dir: str) -> tuple[DeviceRule, ...]:
    path = os.path.join(cgroup_dir, DEVICES_LIST)
    rules: list[DeviceRule] = []
    for line in cgroups.read_cgroup_file(path).splitlines():
        if not line.strip():
            continue
        try:
            rules.append(DeviceRule.parse(line))
        except ValueError as exc:
            raise EnforcementError(str(exc), path=path) from exc
    return tuple(rules)


def _covered(rule: DeviceRule, have: Iterable[DeviceRule]) -> bool:
    return any(h.covers(rule) for h in have)


def gpu_rules(gpus: Iterable[PciDevice], proc_root: str | os.PathLike[str]) -> tuple[DeviceRule, ...]:
    """The device rules that make ``gpus`` usable: :func:`nvidia_rules` of their minors and of
    this node's ``nvidia-uvm`` major.

    Raises EnforcementError for a GPU without a device minor or an unreadable ``/proc/devices``.
    """
    return nvidia_rules(gpu_minors(gpus), read_uvm_major(proc_root))


def allow_device_rules(
    rules: tuple[DeviceRule, ...],
    pid: int | str,
    proc_root: str | os.PathLike[str],
    cgroup_root: str | os.PathLike[str],
    layout: CgroupLayout,
    undo: UndoLog,
    *,
    oci_rules: Sequence[OciDeviceRule] | None = None,
) -> GpuGrant:
    """Make the devices of ``rules`` (for GPUs: :func:`gpu_rules`) usable by the container whose
    init is ``pid``.

    v1 (a v1 ``devices`` hierarchy is mounted): rules missing from ``devices.list`` are
    written to ``devices.allow`` (each recorded in ``undo``), then ``devices.list`` is
    checked. v2: the device programs of the container's cgroup are replaced by copies that
    also allow the rules (see the module doc; one undo step per cgroup), and read back;
    nothing changes when ``oci_rules`` (see :func:`oci_rules_from_config`) already allow them.

    Raises EnforcementError for an unreadable cgroup file, a rule the kernel refused, and on
    v2 a device program that cannot be read, loaded or swapped (the kernel's errno, the cgroup
    as ``path``); the changes of this call are rolled back first. CgroupEscapeError for a
    cgroup path outside ``cgroup_root``.
    """
    devices_dir = cgroups.find_v1_controller_dir(pid, proc_root, cgroup_root, layout, "devices")
    if devices_dir is None:
        return _grant_v2(rules, cgroups.find_cgroup(pid, proc_root, cgroup_root, layout), undo, oci_rules)

    have = _read_devices_list(devices_dir)
    allow = os.path.join(devices_dir, DEVICES_ALLOW)
    deny = os.path.join(devices_dir, DEVICES_DENY)
    local = UndoLog()
    added: list[DeviceRule] = []
    try:
        for rule in rules:
            if _covered(rule, have):
                continue
            cgroups.write_cgroup_file(allow, str(rule))
            local.record(f"{allow}: {rule}", _deny(deny, str(rule)))
            added.append(rule)
        now = _read_devices_list(devices_dir)
        lacking = [r for r in rules if not _covered(r, now)]
        if lacking:
            raise EnforcementError(
                "after writing devices.allow the cgroup still lacks "
                + ", ".join(str(r) for r in lacking), path=devices_dir)
    except EnforcementError as exc:
        failures = local.rollback()
        raise EnforcementError(f"granting GPUs failed: {exc}; {describe_failures(failures)}",
                               path=devices_dir) from exc
    undo.absorb(local)
    return GpuGrant(1, devices_dir, rules, tuple(added), True)


def _deny(path: str, rule: str) -> UndoFn:
    def undo() -> None:
        cgroups.write_cgroup_file(path, rule)

    return undo


def _allow_rules(rules: Sequence[DeviceRule], where: str | None) -> list[DeviceRule]:
    """``rules``, each checked to name one device (what a device program's prologue holds)."""
    try:
        return [DeviceRule.device(r.type, r.major, r.minor, r.access) for r in rules]
    except ValueError as exc:
        raise EnforcementError(f"cgroup v2: only single devices can be granted: {exc}", path=where) from exc


def bpf_cgroup_dirs(ref: cgroups.CgroupRef) -> tuple[str, ...]:
    """The cgroups whose device programs decide for the container (pure): the pid's own
    cgroup and, when a runtime sub-cgroup was stepped out of, the unit above it."""
    own = cgroups.safe_join(ref.hierarchy_root, ref.pid_rel_path) if ref.pid_rel_path else ref.cpuset_dir
    return tuple(dict.fromkeys((own, ref.cpuset_dir)))


def _grant_v2(rules: tuple[DeviceRule, ...], ref: cgroups.CgroupRef, undo: UndoLog,
              oci_rules: Sequence[OciDeviceRule] | None) -> GpuGrant:
    """:func:`allow_device_rules` on cgroup v2, for the container's located cgroup ``ref``."""
    if oci_rules is not None and all(oci_allows(oci_rules, r) for r in rules):
        return GpuGrant(2, ref.cpuset_dir, rules, (), True)
    from numa_pin.enforcer import bpfdev  # libbpf and ctypes only when a GPU is granted on v2

    wanted = _allow_rules(rules, ref.cpuset_dir)
    by_text = {str(w): r for w, r in zip(wanted, rules)}
    dirs = bpf_cgroup_dirs(ref)
    local = UndoLog()
    added: dict[str, DeviceRule] = {}
    try:
        for directory in dirs:
            done = bpfdev.add_rules(directory, wanted)
            if done:
                local.record(f"{directory}: device programs allow {', '.join(map(str, done))}",
                             _take_out(directory, done))
                added.update((str(d), by_text[str(d)]) for d in done)
    except EnforcementError as exc:
        failures = local.rollback()
        error = EnforcementError(f"granting GPUs failed: {exc}; {describe_failures(failures)}",
                                 path=exc.path or ref.cpuset_dir, errno=exc.errno)
        error.add_rollback_failures(exc.rollback_failures)
        raise error from exc
    undo.absorb(local)
    return GpuGrant(2, ref.cpuset_dir, rules, tuple(added.values()), True, dirs)


def _take_out(directory: str, rules: Sequence[Any]) -> UndoFn:
    def undo() -> None:
        from numa_pin.enforcer import bpfdev

        bpfdev.remove_rules(directory, rules)

    return undo


def revoke_granted_rules(rules: Sequence[str], devices_dir: str | None, bpf_dirs: Sequence[str]) -> None:
    """Take back device ``rules`` a grant added: ``devices.deny`` in the cgroup v1 ``devices``
    directory ``devices_dir`` (skipped when None or gone), and out of the device programs of the
    cgroup v2 ``bpf_dirs`` (:func:`revoke_device_rules`). Raises EnforcementError."""
    if devices_dir and os.path.isdir(devices_dir):
        for rule in rules:
            cgroups.write_cgroup_file(os.path.join(devices_dir, DEVICES_DENY), rule)
    if bpf_dirs:
        revoke_device_rules(list(rules), list(bpf_dirs))


def revoke_device_rules(rules: Sequence[str], bpf_dirs: Sequence[str]) -> None:
    """Take device ``rules`` (``c 195:0 rwm`` texts, as in :attr:`GpuGrant.added`) back out of
    the device programs of ``bpf_dirs`` (cgroup v2; a cgroup that is gone is skipped).
    Raises EnforcementError."""
    if not rules or not bpf_dirs:
        return
    parsed = []
    for text in rules:
        try:
            parsed.append(DeviceRule.parse(text))
        except ValueError as exc:
            raise EnforcementError(f"recorded device rule: {exc}") from exc
    from numa_pin.enforcer import bpfdev

    for directory in bpf_dirs:
        bpfdev.remove_rules(directory, _allow_rules(parsed, directory))


def expose_gpu_env_file(
    rootfs: str | os.PathLike[str],
    uuids: Sequence[str],
    undo: UndoLog | None = None,
    *,
    relpath: str = GPU_FILE,
) -> str:
    """Write the granted GPU UUIDs, one a line, to ``<rootfs>/<relpath>``; return its path.

    At createRuntime the environment can no longer change, so a file is how the
    container learns its GPUs. The file replaces any previous one atomically; when
    ``undo`` is given, its removal (and that of directories created) is recorded.
    Note that a tmpfs the runtime mounts over ``/run`` hides the file; pick another
    ``relpath`` then. Raises EnforcementError when the path would leave ``rootfs``
    (symlinks included) or cannot be written.
    """
    target = cgroups.join_under(rootfs, relpath)
    directory = os.path.dirname(target)
    created: list[str] = []
    probe = directory
    while not os.path.lexists(probe) and probe != os.fspath(rootfs):
        created.append(probe)
        probe = os.path.dirname(probe)
    text = "".join(f"{u}\n" for u in uuids)
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        cgroups.join_under(rootfs, os.path.relpath(directory, rootfs))  # re-check after mkdir
        replace_private(directory, target, text.encode("ascii", errors="replace"), mode=0o644)
    except OSError as exc:
        raise EnforcementError(f"cannot write the GPU list: {exc.strerror or exc}",
                               path=target) from exc
    if undo is not None:
        def remove() -> None:
            if os.path.lexists(target):
                os.unlink(target)
            for d in created:  # deepest first
                if os.path.isdir(d) and not os.listdir(d):
                    os.rmdir(d)

        undo.record(f"{target}: GPU list {', '.join(uuids)}", remove)
    return target


__all__ = [
    "GPU_FILE",
    "NVIDIACTL_MINOR",
    "NVIDIA_MAJOR",
    "DeviceRule",
    "GpuGrant",
    "OciDeviceRule",
    "allow_device_rules",
    "bpf_cgroup_dirs",
    "expose_gpu_env_file",
    "gpu_minors",
    "gpu_rules",
    "nvidia_rules",
    "oci_allows",
    "oci_rules_from_config",
    "parse_char_majors",
    "read_uvm_major",
    "revoke_device_rules",
    "revoke_granted_rules",
]
