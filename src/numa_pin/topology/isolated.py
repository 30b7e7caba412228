"""The kernel's isolated CPUs: ``isolcpus`` and ``nohz_full`` as sysfs shows them.

``/sys/devices/system/cpu/isolated`` lists the CPUs ``isolcpus=`` (domain) took out of the
scheduler's load balancing, ``/sys/devices/system/cpu/nohz_full`` those that run without the
periodic tick; both are empty (or absent, on kernels built without them) on most nodes. numa-pin
treats either as an isolated CPU: the config's ``isolation.isolated_cpus`` says whether
exclusive grants prefer, require or avoid them, and the shared pool leaves them out unless
``isolation.shared_pool_isolated`` is on.
"""

from __future__ import annotations

import os

from numa_pin.base.boundedio import UnsafeInput, read_regular_file
from numa_pin.base.cpuset import parse_list
from numa_pin.errors import SysfsError

#: bytes read of one CPU list (a 4096-CPU list of singles fits)
MAX_LIST = 65536


def read_cpu_list(sysfs_root: str, name: str) -> frozenset[int]:
    """The CPUs ``<sysfs>/devices/system/cpu/<name>`` lists; none when the file is absent.
    Raises SysfsError naming it when it is unreadable or not a CPU list."""
    path = os.path.join(sysfs_root, "devices", "system", "cpu", name)
    try:
        text = read_regular_file(path, MAX_LIST).decode("ascii", "replace").strip().strip("\0")
    except FileNotFoundError:
        return frozenset()
    except (OSError, UnsafeInput) as exc:
        raise SysfsError(path, f"cannot read: {exc}") from exc
    if text in ("", "(null)"):  # nohz_full prints "(null)" when the kernel has the option but no CPUs
        return frozenset()
    try:
        return parse_list(text)
    except ValueError as exc:
        raise SysfsError(path, f"not a CPU list: {exc}") from exc


def isolated_cpus(sysfs_root: str) -> tuple[frozenset[int], frozenset[int]]:
    """``(isolated, nohz_full)`` of the node."""
    return read_cpu_list(sysfs_root, "isolated"), read_cpu_list(sysfs_root, "nohz_full")


__all__ = ["isolated_cpus", "read_cpu_list"]
