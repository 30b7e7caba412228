"""Run a shell script inside a throw-away multi-NUMA guest kernel (virtme-ng + qemu).

The guest boots the host's Debian kernel with the host's root filesystem
exported read-only over 9p, so the project venv, runc, crun and busybox are
all usable inside. Its layout is fixed by :class:`GuestConfig`; the default is
4 CPUs and 2 GiB in two NUMA nodes (cpus 0-1 and 2-3, 1 GiB each). The guest
mounts cgroup v2 only, with the cpuset controller available.

Only ``shared_dir`` (``--rwdir``) is writable and visible on both sides, at the
same path. Guest ``/tmp`` is a private overlay and ``/run`` a private tmpfs:
keep runtime state (``runc --root``) and bundles on ``/run``.

:func:`run_in_guest` writes the script and a wrapper into
``<shared_dir>/.guest/``; the wrapper runs the script with stdout/stderr in
files and records its exit status, so the result does not depend on how the
serial console mixes output. The script sees these variables:

``NP_SHARED``  the shared directory (write result files here)
``NP_PY``      the project venv's python
``NP_REPO``    the repository root
``PYTHONPATH`` ``<repo>/tests/e2e`` so ``import harness`` works
``PATH``       the venv's bin first (``numa-pin``, ``numa-pin-hook``)

KVM is off by default: on this host /dev/kvm exists but qemu aborts with
"failed to set MSR 0x10a" (nested virtualisation), so the guest runs under TCG.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

#: the repository root (tests/vm/guest.py -> repo)
REPO = Path(__file__).resolve().parents[2]
#: the directory holding tests/e2e/harness.py, put on the guest's PYTHONPATH
HARNESS_DIR = REPO / "tests" / "e2e"
#: guest kernels, best first: the stock Debian 6.1 kernel is known to boot under vng
KERNEL_GLOBS = ("vmlinuz-6.1*", "vmlinuz-*")
#: environment variable that overrides the kernel choice
KERNEL_ENV = "NUMA_PIN_GUEST_KERNEL"
#: name of the control directory inside ``shared_dir``
CONTROL = ".guest"
#: seconds reserved for boot and shutdown out of the caller's timeout
BOOT_ALLOWANCE = 150


@dataclass(frozen=True)
class GuestNode:
    """One guest NUMA node: its memory size (qemu syntax, "1G") and cpu list ("0-1")."""

    memory: str
    cpus: str


#: the 2-node layout the e2e tests rely on
DEFAULT_NUMA = (GuestNode("1G", "0-1"), GuestNode("1G", "2-3"))


@dataclass(frozen=True)
class GuestConfig:
    """The guest machine: kernel (None = :func:`find_kernel`), cpus, memory, NUMA nodes, KVM."""

    kernel: Path | None = None
    cpus: int = 4
    memory: str = "2G"
    numa: Sequence[GuestNode] = DEFAULT_NUMA
    kvm: bool = False


@dataclass(frozen=True)
class GuestResult:
    """What came back from the guest.

    ``rc`` is the script's exit status; ``stdout`` / ``stderr`` its output;
    ``files`` every file the guest left under ``shared_dir`` (path relative
    to it, control files excluded); ``console`` what vng/qemu printed;
    ``elapsed_s`` the host wall time of the whole boot-run-poweroff.
    """

    rc: int
    stdout: str
    stderr: str
    files: Mapping[str, bytes] = field(default_factory=dict)
    console: str = ""
    elapsed_s: float = 0.0

    def text(self, name: str) -> str:
        """``files[name]`` decoded as UTF-8. Raises :class:`KeyError` when the guest did not write it."""
        return self.files[name].decode("utf-8", errors="replace")


class GuestError(RuntimeError):
    """The guest did not boot, did not run the script, or ran past its timeout.

    ``console`` holds the tail of what vng/qemu printed.
    """

    def __init__(self, message: str, console: str = "") -> None:
        self.console = console
        tail = console.strip()[-3000:]
        super().__init__(f"{message}\n--- console tail ---\n{tail}" if tail else message)


class GuestTimeout(GuestError):
    """The guest ran past its timeout (an emulated guest stalls now and then under load)."""


def run_in_guest_with_retry(make_shared: Callable[[], Path], script: str, timeout: float = 600) -> GuestResult:
    """:func:`run_in_guest` in a fresh shared directory from ``make_shared``; when the guest
    stalls past ``timeout`` (a TCG guest on a loaded host does, rarely), boot it once more.
    Any other failure, and a second stall, is raised."""
    try:
        return run_in_guest(script, make_shared(), timeout=timeout)
    except GuestTimeout as exc:
        print(f"guest stalled ({exc}); booting it once more", file=sys.stderr)
        return run_in_guest(script, make_shared(), timeout=timeout)


def find_kernel(boot: Path = Path("/boot")) -> Path | None:
    """The guest kernel: ``$NUMA_PIN_GUEST_KERNEL``, else the newest readable match of :data:`KERNEL_GLOBS`."""
    override = os.environ.get(KERNEL_ENV)
    if override:
        return Path(override)
    for pattern in KERNEL_GLOBS:
        found = sorted(p for p in boot.glob(pattern) if os.access(p, os.R_OK))
        if found:
            return found[-1]
    return None


def find_vng() -> Path | None:
    """The ``vng`` script of virtme-ng: next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).with_name("vng")
    if beside.is_file():
        return beside
    found = shutil.which("vng")
    return Path(found) if found else None


def unavailable_reason() -> str | None:
    """Why a guest cannot be booted here (a skip reason), or None when it can."""
    if find_vng() is None:
        return "virtme-ng is not installed (.venv/bin/pip install virtme-ng)"
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"
    if find_kernel() is None:
        return "no readable /boot/vmlinuz-* (apt-get install linux-image-amd64; reading it needs root)"
    return None


def vng_command(config: GuestConfig, shared_dir: Path, exec_cmd: str) -> list[str]:
    """The vng command line that boots ``config`` with ``shared_dir`` writable and runs ``exec_cmd``.

    Raises :class:`GuestError` when vng or a kernel cannot be found.
    """
    vng = find_vng()
    kernel = config.kernel or find_kernel()
    if vng is None or kernel is None:
        raise GuestError(unavailable_reason() or "vng or the guest kernel is missing")
    argv = [str(vng), "--run", str(kernel), "--cpus", str(config.cpus), "--memory", config.memory]
    if not config.kvm:
        argv.append("--disable-kvm")
    for node in config.numa:
        argv += ["--numa", f"{node.memory},cpus={node.cpus}"]
    argv += ["--rwdir", str(shared_dir), "--exec", exec_cmd]
    return argv


def _wrapper(control: Path, shared_dir: Path, inner_timeout: int) -> str:
    venv_bin = Path(sys.executable).parent
    q = shlex.quote
    return f"""#!/bin/sh
export NP_SHARED={q(str(shared_dir))}
export NP_PY={q(sys.executable)}
export NP_REPO={q(str(REPO))}
export PYTHONPATH={q(str(HARNESS_DIR))}
export PYTHONDONTWRITEBYTECODE=1
export PATH={q(str(venv_bin))}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
echo booted > {q(str(control / "booted"))}
cd "$NP_SHARED" || exit 90
timeout -k 5 {inner_timeout} sh {q(str(control / "script.sh"))} \\
    > {q(str(control / "stdout"))} 2> {q(str(control / "stderr"))} < /dev/null
echo $? > {q(str(control / "rc.tmp"))}
mv {q(str(control / "rc.tmp"))} {q(str(control / "rc"))}
sync
"""


def _collect(shared_dir: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for path in sorted(shared_dir.rglob("*")):
        rel = path.relative_to(shared_dir)
        if rel.parts[0] == CONTROL or not path.is_file():
            continue
        files[str(rel)] = path.read_bytes()
    return files


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def run_in_guest(
    script: str,
    shared_dir: Path,
    timeout: float = 600,
    *,
    config: GuestConfig | None = None,
) -> GuestResult:
    """Boot the guest, run ``script`` (POSIX sh) inside it, power off, and return the result.

    ``shared_dir`` must exist on the host; it is exported read-write at the
    same path. The script gets ``timeout - BOOT_ALLOWANCE`` seconds (at least
    30) inside the guest; the whole vng run gets ``timeout`` seconds, after
    which the vng/qemu process group is killed.

    Raises :class:`GuestError` when the guest does not boot, the script never
    finishes, or the host-side timeout expires. A script that fails is not
    an error: its status is ``GuestResult.rc``.
    """
    cfg = config or GuestConfig()
    shared = Path(shared_dir).resolve()
    if not shared.is_dir():
        raise GuestError(f"shared directory {shared} does not exist")
    control = shared / CONTROL
    shutil.rmtree(control, ignore_errors=True)
    control.mkdir()
    (control / "script.sh").write_text(script)
    inner = max(30, int(timeout) - BOOT_ALLOWANCE)
    wrapper = control / "run.sh"
    wrapper.write_text(_wrapper(control, shared, inner))
    wrapper.chmod(0o755)

    env = dict(os.environ)
    # vng runs virtme-run through PATH, so the venv's bin must be on it
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    argv = vng_command(cfg, shared, f"sh {shlex.quote(str(wrapper))}")
    started = time.monotonic()
    with tempfile.TemporaryFile() as console:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
            env=env, cwd=str(shared), start_new_session=True,
        )
        try:
            vng_rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            raise GuestTimeout(f"guest ran past {timeout:g}s and was killed", _tail(console)) from None
        elapsed = time.monotonic() - started
        console_text = _tail(console)

    rc_text = _read_text(control / "rc").strip()
    if not rc_text:
        booted = (control / "booted").exists()
        what = "the script did not finish" if booted else "the guest did not boot or could not run the wrapper"
        raise GuestError(f"{what} (vng exited {vng_rc}); argv: {shlex.join(argv)}", console_text)
    return GuestResult(
        rc=int(rc_text),
        stdout=_read_text(control / "stdout"),
        stderr=_read_text(control / "stderr"),
        files=_collect(shared),
        console=console_text,
        elapsed_s=elapsed,
    )


def _tail(handle: IO[bytes], limit: int = 65536) -> str:
    handle.flush()
    handle.seek(0)
    data = handle.read()
    return data[-limit:].decode("utf-8", errors="replace")
