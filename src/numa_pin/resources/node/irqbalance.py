"""A running irqbalance, told which CPUs to keep IRQs off instead of being fought.

irqbalance rewrites ``smp_affinity`` every ten seconds; an affinity numa-pin wrote would not
last. So when it runs (a process whose ``comm`` is ``irqbalance`` under the proc root):

* its own banned list (``IRQBALANCE_BANNED_CPULIST`` or ``IRQBALANCE_BANNED_CPUS`` in its
  environment, read from ``/proc/<pid>/environ``) that already holds every CPU to keep free
  needs nothing;
* otherwise numa-pin uses irqbalance's socket (``/run/irqbalance/irqbalance<pid>.sock``, reached
  through ``/proc/<pid>/root``): it asks ``setup`` for the banned CPUs irqbalance uses now (its
  environment, isolcpus and nohz_full), and sends ``settings cpus <those + the CPUs to keep
  free>``; when no grant asks any more it sends ``settings cpus NULL``, which hands the list back
  to irqbalance's own rules;
* with neither, a container that asks is rejected with one line before anything is written.
"""

from __future__ import annotations

import os
import socket
import struct

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.base.record import record
from numa_pin.errors import EnforcementError
from numa_pin.resources.irq import parse_mask

#: where irqbalance puts its socket, inside its own root
SOCKET_DIR = "run/irqbalance"
#: the most bytes read from ``environ`` and from the socket's answer
MAX_BYTES = 1 << 16
#: how long one exchange with the socket may take
TIMEOUT_S = 2.0
#: the most processes looked at for irqbalance
MAX_PIDS = 1 << 16


@record
class Irqbalance:
    """A running irqbalance: its pid, the CPUs its environment bans (None: it sets none) and its
    socket (None: there is none)."""

    pid: int
    env_banned: frozenset[int] | None
    socket: str | None


def find(proc_root: str) -> Irqbalance | None:
    """The running irqbalance under ``proc_root``, or None."""
    try:
        names = [n for n in os.listdir(proc_root) if n.isdigit()][:MAX_PIDS]
    except OSError:
        return None
    for name in sorted(names, key=int):
        try:
            with open(os.path.join(proc_root, name, "comm"), "rb") as f:
                comm = f.read(64).strip()
        except OSError:
            continue
        if comm == b"irqbalance":
            pid = int(name)
            sock = os.path.join(proc_root, name, "root", SOCKET_DIR, f"irqbalance{pid}.sock")
            return Irqbalance(pid, _env_banned(proc_root, pid), sock if os.path.exists(sock) else None)
    return None


def _env_banned(proc_root: str, pid: int) -> frozenset[int] | None:
    try:
        with open(os.path.join(proc_root, str(pid), "environ"), "rb") as f:
            raw = f.read(MAX_BYTES)
    except OSError:
        return None
    env = dict(item.partition(b"=")[::2] for item in raw.split(b"\0") if b"=" in item)
    try:
        if env.get(b"IRQBALANCE_BANNED_CPULIST", b"").strip():
            return parse_list(env[b"IRQBALANCE_BANNED_CPULIST"].decode("ascii"))
        if env.get(b"IRQBALANCE_BANNED_CPUS", b"").strip():
            return parse_mask(env[b"IRQBALANCE_BANNED_CPUS"].decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    return None


def exchange(path: str, command: str) -> str:
    """Send one ``command`` to irqbalance's socket at ``path`` (as root, with the credentials it
    checks) and return its answer. Raises EnforcementError naming the socket."""
    directory, name = os.path.split(path)
    dfd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if directory else None
    try:
        # a unix socket path is at most 108 bytes: reach a deep one through the directory's fd
        target = f"/proc/self/fd/{dfd}/{name}" if dfd is not None and len(path) > 100 else path
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT_S)
            sock.connect(target)
            creds = struct.pack("3i", os.getpid(), os.getuid(), os.getgid())
            sock.sendmsg([command.encode("ascii")], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
            chunks: list[bytes] = []
            while sum(map(len, chunks)) < MAX_BYTES and (chunk := sock.recv(4096)):
                chunks.append(chunk)
    except OSError as exc:
        raise EnforcementError(f"irqbalance's socket refused {command!r}: {exc.strerror or exc}", path=path) from exc
    finally:
        if dfd is not None:
            os.close(dfd)
    return b"".join(chunks).decode("ascii", "replace")


def banned_now(path: str) -> frozenset[int]:
    """The CPUs irqbalance bans now (``setup`` answers ``... BANNED <hex mask>``)."""
    answer = exchange(path, "setup")
    _, sep, mask = answer.rpartition("BANNED ")
    try:
        return parse_mask(mask.split()[0]) if sep and mask.split() else frozenset()
    except ValueError as exc:
        raise EnforcementError(f"irqbalance's setup answer {answer[:80]!r} has no banned mask", path=path) from exc


def ban(path: str, cpus: frozenset[int] | None) -> None:
    """Have irqbalance keep IRQs off ``cpus`` (None: back to its own rules)."""
    exchange(path, "settings cpus " + (format_list(cpus) if cpus else "NULL"))


def unreachable_message(found: Irqbalance, cpus: frozenset[int]) -> str:
    return (
        f"irqbalance (pid {found.pid}) runs, its environment does not ban CPU {format_list(cpus)} and it has no "
        f"socket numa-pin can tell; add them to IRQBALANCE_BANNED_CPULIST in its environment file and restart it, "
        "or stop irqbalance"
    )


__all__ = ["Irqbalance", "ban", "banned_now", "exchange", "find", "unreachable_message"]
