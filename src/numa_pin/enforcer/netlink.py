"""The pyroute2 plumbing the netdev enforcers share: one IPRoute per netns, netns file
descriptors, interface lookups, and netlink errors as one readable reason.

pyroute2 is imported inside the functions that use it, never at module import (the hook
path must stay fast).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from numa_pin.errors import EnforcementError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any


def netlink_error() -> type[Exception]:
    """pyroute2's NetlinkError (imported on first use)."""
    from pyroute2.netlink.exceptions import NetlinkError

    return NetlinkError


def reason(exc: BaseException) -> str:
    """``exc`` as a short reason: the errno's text when it carries one."""
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code > 0:
        return os.strerror(code)
    return str(exc) or type(exc).__name__


@contextmanager
def iproute(netns: str | None = None) -> Iterator[Any]:
    """An IPRoute in the current netns, or in the netns file ``netns`` (never created)."""
    from pyroute2 import IPRoute

    nl_error = netlink_error()
    try:
        ipr = IPRoute() if netns is None else IPRoute(netns=netns, flags=0)
    except (nl_error, OSError) as exc:
        raise EnforcementError(f"cannot open a netlink socket: {reason(exc)}",
                               path=netns) from exc
    try:
        yield ipr
    finally:
        ipr.close()


def open_netns(path: str) -> int:
    """An fd of the netns file ``path``. Raises EnforcementError naming it (the process is gone)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise EnforcementError(f"cannot open the network namespace: {exc.strerror or exc}",
                               path=path) from exc


def lookup(ipr: Any, name: str) -> int | None:
    """The index of interface ``name`` in ``ipr``'s netns, or None."""
    try:
        found = ipr.link_lookup(ifname=name)
    except netlink_error() as exc:
        raise EnforcementError(f"listing network interfaces failed: {reason(exc)}") from exc
    return found[0] if found else None


def link(ipr: Any, index: int) -> Any:
    """The RTM_NEWLINK message of interface ``index``."""
    return ipr.link("get", index=index)[0]


__all__ = ["iproute", "link", "lookup", "netlink_error", "open_netns", "reason"]
