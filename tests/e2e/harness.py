"""Drive real OCI runtimes (runc, crun, podman) with hooks, for end-to-end tests.

This module is importable on its own (stdlib only, no relative imports) so the
same helpers work on the host and inside the multi-NUMA guest of ``tests/vm``,
where ``PYTHONPATH`` points at this directory.

What is here:

* filesystem builders: :func:`make_rootfs` (busybox-static), :func:`make_bundle`
  (a runtime-spec ``config.json`` made from ``runc spec`` and edited),
  :func:`hook_entry`, :func:`write_hooks_d` (a containers ``hooks.d`` 1.0.0 file);
* runtimes: :class:`OciRuntime` (runc or crun: run / create / start / state /
  kill / delete / cleanup), the ``run_runc`` / ``runc_*`` and ``run_crun`` /
  ``crun_*`` shortcuts, :func:`running_container`, and podman through
  :class:`PodmanStore` / :func:`run_podman` / :func:`podman_cleanup`;
* the probe hook: :func:`write_probe_hook`, :func:`probe_entry`,
  :func:`read_probe_records` (a recording hook used to prove what runtimes do);
* observation: :func:`proc_cgroups`, :func:`read_cpuset`, :func:`proc_allowed`.

Every external command runs with a timeout in its own session; on expiry the
whole process group is killed and :class:`RuntimeTimeout` is raised, so a hung
runtime can never hang the test suite. Commands whose failure is the thing
under test (``run``, ``create``, ``run_podman``) return the
:class:`subprocess.CompletedProcess`; helpers that must succeed (``start``,
``state``, ``kill``, ``delete``) raise :class:`HarnessError` on failure.

Facts these helpers encode (see ``docs/design/e2e.md``): crun refuses cgroup v1
"hybrid" hosts that mount an (empty) cgroup2 hierarchy, so on such a host crun
(and podman --runtime crun) is run inside ``unshare -m`` after unmounting that
cgroup2 mount; podman needs ``--ulimit nofile=1024:1024 --ulimit nproc=1024:1024``
when the caller lacks CAP_SYS_RESOURCE, and all ``podman run`` options must come
before ``--rootfs DIR`` (everything after the rootfs is the command).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: where the busybox-static package installs the static binary
BUSYBOX = Path("/bin/busybox")
#: applets linked into every rootfs
APPLETS = ("sh", "cat", "sleep", "grep", "echo", "true", "ls")
#: directories created empty in every rootfs (mount points and scratch)
ROOTFS_DIRS = ("proc", "sys", "dev", "tmp")
#: runtime state lives on /run (a tmpfs inside the guest; never a shared 9p dir)
DEFAULT_STATE_DIR = Path("/run/numa-pin-e2e")
#: seconds any one runtime command may take
DEFAULT_TIMEOUT = 60.0
#: seconds a podman command may take (it does more work than a bare runtime)
PODMAN_TIMEOUT = 120.0
#: the runtime-spec POSIX hook stages, in the order a runtime runs them
HOOK_STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
#: podman flags needed on this kind of host (see docs/design/e2e.md for why each is there)
PODMAN_ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
#: key under which :func:`parse_proc_cgroup` stores the cgroup v2 ("0::") path
UNIFIED = "unified"
#: seconds to wait for a killed process group to be reaped
_REAP_TIMEOUT = 10.0


class HarnessError(RuntimeError):
    """A command the harness needed to succeed failed; the message carries argv, rc and stderr."""

    def __init__(self, message: str, result: subprocess.CompletedProcess[str] | None = None) -> None:
        self.result = result
        if result is not None:
            message = (
                f"{message}: {' '.join(map(str, result.args))} exited {result.returncode}; "
                f"stdout={result.stdout.strip()!r} stderr={result.stderr.strip()!r}"
            )
        super().__init__(message)


class RuntimeTimeout(HarnessError):
    """A command ran past its timeout; its whole process group was killed.

    ``stdout`` / ``stderr`` hold what it had written before it was killed.
    """

    def __init__(self, argv: Sequence[str], timeout: float, stdout: str, stderr: str) -> None:
        self.argv = list(argv)
        self.timeout = timeout
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(
            f"{' '.join(argv)} ran past {timeout:g}s and was killed; "
            f"stdout={stdout.strip()[-400:]!r} stderr={stderr.strip()[-400:]!r}"
        )


# --------------------------------------------------------------------------- processes


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the session/process group led by ``proc`` (started with ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def execute(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with stdin from /dev/null and stdout/stderr captured in temporary files.

    Files, not pipes: ``runc create`` / ``crun create`` hand their stdio to the
    container, which would keep a pipe open (and ``communicate`` waiting) for
    the container's whole life.

    Raises :class:`RuntimeTimeout` when ``timeout`` seconds pass (the process
    group is killed first) and :class:`FileNotFoundError` when the program
    does not exist.
    """
    args = [os.fspath(a) for a in argv]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_REAP_TIMEOUT)
            raise RuntimeTimeout(args, timeout, _read(out), _read(err)) from None
        return subprocess.CompletedProcess(args, rc, _read(out), _read(err))


def _read(handle: Any) -> str:
    handle.flush()
    handle.seek(0)
    data: bytes = handle.read()
    return data.decode("utf-8", errors="replace")


def _check(result: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    if result.returncode != 0:
        raise HarnessError(what, result)
    return result


def find_binary(name: str) -> str | None:
    """Absolute path of ``name`` on PATH (plus /usr/sbin and /sbin), or None."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
    return shutil.which(name, path=search)


def numa_pin_hook_path() -> Path | None:
    """The installed ``numa-pin-hook`` console script next to this interpreter, or on PATH; None if absent."""
    beside = Path(sys.executable).with_name("numa-pin-hook")
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = find_binary("numa-pin-hook")
    return Path(found) if found else None


def new_container_id(prefix: str = "np-e2e") -> str:
    """A container id unlikely to collide with anything else on the host."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------- rootfs / bundle


def make_rootfs(dir: str | os.PathLike[str], *, busybox: Path = BUSYBOX) -> Path:
    """Build a minimal root filesystem in ``dir`` and return it.

    It holds ``/bin/busybox`` (copied from the busybox-static package), one
    symlink per applet in :data:`APPLETS`, and the empty directories
    :data:`ROOTFS_DIRS`. Calling it again on the same directory is harmless.

    Raises :class:`HarnessError` when ``busybox`` does not exist.
    """
    if not busybox.is_file():
        raise HarnessError(f"{busybox} not found: install the busybox-static package")
    root = Path(dir)
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    target = bindir / "busybox"
    if not target.exists():
        shutil.copy2(busybox, target)
    for applet in APPLETS:
        link = bindir / applet
        if not link.is_symlink() and not link.exists():
            link.symlink_to("busybox")
    for name in ROOTFS_DIRS:
        (root / name).mkdir(exist_ok=True)
    return root


@functools.lru_cache(maxsize=1)
def _base_spec_text() -> str:
    """The JSON text of ``runc spec`` (or ``crun spec``) in a scratch directory."""
    for tool in ("runc", "crun"):
        binary = find_binary(tool)
        if binary is None:
            continue
        with tempfile.TemporaryDirectory(prefix="np-spec-") as scratch:
            _check(execute([binary, "spec"], cwd=scratch, timeout=DEFAULT_TIMEOUT), f"{tool} spec")
            return (Path(scratch) / "config.json").read_text()
    raise HarnessError("neither runc nor crun is installed: cannot generate a base config.json")


def base_spec() -> dict[str, Any]:
    """A fresh (mutable) copy of the runtime's default root ``config.json``.

    Raises :class:`HarnessError` when neither runc nor crun is installed.
    """
    spec: dict[str, Any] = json.loads(_base_spec_text())
    return spec


def hook_entry(
    path: str | os.PathLike[str],
    args: Sequence[str] | None = None,
    env: Sequence[str] | None = None,
    timeout: int | None = None,
) -> dict[str, Any]:
    """One runtime-spec hook object ``{"path", "args", "env", "timeout"}``.

    ``args`` is the full argv including argv[0] (defaults to ``[path]``);
    ``env`` and ``timeout`` are left out when None (the runtime then passes
    its own environment / no timeout).

    Raises :class:`ValueError` when ``path`` is relative or ``timeout`` is not positive.
    """
    text = os.fspath(path)
    if not os.path.isabs(text):
        raise ValueError(f"hook path must be absolute: {text!r}")
    entry: dict[str, Any] = {"path": text, "args": list(args) if args is not None else [text]}
    if env is not None:
        entry["env"] = list(env)
    if timeout is not None:
        if timeout <= 0:
            raise ValueError(f"hook timeout must be > 0 seconds, got {timeout}")
        entry["timeout"] = timeout
    return entry


def make_bundle(
    dir: str | os.PathLike[str],
    *,
    args: Sequence[str],
    annotations: Mapping[str, str] | None = None,
    hooks: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    env: Sequence[str] = (),
    cgroups_path: str | None = None,
    resources: Mapping[str, Any] | None = None,
    rootfs: str | os.PathLike[str] | None = None,
    hostname: str = "numa-pin-e2e",
) -> Path:
    """Write an OCI bundle (``config.json`` and, unless given, ``rootfs/``) into ``dir``.

    The base is the runtime's own ``runc spec`` output (root user, default
    namespaces, devices, masked paths kept), then edited: ``terminal`` false,
    ``process.args`` = ``args``, ``env`` appended to the default PATH/TERM,
    ``annotations``, ``hooks`` (stage -> list of :func:`hook_entry` dicts),
    ``linux.cgroupsPath``, and ``resources`` merged key by key into
    ``linux.resources`` (e.g. ``{"cpu": {"cpus": "0", "mems": "0"}}``).

    ``rootfs=None`` builds a busybox rootfs at ``<dir>/rootfs`` and sets the
    relative ``root.path`` ``"rootfs"``; a given rootfs is referenced by its
    absolute path (the root stays read-only, so one rootfs can serve many bundles).

    Raises :class:`ValueError` for an unknown hook stage and :class:`HarnessError`
    when no runtime can generate the base spec or busybox is missing.
    """
    bundle = Path(dir)
    bundle.mkdir(parents=True, exist_ok=True)
    spec = base_spec()
    process = spec["process"]
    process["terminal"] = False
    process["args"] = list(args)
    process["env"] = list(process.get("env", [])) + list(env)
    spec["hostname"] = hostname
    if rootfs is None:
        make_rootfs(bundle / "rootfs")
        spec["root"]["path"] = "rootfs"
    else:
        given = Path(rootfs).resolve()
        spec["root"]["path"] = "rootfs" if given == (bundle / "rootfs").resolve() else str(given)
    if annotations:
        spec["annotations"] = dict(annotations)
    if hooks:
        unknown = sorted(set(hooks) - set(HOOK_STAGES))
        if unknown:
            raise ValueError(f"unknown hook stage(s) {unknown}; known: {list(HOOK_STAGES)}")
        spec["hooks"] = {stage: [dict(h) for h in entries] for stage, entries in hooks.items()}
    linux = spec.setdefault("linux", {})
    if cgroups_path is not None:
        linux["cgroupsPath"] = cgroups_path
    if resources:
        merged = linux.setdefault("resources", {})
        for key, value in resources.items():
            merged[key] = value
    (bundle / "config.json").write_text(json.dumps(spec, indent=2) + "\n")
    return bundle


def write_hooks_d(
    dir: str | os.PathLike[str],
    name: str,
    *,
    hook: Mapping[str, Any],
    stages: Sequence[str],
    when: Mapping[str, Any] | None = None,
) -> Path:
    """Write a containers ``hooks.d`` 1.0.0 file ``<dir>/<name>.json`` and return its path.

    ``when`` defaults to ``{"always": True}``; annotation regexes are Go RE2 and
    unanchored, so anchor them (``{"annotations": {"^key$": "^value$"}}``).
    Files are applied in lower-cased name order.
    """
    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "version": "1.0.0",
        "hook": dict(hook),
        "when": dict(when) if when is not None else {"always": True},
        "stages": list(stages),
    }
    path = folder / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


# --------------------------------------------------------------------------- cgroup facts


def hybrid_cgroup2_mount(mountinfo: Path = Path("/proc/self/mountinfo")) -> Path | None:
    """The cgroup2 mount point of a cgroup v1 "hybrid" host (``/sys/fs/cgroup/unified``), else None.

    None on a pure v1 host (no cgroup2 mount) and on a pure v2 host (no v1
    hierarchy): crun needs the workaround only when both kinds are mounted.
    """
    v1 = False
    v2: Path | None = None
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split(" ", 1)[0]
        point = left.split(" ")[4]
        if fstype == "cgroup":
            v1 = True
        elif fstype == "cgroup2":
            v2 = Path(point.replace("\\040", " "))
    return v2 if v1 and v2 is not None else None


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map each controller in a ``/proc/<pid>/cgroup`` text to its path.

    ``"3:cpuset:/t1"`` gives ``{"cpuset": "/t1"}``; ``"2:cpu,cpuacct:/x"``
    gives both keys; the v2 line ``"0::/t1"`` is stored under :data:`UNIFIED`.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out[UNIFIED] = path
            continue
        for name in controllers.split(","):
            out[name] = path
    return out


def proc_cgroups(pid: int, *, proc_root: Path = Path("/proc")) -> dict[str, str]:
    """:func:`parse_proc_cgroup` of ``<proc_root>/<pid>/cgroup``.

    Raises :class:`FileNotFoundError` / :class:`ProcessLookupError`-like
    ``OSError`` when the process is gone.
    """
    return parse_proc_cgroup((proc_root / str(pid) / "cgroup").read_text())


@dataclass(frozen=True)
class CgroupCpuset:
    """The cpuset a process's cgroup grants, as read from cgroupfs."""

    dir: Path
    version: int  # 1 or 2
    cpus: str
    mems: str
    effective_cpus: str
    effective_mems: str


def read_cpuset(pid: int, *, cgroup_root: Path = Path("/sys/fs/cgroup"), proc_root: Path = Path("/proc")) -> CgroupCpuset:
    """Read cpuset.{cpus,mems} (and their effective values) of the cgroup ``pid`` is in.

    On a v1 or hybrid host the cpuset controller's v1 hierarchy
    (``<cgroup_root>/cpuset/<path>``) is used; otherwise the v2 path
    (``<cgroup_root>/<path>``) from the ``0::`` line.

    Raises :class:`OSError` when the process or the cgroup files are gone.
    """
    groups = proc_cgroups(pid, proc_root=proc_root)
    if "cpuset" in groups:
        folder = cgroup_root / "cpuset" / groups["cpuset"].lstrip("/")
        return CgroupCpuset(
            dir=folder,
            version=1,
            cpus=_strip(folder / "cpuset.cpus"),
            mems=_strip(folder / "cpuset.mems"),
            effective_cpus=_strip(folder / "cpuset.effective_cpus"),
            effective_mems=_strip(folder / "cpuset.effective_mems"),
        )
    folder = cgroup_root / groups.get(UNIFIED, "/").lstrip("/")
    return CgroupCpuset(
        dir=folder,
        version=2,
        cpus=_strip(folder / "cpuset.cpus"),
        mems=_strip(folder / "cpuset.mems"),
        effective_cpus=_strip(folder / "cpuset.cpus.effective"),
        effective_mems=_strip(folder / "cpuset.mems.effective"),
    )


def _strip(path: Path) -> str:
    return path.read_text().strip()


def proc_allowed(pid: int, *, proc_root: Path = Path("/proc")) -> tuple[str, str]:
    """``(Cpus_allowed_list, Mems_allowed_list)`` from ``<proc_root>/<pid>/status``.

    Raises :class:`OSError` when the process is gone and :class:`HarnessError`
    when a field is missing.
    """
    fields: dict[str, str] = {}
    for line in (proc_root / str(pid) / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    try:
        return fields["Cpus_allowed_list"], fields["Mems_allowed_list"]
    except KeyError as exc:
        raise HarnessError(f"{proc_root}/{pid}/status has no {exc.args[0]}") from None


# --------------------------------------------------------------------------- runc / crun


@dataclass(frozen=True)
class OciRuntime:
    """One low-level OCI runtime (``runc`` or ``crun``) with its own ``--root`` state dir.

    ``unified_mount`` set means "run every command inside ``unshare -m`` after
    unmounting this cgroup2 mount": crun 1.8 refuses to work on a hybrid host
    ("cgroups in hybrid mode not supported, drop all controllers from
    cgroupv2"). The unmount happens in a private mount namespace only.
    """

    name: str
    binary: str
    root: Path
    unified_mount: Path | None = None

    def argv(self, *args: str | os.PathLike[str]) -> list[str]:
        """The full command line for ``<runtime> --root <root> <args...>``."""
        base = [self.binary, "--root", str(self.root), *(os.fspath(a) for a in args)]
        if self.unified_mount is None:
            return base
        return ["unshare", "-m", "sh", "-c", 'umount "$1" && shift && exec "$@"', "sh", str(self.unified_mount), *base]

    def _exec(self, *args: str | os.PathLike[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return execute(self.argv(*args), timeout=timeout)

    def run(
        self, bundle: str | os.PathLike[str], cid: str, *, timeout: float = DEFAULT_TIMEOUT, detach: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``<runtime> run [--detach] --bundle <bundle> <cid>``; the result is returned, never checked.

        Raises :class:`RuntimeTimeout` past ``timeout`` seconds.
        """
        extra = ["--detach"] if detach else []
        return self._exec("run", *extra, "--bundle", os.fspath(bundle), cid, timeout=timeout)

    def create(
        self, bundle: str | os.PathLike[str], cid: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """``<runtime> create --bundle <bundle> <cid>`` (prestart/createRuntime hooks run here); not checked.

        Raises :class:`RuntimeTimeout` past ``timeout`` seconds.
        """
        return self._exec("create", "--bundle", os.fspath(bundle), cid, timeout=timeout)

    def start(self, cid: str, *, timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """``<runtime> start <cid>``. Raises :class:`HarnessError` when it fails."""
        return _check(self._exec("start", cid, timeout=timeout), f"{self.name} start {cid}")

    def state(self, cid: str, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """The parsed ``<runtime> state <cid>`` JSON (``pid``, ``status``, ``bundle``...).

        Raises :class:`HarnessError` when the container does not exist.
        """
        result = _check(self._exec("state", cid, timeout=timeout), f"{self.name} state {cid}")
        state: dict[str, Any] = json.loads(result.stdout)
        return state

    def kill(self, cid: str, sig: str = "KILL", *, timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """``<runtime> kill <cid> <sig>``. Raises :class:`HarnessError` when it fails."""
        return _check(self._exec("kill", cid, sig, timeout=timeout), f"{self.name} kill {cid} {sig}")

    def delete(self, cid: str, *, force: bool = True, timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """``<runtime> delete [--force] <cid>`` (poststop hooks run here). Raises :class:`HarnessError` on failure."""
        extra = ["--force"] if force else []
        return _check(self._exec("delete", *extra, cid, timeout=timeout), f"{self.name} delete {cid}")

    def list_ids(self, *, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
        """Ids of the containers under this runtime's ``--root`` (empty when the root does not exist)."""
        if not self.root.exists():
            return []
        result = _check(execute([self.binary, "--root", str(self.root), "list", "-q"], timeout=timeout), f"{self.name} list")
        return [line.strip() for line in result.stdout.splitlines() if line.strip()]

    def cleanup(self, *, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
        """Force-delete every container left under ``root``; return their ids.

        Best effort: failures of individual deletes are tolerated (the
        container may have gone on its own), timeouts still raise.
        """
        left = self.list_ids(timeout=timeout)
        for cid in left:
            self._exec("delete", "--force", cid, timeout=timeout)
        return left


def runtime(name: str, root: str | os.PathLike[str] | None = None) -> OciRuntime:
    """An :class:`OciRuntime` for ``"runc"`` or ``"crun"`` with state under ``root``.

    ``root`` defaults to ``/run/numa-pin-e2e/<name>``. For crun on a hybrid
    host the unshare/umount workaround is switched on.

    Raises :class:`HarnessError` when the binary is not installed and
    :class:`ValueError` for another name.
    """
    if name not in ("runc", "crun"):
        raise ValueError(f"unknown OCI runtime {name!r}; expected 'runc' or 'crun'")
    binary = find_binary(name)
    if binary is None:
        raise HarnessError(f"{name} is not installed")
    state_root = Path(root) if root is not None else DEFAULT_STATE_DIR / name
    unified = hybrid_cgroup2_mount() if name == "crun" else None
    return OciRuntime(name=name, binary=binary, root=state_root, unified_mount=unified)


@contextlib.contextmanager
def running_container(
    rt: OciRuntime, bundle: str | os.PathLike[str], cid: str, *, timeout: float = DEFAULT_TIMEOUT
) -> Iterator[dict[str, Any]]:
    """create + start ``cid``; yield its state (``pid``...); always force-delete it on exit.

    Use a long-running ``args`` (``["sleep", "1000"]``) in the bundle.
    Raises :class:`HarnessError` when create or start fails.
    """
    try:
        _check(rt.create(bundle, cid, timeout=timeout), f"{rt.name} create {cid}")
        rt.start(cid, timeout=timeout)
        yield rt.state(cid, timeout=timeout)
    finally:
        if cid in rt.list_ids(timeout=timeout):
            rt._exec("delete", "--force", cid, timeout=timeout)


def run_runc(
    bundle: str | os.PathLike[str], cid: str, *, root: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT, detach: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``runc --root <root> run [--detach] --bundle <bundle> <cid>``; see :meth:`OciRuntime.run`."""
    return runtime("runc", root).run(bundle, cid, timeout=timeout, detach=detach)


def runc_create(
    bundle: str | os.PathLike[str], cid: str, *, root: str | os.PathLike[str] | None = None, timeout: float = DEFAULT_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``runc create``; see :meth:`OciRuntime.create`."""
    return runtime("runc", root).create(bundle, cid, timeout=timeout)


def runc_start(cid: str, *, root: str | os.PathLike[str] | None = None, timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``runc start``; see :meth:`OciRuntime.start`."""
    return runtime("runc", root).start(cid, timeout=timeout)


def runc_state(cid: str, *, root: str | os.PathLike[str] | None = None, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """``runc state``; see :meth:`OciRuntime.state`."""
    return runtime("runc", root).state(cid, timeout=timeout)


def runc_kill(
    cid: str, sig: str = "KILL", *, root: str | os.PathLike[str] | None = None, timeout: float = DEFAULT_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``runc kill``; see :meth:`OciRuntime.kill`."""
    return runtime("runc", root).kill(cid, sig, timeout=timeout)


def runc_delete(
    cid: str, *, root: str | os.PathLike[str] | None = None, force: bool = True, timeout: float = DEFAULT_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``runc delete``; see :meth:`OciRuntime.delete`."""
    return runtime("runc", root).delete(cid, force=force, timeout=timeout)


def run_crun(
    bundle: str | os.PathLike[str], cid: str, *, root: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT, detach: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``crun --root <root> run ...``, inside ``unshare -m`` + umount on a hybrid host; see :meth:`OciRuntime.run`."""
    return runtime("crun", root).run(bundle, cid, timeout=timeout, detach=detach)


def crun_create(
    bundle: str | os.PathLike[str], cid: str, *, root: str | os.PathLike[str] | None = None, timeout: float = DEFAULT_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``crun create``; see :meth:`OciRuntime.create`."""
    return runtime("crun", root).create(bundle, cid, timeout=timeout)


def crun_start(cid: str, *, root: str | os.PathLike[str] | None = None, timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``crun start``; see :meth:`OciRuntime.start`."""
    return runtime("crun", root).start(cid, timeout=timeout)


def crun_state(cid: str, *, root: str | os.PathLike[str] | None = None, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """``crun state``; see :meth:`OciRuntime.state`."""
    return runtime("crun", root).state(cid, timeout=timeout)


def crun_kill(
    cid: str, sig: str = "KILL", *, root: str | os.PathLike[str] | None = None, timeout: float = DEFAULT_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``crun kill``; see :meth:`OciRuntime.kill`."""
    return runtime("crun", root).kill(cid, sig, timeout=timeout)


def crun_delete(
    cid: str, *, root: str | os.PathLike[str] | None = None, force: bool = True, timeout: float = DEFAULT_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``crun delete``; see :meth:`OciRuntime.delete`."""
    return runtime("crun", root).delete(cid, force=force, timeout=timeout)


# --------------------------------------------------------------------------- podman


@dataclass(frozen=True)
class PodmanStore:
    """An isolated podman state: its own ``--root`` / ``--runroot`` / ``--tmpdir`` and a low-level runtime.

    ``runtime`` is ``"runc"`` or ``"crun"``; with crun on a hybrid host every
    podman command is wrapped like :class:`OciRuntime` does (podman calls crun
    from inside the same mount namespace).
    """

    root: Path
    runroot: Path
    tmpdir: Path
    runtime: str = "runc"

    def global_args(self, hooks_dirs: Sequence[str | os.PathLike[str]] = ()) -> list[str]:
        """podman's global flags for this store (every one is explained in docs/design/e2e.md)."""
        binary = find_binary(self.runtime) or self.runtime
        args = [
            "--root", str(self.root),
            "--runroot", str(self.runroot),
            "--tmpdir", str(self.tmpdir),
            "--storage-driver", "vfs",
            "--cgroup-manager", "cgroupfs",
            "--events-backend", "file",
            "--runtime", binary,
        ]
        for folder in hooks_dirs:
            args += ["--hooks-dir", os.fspath(folder)]
        return args

    def argv(self, *args: str, hooks_dirs: Sequence[str | os.PathLike[str]] = ()) -> list[str]:
        """``podman <global flags> <args...>``, wrapped in unshare/umount for crun on a hybrid host.

        Raises :class:`HarnessError` when podman is not installed.
        """
        podman = find_binary("podman")
        if podman is None:
            raise HarnessError("podman is not installed")
        base = [podman, *self.global_args(hooks_dirs), *args]
        unified = hybrid_cgroup2_mount() if self.runtime == "crun" else None
        if unified is None:
            return base
        return ["unshare", "-m", "sh", "-c", 'umount "$1" && shift && exec "$@"', "sh", str(unified), *base]


def podman_store(base: str | os.PathLike[str] | None = None, *, runtime: str = "runc") -> PodmanStore:
    """A :class:`PodmanStore` under ``base`` (default ``/run/numa-pin-e2e/podman``)."""
    folder = Path(base) if base is not None else DEFAULT_STATE_DIR / "podman"
    return PodmanStore(root=folder / "root", runroot=folder / "runroot", tmpdir=folder / "tmp", runtime=runtime)


def run_podman(
    rootfs: str | os.PathLike[str],
    *,
    args: Sequence[str],
    store: PodmanStore | None = None,
    annotations: Mapping[str, str] | None = None,
    hooks_dir: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    name: str | None = None,
    extra: Sequence[str] = (),
    remove: bool = True,
    timeout: float = PODMAN_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``podman run`` of ``args`` on an exploded ``rootfs`` (no image pull); the result is not checked.

    Adds ``--network none``, :data:`PODMAN_ULIMITS`, ``--annotation k=v`` per
    annotation, ``--name``, ``extra``, ``--rm`` (unless ``remove`` is false)
    and one ``--hooks-dir`` per directory. ``--rootfs DIR`` goes last because
    podman stops parsing options at the first positional argument. ``env`` is podman's whole
    environment (None: this process's).

    Raises :class:`RuntimeTimeout` past ``timeout`` seconds.
    """
    st = store if store is not None else podman_store()
    if hooks_dir is None:
        dirs: list[str | os.PathLike[str]] = []
    elif isinstance(hooks_dir, (str, os.PathLike)):
        dirs = [hooks_dir]
    else:
        dirs = list(hooks_dir)
    run_args = ["run", "--network", "none", *PODMAN_ULIMITS]
    if remove:
        run_args.append("--rm")
    if name is not None:
        run_args += ["--name", name]
    for key, value in (annotations or {}).items():
        run_args += ["--annotation", f"{key}={value}"]
    run_args += [*extra, "--rootfs", os.fspath(rootfs), *args]
    return execute(st.argv(*run_args, hooks_dirs=dirs), timeout=timeout, env=env)


def podman_cleanup(store: PodmanStore, *, timeout: float = PODMAN_TIMEOUT, remove_dirs: bool = True) -> None:
    """``podman rm --all --force`` in ``store``, then delete its directories.

    Best effort (a store that was never used is fine); timeouts still raise.
    """
    if store.root.exists():
        execute(store.argv("rm", "--all", "--force"), timeout=timeout)
    if remove_dirs:
        for folder in (store.root, store.runroot, store.tmpdir):
            shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- the probe hook

_PROBE_SOURCE = '''\
"""numa-pin e2e probe hook: record what the runtime handed us, optionally fail.

usage: probe --out FILE --label LABEL [--fail MESSAGE] [--exit N] [--sleep SECONDS]
Appends one JSON line to FILE. With --fail it prints MESSAGE on stderr and exits N (3).
"""
import json, os, sys, time


def read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def main(argv):
    opts = {"--out": None, "--label": "", "--fail": None, "--exit": "3", "--sleep": "0"}
    rest = argv[1:]
    while rest:
        key = rest.pop(0)
        opts[key] = rest.pop(0)
    raw = sys.stdin.read()
    try:
        state = json.loads(raw)
    except ValueError:
        state = None
    pid = state.get("pid") if isinstance(state, dict) else None
    status = read("/proc/%d/status" % pid) if pid else None
    allowed = {}
    for line in (status or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("Cpus_allowed_list", "Mems_allowed_list"):
            allowed[key] = value.strip()
    record = {
        "label": opts["--label"],
        "argv": argv,
        "state_raw": raw,
        "state": state,
        "pid": pid,
        "pid_cgroup": read("/proc/%d/cgroup" % pid) if pid else None,
        "self_cgroup": read("/proc/self/cgroup"),
        "cwd": os.getcwd(),
        "uid": os.getuid(),
        "env": dict(os.environ),
        "cpus_allowed": allowed.get("Cpus_allowed_list"),
        "mems_allowed": allowed.get("Mems_allowed_list"),
    }
    fd = os.open(opts["--out"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\\n").encode())
    finally:
        os.close(fd)
    time.sleep(float(opts["--sleep"]))
    if opts["--fail"] is not None:
        sys.stdout.write("probe-stdout:%s\\n" % opts["--label"])
        sys.stderr.write(opts["--fail"] + "\\n")
        return int(opts["--exit"])
    return 0


sys.exit(main(sys.argv))
'''


def write_probe_hook(dir: str | os.PathLike[str], *, python: str = sys.executable) -> Path:
    """Write the executable probe hook ``<dir>/numa-pin-probe`` and return its path.

    The probe appends one JSON line per call (see :class:`ProbeRecord`) and
    optionally fails; its interpreter is ``python`` run with ``-IS`` (stdlib
    only, no site), so it also works inside the guest.
    """
    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "numa-pin-probe"
    path.write_text(f"#!{python} -IS\n{_PROBE_SOURCE}")
    path.chmod(0o755)
    return path


def probe_entry(
    probe: str | os.PathLike[str],
    out: str | os.PathLike[str],
    label: str,
    *,
    fail: str | None = None,
    exit_code: int = 3,
    sleep: float = 0.0,
    env: Sequence[str] | None = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",),
    timeout: int | None = None,
) -> dict[str, Any]:
    """A :func:`hook_entry` that runs the probe with argv[0] ``numa-pin-probe``.

    ``fail`` makes it print that message on stderr and exit ``exit_code``;
    ``sleep`` makes it linger (to exercise hook timeouts). ``env=None`` leaves
    the hook's environment to the runtime.
    """
    args = ["numa-pin-probe", "--out", os.fspath(out), "--label", label]
    if fail is not None:
        args += ["--fail", fail, "--exit", str(exit_code)]
    if sleep:
        args += ["--sleep", str(sleep)]
    return hook_entry(probe, args, env=list(env) if env is not None else None, timeout=timeout)


@dataclass(frozen=True)
class ProbeRecord:
    """One probe-hook call, as recorded in its output file."""

    label: str
    argv: tuple[str, ...]
    state: Mapping[str, Any] | None
    state_raw: str
    pid: int | None
    pid_cgroup: Mapping[str, str] | None
    self_cgroup: Mapping[str, str]
    cwd: str
    env: Mapping[str, str] = field(default_factory=dict)
    cpus_allowed: str | None = None
    mems_allowed: str | None = None


def read_probe_records(out: str | os.PathLike[str]) -> list[ProbeRecord]:
    """Every call recorded in the probe output file ``out``, in call order ([] when absent)."""
    path = Path(out)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        doc = json.loads(line)
        records.append(
            ProbeRecord(
                label=doc["label"],
                argv=tuple(doc["argv"]),
                state=doc["state"],
                state_raw=doc["state_raw"],
                pid=doc["pid"],
                pid_cgroup=parse_proc_cgroup(doc["pid_cgroup"]) if doc["pid_cgroup"] else None,
                self_cgroup=parse_proc_cgroup(doc["self_cgroup"] or ""),
                cwd=doc["cwd"],
                env=doc["env"],
                cpus_allowed=doc["cpus_allowed"],
                mems_allowed=doc["mems_allowed"],
            )
        )
    return records


def records_by_label(records: Sequence[ProbeRecord]) -> dict[str, list[ProbeRecord]]:
    """Group probe records by label, keeping call order inside each group."""
    grouped: dict[str, list[ProbeRecord]] = {}
    for record in records:
        grouped.setdefault(record.label, []).append(record)
    return grouped


# ---- a GPU stand-in (no GPU on the test machines) ----------------------------------------------

#: what a container runs to report on the stand-in GPU: its node, the GPU list numa-pin wrote, and
#: whether it may open the device (``OPENED``/``DENIED``)
GPU_PROBE = ("ls -l /dev/nvidia0; cat /run/numa-pin/gpus /dev/numa-pin/gpus 2>/dev/null; "
             "if [ -c /dev/nvidia0 ] && dd if=/dev/null of=/dev/nvidia0 count=0 conv=notrunc 2>/dev/null; "
             "then echo OPENED; else echo DENIED; fi")

_GPU_STAND_IN_HOOK = r'''#!{python}
import json, os, sys
from numa_pin.enforcer.devnodes import DeviceNode, create_device_nodes
from numa_pin.enforcer.gpu import DeviceRule, allow_device_rules
from numa_pin.enforcer.mounts import detect_layout
from numa_pin.enforcer.undo import UndoLog

mode = sys.argv[1]
state = json.load(sys.stdin)
with open(os.path.join(state["bundle"], "config.json")) as fp:
    root = json.load(fp)["root"]["path"]
rootfs = os.path.join(state["bundle"], root)
undo = UndoLog()
if mode == "full":
    allow_device_rules((DeviceRule("c", 1, 11),), state["pid"], "/proc", "/sys/fs/cgroup",
                       detect_layout("/proc"), undo)
create_device_nodes(state["pid"], [DeviceNode("/dev/nvidia0", 1, 11)], "/proc", rootfs, undo,
                    gpu_text="GPU-stand-in 0\n")
'''


def write_gpu_stand_in_hook(path: Path, python: str = sys.executable) -> Path:
    """An executable prestart hook at ``path`` that grants a stand-in GPU as ``NodeService`` grants
    a real one, through the same two enforcer calls: ``/dev/nvidia0`` with ``/dev/kmsg``'s numbers
    (1:11, which runc's default rules do not allow and any process may open write-only) made in
    the container's mount namespace, and, with the argument ``full``, the device access for it
    (``devices.allow`` on cgroup v1, the device programs' prologue on v2)."""
    path.write_text(_GPU_STAND_IN_HOOK.replace("{python}", python))
    path.chmod(0o755)
    return path
