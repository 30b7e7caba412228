"""Memory placement beyond ``cpuset.mems``: a NUMA memory policy over the granted nodes.

``numa-pin.io/memory-policy`` asks for one of :data:`MODES`; the grant's ``mems`` are the nodes
(for ``interleave``, pages go round-robin over them; ``weighted-interleave`` in proportion to
the kernel's per-node weights, ``/sys/kernel/mm/mempolicy/weighted_interleave``, kernel 6.9
and later; ``preferred-many`` takes the nearest of them and falls back to any node when they are
full; ``bind`` never leaves them). Where it is applied:

* ``numa-pin run``: the child calls ``set_mempolicy(2)`` on itself after the verdict and before
  ``exec`` (:func:`apply_in_child`); the policy is inherited by everything the command forks;
* ``precreate``: ``linux.memoryPolicy`` in the spec (runtime-spec 1.3, :func:`oci_policy`),
  which the runtime applies to the container's first process the same way.
"""

from __future__ import annotations

import os

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.errors import EnforcementError, RequestError

#: request word -> (kernel mode number, runtime-spec mode name)
MODES = {
    "bind": (2, "MPOL_BIND"),
    "interleave": (3, "MPOL_INTERLEAVE"),
    "preferred-many": (5, "MPOL_PREFERRED_MANY"),
    "weighted-interleave": (6, "MPOL_WEIGHTED_INTERLEAVE"),
}
#: the annotation (and ``numa-pin run --memory-policy``)
ANNOTATION = "numa-pin.io/memory-policy"
#: present on kernels that have weighted interleave (6.9 and later)
WEIGHTED_DIR = "kernel/mm/mempolicy/weighted_interleave"
#: the set_mempolicy syscall number per machine
_SYSCALL = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "s390x": 270}


def check_mode(word: str, annotation: str = ANNOTATION) -> str:
    """``word`` when it is one of :data:`MODES`; else a RequestError naming ``annotation``."""
    if word not in MODES:
        raise RequestError(f"unknown memory policy {word!r} (expected one of {', '.join(MODES)})",
                           annotation=annotation)
    return word


def check_kernel(word: str, sysfs_root: str) -> None:
    """Weighted interleave needs a kernel that has it (RequestError naming the annotation)."""
    if word == "weighted-interleave" and not os.path.isdir(os.path.join(sysfs_root, WEIGHTED_DIR)):
        raise RequestError(f"weighted-interleave needs kernel 6.9 or later (no {WEIGHTED_DIR} under {sysfs_root})",
                           annotation=ANNOTATION)


def oci_policy(word: str, mems: frozenset[int]) -> dict[str, str]:
    """``linux.memoryPolicy`` for ``word`` over ``mems`` (pure)."""
    return {"mode": MODES[word][1], "nodes": format_list(mems)}


def encode(word: str | None, mems: frozenset[int]) -> bytes:
    """What the parent of ``numa-pin run`` hands its child after the verdict (empty: no policy)."""
    return f"{word} {format_list(mems)}".encode() if word and mems else b""


def apply_in_child(message: bytes) -> None:
    """In the child, before exec: set the policy :func:`encode` described (nothing for b"").

    Raises:
        EnforcementError: the kernel refused (its words, and what was asked).
    """
    if not message:
        return
    word, _, nodes = message.decode().partition(" ")
    set_mempolicy(word, parse_list(nodes))


def set_mempolicy(word: str, nodes: frozenset[int]) -> None:
    """``set_mempolicy(MODES[word], nodes)`` for the calling thread (and what it forks)."""
    import ctypes
    import platform

    number = _SYSCALL.get(platform.machine())
    if number is None:
        raise EnforcementError(f"set_mempolicy: unknown syscall number on {platform.machine()}")
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    words = max(nodes) // bits + 1 if nodes else 1
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        mask[n // bits] |= 1 << (n % bits)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, MODES[word][0], mask, ctypes.c_ulong(words * bits + 1)) != 0:
        err = ctypes.get_errno()
        hint = " (weighted-interleave needs kernel 6.9 or later)" if word == "weighted-interleave" else ""
        raise EnforcementError(f"set_mempolicy {word} nodes {format_list(nodes)}: {os.strerror(err)}{hint}")


__all__ = ["ANNOTATION", "MODES", "apply_in_child", "check_kernel", "check_mode", "encode", "oci_policy",
           "set_mempolicy"]
