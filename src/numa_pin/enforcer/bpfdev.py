"""cgroup v2 device access through the kernel's BPF device programs, via libbpf (the I/O edge).

cgroup v2 has no ``devices.allow``: the runtime (runc, crun) or systemd attaches
``BPF_PROG_TYPE_CGROUP_DEVICE`` programs to the container's cgroup, and an access is allowed
only when *every* program attached there returns 1. So attaching one more "allow" program does
nothing; each attached program must be replaced by one that also allows the device.
:func:`add_rules` does that for one cgroup directory, for each attached program:

1. ``BPF_PROG_QUERY`` (``bpf_prog_query``) lists the programs attached to the directory;
2. ``bpf_prog_get_fd_by_id`` + ``bpf_obj_get_info_by_fd`` read each one's instructions as the
   kernel keeps them ("xlated");
3. :func:`numa_pin.devices.devfilter.with_rules` (pure) builds the same program with numa-pin's
   allow-prologue in front (the original instructions follow unchanged);
4. ``bpf_prog_load`` loads it (a verifier refusal comes back with the verifier's last line), and
   ``bpf_prog_attach_opts`` with ``BPF_F_ALLOW_MULTI | BPF_F_REPLACE`` swaps it for the original
   in one step, so there is no moment with neither or both programs attached.

:func:`remove_rules` is the same walk with the rules taken out again, ending in the original
instructions: it needs no saved state (the prologue is recognisable), so a release from another
process, long after the grant, can undo it. A program that carries no numa-pin rules is left
alone; a directory without device programs restricts nothing and is left alone too.

libbpf (Debian ``libbpf1``) is used through ``ctypes`` instead of raw ``bpf(2)`` calls: it owns
the ``union bpf_attr`` layouts, retries and the memlock handling across kernel versions, and its
``*_opts`` structures carry their own size, so the few structures declared here are checked by
libbpf against the version it was built with. This module is imported only when a GPU is granted
on cgroup v2 (never on the hook's path otherwise).
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from numa_pin.base.record import record
from numa_pin.devices.devfilter import DeviceRule, carried_rules, with_rules
from numa_pin.errors import EnforcementError

LIBBPF = "libbpf.so.1"
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 1 << 1
BPF_F_REPLACE = 1 << 2
#: at most 64 programs can be attached to one cgroup for one attach point
MAX_PROGRAMS = 64
VERIFIER_LOG_SIZE = 1 << 20


class _ProgInfo(ctypes.Structure):
    """The head of ``struct bpf_prog_info`` (the kernel accepts a shorter one)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", ctypes.c_uint32),
        ("xlated_prog_len", ctypes.c_uint32),
        ("jited_prog_insns", ctypes.c_uint64),
        ("xlated_prog_insns", ctypes.c_uint64),
        ("load_time", ctypes.c_uint64),
        ("created_by_uid", ctypes.c_uint32),
        ("nr_map_ids", ctypes.c_uint32),
        ("map_ids", ctypes.c_uint64),
        ("name", ctypes.c_char * 16),
        ("ifindex", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),  # bit 0: gpl_compatible
    ]


class _LoadOpts(ctypes.Structure):
    """``struct bpf_prog_load_opts`` of libbpf 1.1 (through ``log_buf``)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("attempts", ctypes.c_int),
        ("expected_attach_type", ctypes.c_uint32),
        ("prog_btf_fd", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_ifindex", ctypes.c_uint32),
        ("kern_version", ctypes.c_uint32),
        ("attach_btf_id", ctypes.c_uint32),
        ("attach_prog_fd", ctypes.c_uint32),
        ("attach_btf_obj_fd", ctypes.c_uint32),
        ("fd_array", ctypes.c_void_p),
        ("func_info", ctypes.c_void_p),
        ("func_info_cnt", ctypes.c_uint32),
        ("func_info_rec_size", ctypes.c_uint32),
        ("line_info", ctypes.c_void_p),
        ("line_info_cnt", ctypes.c_uint32),
        ("line_info_rec_size", ctypes.c_uint32),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_char_p),
    ]


class _AttachOpts(ctypes.Structure):
    """``struct bpf_prog_attach_opts`` of libbpf 1.1."""

    _fields_ = [("sz", ctypes.c_size_t), ("flags", ctypes.c_uint), ("replace_prog_fd", ctypes.c_int)]


@record
class Program:
    """One device program as read back from the kernel."""

    id: int
    name: str
    gpl: bool
    insns: bytes


class Libbpf:
    """The few libbpf calls numa-pin makes, each raising OSError(errno) on failure."""

    def __init__(self, name: str = LIBBPF) -> None:
        lib = ctypes.CDLL(name, use_errno=True)
        u32p = ctypes.POINTER(ctypes.c_uint32)
        lib.bpf_prog_query.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint32, u32p, u32p, u32p]
        lib.bpf_prog_get_fd_by_id.argtypes = [ctypes.c_uint32]
        lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, u32p]
        lib.bpf_prog_load.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_size_t, ctypes.POINTER(_LoadOpts)]
        lib.bpf_prog_attach_opts.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                             ctypes.POINTER(_AttachOpts)]
        for fn in ("bpf_prog_query", "bpf_prog_get_fd_by_id", "bpf_obj_get_info_by_fd", "bpf_prog_load",
                   "bpf_prog_attach_opts"):
            getattr(lib, fn).restype = ctypes.c_int
        self._lib = lib

    @staticmethod
    def _check(rc: int, what: str) -> int:
        if rc < 0:  # libbpf 1.x returns -errno (and sets errno)
            err = -rc if rc != -1 else (ctypes.get_errno() or errno_mod.EIO)
            raise OSError(err, f"{what}: {os.strerror(err)}")
        return rc

    def query(self, cgroup_fd: int) -> tuple[int, tuple[int, ...]]:
        """``(attach flags, ids)`` of the device programs attached to the cgroup itself."""
        flags = ctypes.c_uint32(0)
        ids = (ctypes.c_uint32 * MAX_PROGRAMS)()
        count = ctypes.c_uint32(MAX_PROGRAMS)
        self._check(self._lib.bpf_prog_query(cgroup_fd, BPF_CGROUP_DEVICE, 0, ctypes.byref(flags), ids,
                                             ctypes.byref(count)), "BPF_PROG_QUERY")
        return flags.value, tuple(ids[: count.value])

    def prog_fd(self, prog_id: int) -> int:
        return self._check(self._lib.bpf_prog_get_fd_by_id(prog_id), f"BPF_PROG_GET_FD_BY_ID {prog_id}")

    def read(self, prog_fd: int, prog_id: int) -> Program:
        info = _ProgInfo()
        size = ctypes.c_uint32(ctypes.sizeof(info))
        self._check(self._lib.bpf_obj_get_info_by_fd(prog_fd, ctypes.byref(info), ctypes.byref(size)),
                    f"BPF_OBJ_GET_INFO_BY_FD {prog_id}")
        if info.type != BPF_PROG_TYPE_CGROUP_DEVICE:
            raise OSError(errno_mod.EINVAL, f"program {prog_id} is of type {info.type}, not a device program")
        length = info.xlated_prog_len
        if length == 0:  # the kernel hides the instructions from callers without CAP_SYS_ADMIN / kptr_restrict
            raise OSError(errno_mod.EPERM, f"program {prog_id}: the kernel does not show its instructions")
        buf = ctypes.create_string_buffer(length)
        again = _ProgInfo(xlated_prog_len=length, xlated_prog_insns=ctypes.addressof(buf))
        size = ctypes.c_uint32(ctypes.sizeof(again))
        self._check(self._lib.bpf_obj_get_info_by_fd(prog_fd, ctypes.byref(again), ctypes.byref(size)),
                    f"BPF_OBJ_GET_INFO_BY_FD {prog_id}")
        return Program(prog_id, info.name.decode("ascii", "replace"), bool(info.flags & 1),
                       buf.raw[: min(length, again.xlated_prog_len)])

    def load(self, insns: bytes, name: str, gpl: bool) -> int:
        """Load a device program; on refusal the OSError carries the verifier's last line (the
        load is repeated with the verifier's log on, which a big log could otherwise fail)."""
        license_ = b"GPL" if gpl else b"MIT"
        args = (BPF_PROG_TYPE_CGROUP_DEVICE, name.encode("ascii", "replace")[:15], license_, insns, len(insns) // 8)
        rc = self._lib.bpf_prog_load(*args, None)
        if rc >= 0:
            return rc
        err = -rc
        log = ctypes.create_string_buffer(VERIFIER_LOG_SIZE)
        opts = _LoadOpts(sz=ctypes.sizeof(_LoadOpts), log_level=1, log_size=VERIFIER_LOG_SIZE)
        opts.log_buf = ctypes.cast(log, ctypes.c_char_p)
        again = self._lib.bpf_prog_load(*args, ctypes.byref(opts))
        if again >= 0:  # refused once, accepted now: use it
            return again
        lines = [ln for ln in log.value.decode("ascii", "replace").splitlines() if ln.strip()]
        raise OSError(err, f"BPF_PROG_LOAD: {os.strerror(err)}" + (f" (verifier: {lines[-1]})" if lines else ""))

    def attach(self, cgroup_fd: int, prog_fd: int, attach_flags: int = BPF_F_ALLOW_MULTI) -> None:
        """Attach a device program next to those attached (how a runtime does; tests use it)."""
        opts = _AttachOpts(sz=ctypes.sizeof(_AttachOpts), flags=attach_flags)
        self._check(self._lib.bpf_prog_attach_opts(prog_fd, cgroup_fd, BPF_CGROUP_DEVICE, ctypes.byref(opts)),
                    "BPF_PROG_ATTACH")

    def replace(self, cgroup_fd: int, new_fd: int, old_fd: int, attach_flags: int) -> None:
        """Attach ``new_fd`` in place of ``old_fd`` (atomic with BPF_F_ALLOW_MULTI; without it the
        single attached program is replaced by attaching with the same flags)."""
        flags = attach_flags & ~BPF_F_REPLACE
        replace = bool(flags & BPF_F_ALLOW_MULTI)
        opts = _AttachOpts(sz=ctypes.sizeof(_AttachOpts), flags=flags | (BPF_F_REPLACE if replace else 0),
                           replace_prog_fd=old_fd if replace else 0)
        self._check(self._lib.bpf_prog_attach_opts(new_fd, cgroup_fd, BPF_CGROUP_DEVICE, ctypes.byref(opts)),
                    "BPF_PROG_ATTACH (replace)")


_LIB: Libbpf | None = None


def libbpf() -> Libbpf:
    """The process's libbpf handle. Raises EnforcementError when libbpf cannot be loaded."""
    global _LIB
    if _LIB is None:
        try:
            _LIB = Libbpf()
        except (OSError, AttributeError) as exc:
            raise EnforcementError(f"cgroup v2 device access needs {LIBBPF} (Debian package libbpf1): {exc}") from exc
    return _LIB


def _fail(exc: OSError, what: str, cgroup_dir: str) -> EnforcementError:
    return EnforcementError(f"{what}: {exc.strerror or exc}", path=cgroup_dir, errno=exc.errno)


@contextmanager
def _attached(cgroup_dir: str, lib: Libbpf) -> Iterator[tuple[int, int, tuple[int, ...]]]:
    """``cgroup_dir`` opened, with its attach flags and the ids of the device programs attached
    to it. Raises EnforcementError naming the directory."""
    try:
        cg_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _fail(exc, "cannot open the cgroup", cgroup_dir) from exc
    try:
        try:
            flags, ids = lib.query(cg_fd)
        except OSError as exc:
            raise _fail(exc, "cannot list the cgroup's device programs", cgroup_dir) from exc
        yield cg_fd, flags, tuple(ids)
    finally:
        os.close(cg_fd)


def _program_fd(lib: Libbpf, prog_id: int, cgroup_dir: str) -> int:
    try:
        return lib.prog_fd(prog_id)
    except OSError as exc:
        raise _fail(exc, f"cannot open device program {prog_id} (an LSM may protect it)", cgroup_dir) from exc


def _change(cgroup_dir: str, add: Sequence[DeviceRule], remove: Sequence[DeviceRule], lib: Libbpf) -> int:
    """Replace each program attached to ``cgroup_dir`` whose numa-pin rules change; how many were
    replaced. On a failure part-way, the programs already replaced are put back first."""
    done = 0
    try:
        with _attached(cgroup_dir, lib) as (cg_fd, flags, ids):
            for prog_id in ids:
                old_fd = _program_fd(lib, prog_id, cgroup_dir)
                try:
                    prog = lib.read(old_fd, prog_id)
                    try:
                        new = with_rules(prog.insns, add, remove)
                    except ValueError as exc:
                        raise EnforcementError(f"device program {prog_id} ({prog.name}): {exc}",
                                               path=cgroup_dir) from exc
                    if new is None:
                        continue
                    new_fd = lib.load(new, prog.name, prog.gpl)
                    try:
                        lib.replace(cg_fd, new_fd, old_fd, flags)
                    finally:
                        os.close(new_fd)
                    done += 1
                except OSError as exc:
                    raise _fail(exc, f"device program {prog_id} not replaced", cgroup_dir) from exc
                finally:
                    os.close(old_fd)
    except EnforcementError as exc:
        if done and add:
            try:
                _change(cgroup_dir, (), add, lib)
            except EnforcementError as undo_exc:
                exc.add_rollback_failures([f"undo of the programs already replaced failed: {undo_exc}"])
        raise
    return done


def read_programs(cgroup_dir: str, lib: Libbpf | None = None) -> tuple[Program, ...]:
    """The device programs attached to ``cgroup_dir`` itself. Raises EnforcementError."""
    lib = lib or libbpf()
    out = []
    with _attached(cgroup_dir, lib) as (_, _, ids):
        for prog_id in ids:
            fd = _program_fd(lib, prog_id, cgroup_dir)
            try:
                out.append(lib.read(fd, prog_id))
            except OSError as exc:
                raise _fail(exc, f"cannot read device program {prog_id}", cgroup_dir) from exc
            finally:
                os.close(fd)
    return tuple(out)


def add_rules(cgroup_dir: str, rules: Iterable[DeviceRule], lib: Libbpf | None = None) -> tuple[DeviceRule, ...]:
    """Make every device program attached to ``cgroup_dir`` also allow ``rules``; the rules that
    were not carried by all of them before (what :func:`remove_rules` should take back).

    Afterwards each program is read back and must carry every rule. Raises EnforcementError
    (``path`` the cgroup, ``errno`` the kernel's) when a program cannot be read, loaded or
    swapped; the programs replaced by this call are put back before it raises.
    """
    lib = lib or libbpf()
    wanted = tuple(dict.fromkeys(rules))
    before = read_programs(cgroup_dir, lib)
    try:
        carried = [set(carried_rules(p.insns)) for p in before]
    except ValueError as exc:
        raise EnforcementError(f"a device program is not one numa-pin can extend: {exc}", path=cgroup_dir) from exc
    added = tuple(r for r in wanted if not all(r in c for c in carried)) if before else ()
    if not added:
        return ()
    _change(cgroup_dir, added, (), lib)
    cause: Exception | None = None
    try:
        after = read_programs(cgroup_dir, lib)
        lacking = [p.id for p in after if not set(added) <= set(carried_rules(p.insns))]
    except (EnforcementError, ValueError) as exc:
        lacking, cause = [-1], exc
    if lacking:
        error = EnforcementError("after replacing the device programs, program(s) "
                                 f"{', '.join(map(str, lacking))} still lack {', '.join(map(str, added))}"
                                 + (f" ({cause})" if cause else ""), path=cgroup_dir)
        try:
            _change(cgroup_dir, (), added, lib)
        except EnforcementError as undo_exc:
            error.add_rollback_failures([f"undo of the replaced programs failed: {undo_exc}"])
        raise error
    return added


def remove_rules(cgroup_dir: str, rules: Iterable[DeviceRule], lib: Libbpf | None = None) -> int:
    """Take ``rules`` out of the numa-pin prologue of every device program attached to
    ``cgroup_dir`` (a program left with none is the original again); how many programs changed.
    A cgroup that is gone has nothing to take back (0). Raises EnforcementError."""
    if not os.path.isdir(cgroup_dir):
        return 0
    return _change(cgroup_dir, (), tuple(rules), lib or libbpf())


__all__ = ["LIBBPF", "Libbpf", "Program", "add_rules", "libbpf", "read_programs", "remove_rules"]
