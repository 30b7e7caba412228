"""A Debian guest as users run one: systemd as init, cgroup v2, the deb installed.

A :class:`Flavour` names the suite, its packages, containerd's configuration and its cache:
:data:`BOOKWORM` (Debian 12, the systemd guest) and :data:`TRIXIE` (Debian 13, containerd 1.7 with
NRI switched on, the NRI guest). :func:`base_tree` debootstraps the flavour's root filesystem (systemd, podman, crun, runc,
containerd, python3 and numa-pin's Debian dependencies) from the archive this machine's apt
uses, with the host kernel's modules, and caches it under :func:`cache_dir` by a hash of its
:data:`RECIPE` (a changed recipe builds a new one; the first build takes a few minutes).
:func:`make_image` copies that tree, installs the numa-pin ``.deb`` built from this checkout
(``packaging/scripts/build-deb.sh``) and a oneshot unit that runs a scenario script, and packs
it into an ext4 image (``mkfs.ext4 -d``). :func:`boot` runs qemu under TCG with the host kernel
and initrd, two NUMA nodes and ``systemd.unified_cgroup_hierarchy=1``; the unit writes its
results to a 9p share and powers the guest off. A scenario that reboots the guest
(``systemctl reboot``) runs again on the next boot of the same disk: qemu restarts it.

The scenario sees ``NP_OUT`` (the share, mounted in the guest) and ``NP_BOOT`` (1, 2, ...).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from .guest import REPO, find_kernel

#: bump when the way the tree is configured changes (the recipe hash covers the rest)
RECIPE_VERSION = 1
SUITE = "bookworm"
PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "udev", "kmod", "iproute2", "procps", "util-linux",
    "podman", "netavark", "crun", "runc", "containerd", "busybox-static",
    "python3", "python3-psutil", "python3-pyroute2", "python3-prctl", "python3-yaml", "python3-protobuf",
    "python3-prometheus-client",
    "libbpf1",
)
#: containerd with the systemd cgroup driver (CRI's runc runtime)
CONTAINERD_TOML = ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
                   "  SystemdCgroup = true\n")
#: the one switch that turns containerd 1.7's NRI on (plugins connect to /var/run/nri/nri.sock)
NRI_TOML = '[plugins."io.containerd.nri.v1.nri"]\n  disable = false\n'


class Flavour(NamedTuple):
    """One kind of guest: its Debian suite, packages, containerd config and cache."""

    suite: str
    packages: tuple[str, ...]
    containerd_toml: str
    #: the variable that names its cache, and the default under ``<repo>/.cache``
    cache_env: str
    cache_name: str
    #: installed by apt in the tree after debootstrap (whose resolver is too simple for them)
    apt_packages: tuple[str, ...] = ()
    #: boot the suite's own kernel (installed in the tree, see :func:`tree_kernel`), not the host's
    own_kernel: bool = False


#: python3-grpcio (the deb depends on it) by apt: debootstrap's resolver cannot install it on trixie
BOOKWORM = Flavour(SUITE, PACKAGES, CONTAINERD_TOML, "NUMA_PIN_VM_CACHE", "vm-systemd", ("python3-grpcio",))
#: the NRI guest drives containerd's CRI with tests/e2e/cri.py, so it needs grpc and its compiler
#: and boots Debian 13's kernel (6.12: nested isolated partitions need 6.7 or later)
TRIXIE = Flavour("trixie", PACKAGES, CONTAINERD_TOML + NRI_TOML, "NUMA_PIN_VM_CACHE_TRIXIE", "vm-trixie",
                 ("python3-grpcio", "python3-grpc-tools", "linux-image-amd64", "initramfs-tools"), own_kernel=True)
#: containerd 2.x (Debian sid): configuration version 3, the CRI runtime's options under their new
#: plugin name, NRI named as 1.7 names it (2.x turns it on by default; said anyway)
CONTAINERD2_TOML = ("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n"
                    "  SystemdCgroup = true\n[plugins.'io.containerd.nri.v1.nri']\n  disable = false\n")
#: the same guest on containerd 2.x (Debian's development suite)
SID = Flavour("sid", PACKAGES, CONTAINERD2_TOML, "NUMA_PIN_VM_CACHE_SID", "vm-sid",
              ("python3-grpcio", "python3-grpc-tools", "linux-image-amd64", "initramfs-tools"), own_kernel=True)
#: the host tools the tier needs, with the Debian package that has each
HOST_TOOLS = {"debootstrap": "debootstrap", "qemu-system-x86_64": "qemu-system-x86", "mkfs.ext4": "e2fsprogs",
              "chroot": "coreutils"}
CACHE_ENV = "NUMA_PIN_VM_CACHE"
#: the guest's NUMA layout: (memory, cpus) per node
NUMA = (("1G", "0-1"), ("1G", "2-3"))
#: the PCI function a guest may get on a NUMA node (qemu's ``edu`` device: no backend; its
#: vendor and device ids as sysfs writes them)
DEVICE = ("edu", "0x1234", "0x11e8")
SCENARIO_UNIT = "numa-pin-scenario.service"
SHARE_TAG = "npout"

UNIT_TEXT = """[Unit]
Description=numa-pin test scenario
After=multi-user.target containerd.service
Wants=containerd.service

[Service]
Type=oneshot
StandardOutput=journal+console
StandardError=journal+console
ExecStart=/usr/local/sbin/numa-pin-scenario-boot

[Install]
WantedBy=multi-user.target
"""

#: mounts the share, counts the boot, runs the scenario, powers off unless it asked for a reboot
BOOT_TEXT = f"""#!/bin/sh
mkdir -p /mnt/npout
mount -t 9p -o trans=virtio,version=9p2000.L {SHARE_TAG} /mnt/npout || exit 1
n=$(( $(cat /var/lib/numa-pin-scenario-boots 2>/dev/null || echo 0) + 1 ))
echo "$n" > /var/lib/numa-pin-scenario-boots
sync
export NP_OUT=/mnt/npout NP_BOOT=$n
timeout -k 5 900 bash /usr/local/sbin/numa-pin-scenario > /mnt/npout/boot$n.log 2>&1
echo $? > /mnt/npout/boot$n.rc
sync
[ -e /run/numa-pin-scenario-reboot ] && exit 0
systemctl --no-block poweroff
"""


def archive_mirror(sources: Sequence[Path] = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))) -> str:
    """The Debian archive this machine's apt uses (first ``deb`` URI of the main archive)."""
    texts: list[str] = []
    for src in sources:
        if src.is_dir():
            texts += [p.read_text(errors="replace") for p in sorted(src.iterdir()) if p.is_file()]
        elif src.is_file():
            texts.append(src.read_text(errors="replace"))
    for text in texts:
        for line in text.splitlines():
            words = line.split()
            uri = None
            if words[:1] == ["deb"]:
                uri = next((w for w in words[1:] if "://" in w), None)
            elif words[:1] == ["URIs:"] and len(words) > 1:
                uri = words[1]
            if uri and "security" not in uri:
                return uri.rstrip("/")
    return "http://deb.debian.org/debian"


def kernel_pair() -> tuple[Path, Path] | None:
    """The host kernel and its initrd, or None."""
    kernel = find_kernel()
    if kernel is None:
        return None
    initrd = kernel.with_name(kernel.name.replace("vmlinuz", "initrd.img"))
    return (kernel, initrd) if initrd.is_file() and os.access(initrd, os.R_OK) else None


def recipe(mirror: str, kernel: Path, flavour: Flavour = BOOKWORM) -> dict[str, object]:
    """Everything the base tree depends on (its hash names the cache entry)."""
    return {"version": RECIPE_VERSION, "suite": flavour.suite, "mirror": mirror,
            "packages": sorted(flavour.packages), "kernel": "the suite's" if flavour.own_kernel else kernel.name, "boot_text": BOOT_TEXT,
            "unit": UNIT_TEXT, "containerd": flavour.containerd_toml, "apt": sorted(flavour.apt_packages)}


def recipe_hash(rec: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir(flavour: Flavour = BOOKWORM) -> Path:
    """Where built trees live: ``$NUMA_PIN_VM_CACHE`` (``$NUMA_PIN_VM_CACHE_TRIXIE``), else
    ``<repo>/.cache/vm-systemd`` (``vm-trixie``; ignored by git)."""
    return Path(os.environ.get(flavour.cache_env) or REPO / ".cache" / flavour.cache_name)


def unavailable_reason() -> str | None:
    """Why this machine cannot build or boot the guest (a skip reason), or None."""
    if os.geteuid() != 0:
        return "the systemd guest needs root (debootstrap, chroot)"
    for tool, pkg in HOST_TOOLS.items():
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {pkg}; make deps installs it)"
    if kernel_pair() is None:
        return "no readable /boot/vmlinuz-* with its initrd.img (apt-get install linux-image-amd64)"
    return None


def _run(argv: list[str], log: Path, timeout: float, **kw: object) -> None:
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{argv[0]} failed (exit {done.returncode}); log {log}:\n{tail}")


def _configure(root: Path, kernel: Path, flavour: Flavour) -> None:
    """Make the debootstrapped tree boot by itself: fstab, hostname, the host kernel's modules,
    the scenario unit, containerd with the systemd cgroup driver."""
    (root / "etc" / "fstab").write_text("/dev/vda / ext4 rw,errors=remount-ro 0 1\n")
    (root / "etc" / "hostname").write_text("np-guest\n")
    (root / "etc" / "machine-id").write_text("")
    if not flavour.own_kernel:
        kver = kernel.name.removeprefix("vmlinuz-")
        shutil.copytree(f"/lib/modules/{kver}", root / "lib" / "modules" / kver, symlinks=True, dirs_exist_ok=True)
    sbin = root / "usr" / "local" / "sbin"
    sbin.mkdir(parents=True, exist_ok=True)
    (sbin / "numa-pin-scenario-boot").write_text(BOOT_TEXT)
    (sbin / "numa-pin-scenario-boot").chmod(0o755)
    units = root / "etc" / "systemd" / "system"
    (units / SCENARIO_UNIT).write_text(UNIT_TEXT)
    wants = units / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / SCENARIO_UNIT).symlink_to(f"/etc/systemd/system/{SCENARIO_UNIT}")
    for masked in ("getty@tty1.service", "serial-getty@ttyS0.service", "systemd-timesyncd.service",
                   "apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer"):
        with contextlib.suppress(FileExistsError):
            (units / masked).symlink_to("/dev/null")
    containerd = root / "etc" / "containerd"
    containerd.mkdir(parents=True, exist_ok=True)
    (containerd / "config.toml").write_text(flavour.containerd_toml)


def base_tree(log: Path, flavour: Flavour = BOOKWORM) -> Path:
    """The cached base tree of ``flavour`` for the current recipe, built when missing."""
    pair = kernel_pair()
    if pair is None:
        raise RuntimeError("no host kernel with an initrd")
    mirror = archive_mirror()
    rec = recipe(mirror, pair[0], flavour)
    cache = cache_dir(flavour)
    base = cache / f"base-{recipe_hash(rec)}"
    if (base / ".complete").is_file():
        return base
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="base-", dir=cache))
    debs = cache / "debs"
    debs.mkdir(exist_ok=True)
    try:
        _run(["debootstrap", "--variant=minbase", f"--cache-dir={debs}", "--include=" + ",".join(flavour.packages),
              flavour.suite, str(work / "root"), mirror], log, timeout=1800)
        if flavour.apt_packages:
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"}
            _run(["chroot", str(work / "root"), "apt-get", "install", "-y", "--no-install-recommends",
                  *flavour.apt_packages], log, timeout=1800, env=env)
            _run(["chroot", str(work / "root"), "apt-get", "clean"], log, timeout=600, env=env)
        _configure(work / "root", pair[0], flavour)
        (work / "root" / "var" / "cache" / "apt" / "archives").mkdir(parents=True, exist_ok=True)
        (work / "recipe.json").write_text(json.dumps(rec, indent=1, sort_keys=True))
        (work / ".complete").write_text("")
        shutil.rmtree(base, ignore_errors=True)
        work.rename(base)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for old in cache.glob("base-*"):
        if old != base and (old / ".complete").is_file():
            shutil.rmtree(old, ignore_errors=True)
    return base


def build_deb(out: Path, log: Path) -> Path:
    """``packaging/scripts/build-deb.sh`` into ``out``; the .deb's path."""
    _run(["bash", str(REPO / "packaging" / "scripts" / "build-deb.sh"), str(out)], log, timeout=600)
    found = sorted(out.glob("numa-pin_*_all.deb"))
    if not found:
        raise RuntimeError(f"build-deb.sh made no .deb in {out}")
    return found[-1]


def make_image(base: Path, deb: Path, scenario: str, work: Path, log: Path,
               files: dict[str, bytes] | None = None) -> Path:
    """An ext4 image of ``base`` with ``deb`` installed and ``scenario`` as the boot scenario;
    ``files`` are extra files (path inside the guest -> bytes)."""
    tree = work / "tree"
    _run(["cp", "-a", "--reflink=auto", str(base / "root"), str(tree)], log, timeout=600)
    shutil.copy(deb, tree / "tmp" / deb.name)
    _run(["chroot", str(tree), "dpkg", "-i", f"/tmp/{deb.name}"], log, timeout=600,
         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"})
    (tree / "tmp" / deb.name).unlink()
    (tree / "usr" / "local" / "sbin" / "numa-pin-scenario").write_text(scenario)
    for path, data in (files or {}).items():
        dest = tree / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    used_mb = int(subprocess.run(["du", "-sm", str(tree)], capture_output=True, text=True, check=True)
                  .stdout.split()[0])
    image = work / "root.ext4"
    _run(["mkfs.ext4", "-q", "-F", "-L", "npguest", "-d", str(tree), str(image), f"{used_mb + 1024}M"], log,
         timeout=600)
    shutil.rmtree(tree, ignore_errors=True)
    return image


def qemu_argv(kernel: Path, initrd: Path, image: Path, share: Path, device_node: int | None = None) -> list[str]:
    """qemu under TCG: 4 CPUs in two NUMA nodes, the image as /dev/vda, ``share`` over 9p.
    ``device_node``: also an emulated IOMMU and :data:`DEVICE` behind a PCIe expander bridge of that
    node (its ``numa_node`` in sysfs), in an IOMMU group of its own, so it can be bound to vfio-pci."""
    iommu = ["-device", "intel-iommu,intremap=off"] if device_node is not None else []  # before any PCI device
    append = ("root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 systemd.show_status=0 quiet "
              "panic=-1 net.ifnames=0" + (" intel_iommu=on iommu=pt" if device_node is not None else ""))
    if device_node is None:
        disks = ["-drive", f"file={image},if=virtio,format=raw,cache=unsafe",
                 "-virtfs", f"local,path={share},mount_tag={SHARE_TAG},security_model=none,id={SHARE_TAG}"]
    else:  # on the root bus by name: a device left to find a bus would take the expander bridge's
        disks = ["-drive", f"file={image},if=none,id=vda,format=raw,cache=unsafe",
                 "-device", "virtio-blk-pci,drive=vda,bus=pcie.0",
                 "-fsdev", f"local,path={share},security_model=none,id={SHARE_TAG}",
                 "-device", f"virtio-9p-pci,fsdev={SHARE_TAG},mount_tag={SHARE_TAG},bus=pcie.0"]
    argv = ["qemu-system-x86_64", "-machine", "q35,accel=tcg", "-cpu", "max", "-smp", str(2 * len(NUMA)),
            "-m", "2G", "-nographic", "-no-user-config", "-nodefaults", "-serial", "stdio", *iommu,
            "-kernel", str(kernel), "-initrd", str(initrd), "-append", append, *disks, "-nic", "none"]
    for i, (mem, cpus) in enumerate(NUMA):
        first, _, last = cpus.partition("-")
        argv += ["-object", f"memory-backend-ram,id=m{i},size={mem}",
                 "-numa", f"node,nodeid={i},memdev=m{i},cpus={first}-{last or first}"]
    if device_node is not None:  # (intremap=off above: vfio-pci needs only DMA remapping for its groups)
        argv += ["-device", f"pxb-pcie,id=pxb{device_node},bus_nr=128,numa_node={device_node},bus=pcie.0",
                 "-device", f"pcie-root-port,id=rp{device_node},bus=pxb{device_node},chassis=1",
                 "-device", f"{DEVICE[0]},bus=rp{device_node}"]
    return argv


def tree_kernel(base: Path) -> tuple[Path, Path]:
    """The newest kernel installed in the base tree ``base`` and its initrd (a flavour with
    ``own_kernel``)."""
    boot_dir = base / "root" / "boot"
    for kernel in sorted(boot_dir.glob("vmlinuz-*"), reverse=True):
        initrd = boot_dir / f"initrd.img-{kernel.name.removeprefix('vmlinuz-')}"
        if initrd.is_file():
            return kernel, initrd
    raise RuntimeError(f"no kernel with its initrd in {boot_dir}")


def boot(image: Path, share: Path, timeout: float, console_log: Path,
         kernel: tuple[Path, Path] | None = None, device_node: int | None = None) -> float:
    """Boot until the guest powers itself off (reboots included); the wall time in seconds.
    ``kernel``: the kernel and initrd to boot (default: the host's); ``device_node``: see
    :func:`qemu_argv`. Raises TimeoutError (the guest is killed) past ``timeout``."""
    pair = kernel or kernel_pair()
    if pair is None:
        raise RuntimeError("no host kernel with an initrd")
    started = time.monotonic()
    with console_log.open("wb") as out:
        proc = subprocess.Popen(qemu_argv(*pair, image, share, device_node), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            raise TimeoutError(f"the guest ran past {timeout:g}s; console in {console_log}") from None
    return time.monotonic() - started
