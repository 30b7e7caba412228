"""The spare keeps the memory it frees: the admission it serves finds the pages of the rehearsal's
large blocks (a busy node's ledger, encoded once as it rehearses and again as it commits) already
faulted in. Counted with the kernel's minor page faults of a forked child, as a spare is one."""

from __future__ import annotations

import ctypes
import os
import resource
import struct

from numa_pin.agent import spare

BLOCK = 4 << 20  # a ledger of some 8,000 containers
PAGES = BLOCK // resource.getpagesize()


def faults_of_a_second_block(keep: bool) -> tuple[bool, int]:
    """In a forked child: (whether the settings took, the page faults of filling a block of
    :data:`BLOCK` bytes after one of the same size was filled and freed)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through the pipe)
        try:
            if keep:
                took = spare.keep_freed_memory()
            else:  # glibc's settings of a process that never freed a large block (the agent's server)
                libc = ctypes.CDLL(None)
                took = bool(libc.mallopt(spare._M_MMAP_THRESHOLD, 128 << 10)) and bool(
                    libc.mallopt(spare._M_TRIM_THRESHOLD, 128 << 10))
            first = b"x" * BLOCK
            del first
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            second = b"y" * BLOCK
            after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            os.write(w, struct.pack("=?q", took, after - before + (len(second) - BLOCK)))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as reader:
        data = reader.read()
    os.waitpid(pid, 0)
    took, faults = struct.unpack("=?q", data)
    return took, faults


def test_a_spare_refills_a_freed_block_without_faulting_its_pages_in_again() -> None:
    took, kept = faults_of_a_second_block(keep=True)
    defaults, plain = faults_of_a_second_block(keep=False)
    assert took and defaults
    assert kept < PAGES // 8, f"{kept} page faults for a block of {PAGES} pages freed and taken again"
    assert plain > PAGES // 2 > kept  # glibc's start-up settings map such a block afresh: the faults this saves
