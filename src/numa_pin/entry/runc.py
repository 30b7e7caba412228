"""``numa-pin-runc``: an OCI runtime command in front of runc, for engines that run no OCI hooks.

Docker Engine starts containers through a runtime binary (``/etc/docker/daemon.json``'s
``runtimes``) and offers no hook stage of its own. Registered there, this command takes runc's
command line unchanged and

* on ``create``: finds the bundle and the container id as runc parses them, runs numa-pin's
  precreate decision on ``<bundle>/config.json`` (what podman's precreate hook runs:
  :mod:`numa_pin.hook.precreate` through :func:`numa_pin.hook.invoke.run`), writes the edited config
  back atomically and runs the real runc with the same arguments. A refusal exits 1 with
  numa-pin's one line on stderr before runc runs; a runc that fails after an admission leaves
  nothing held (the grant goes once runc no longer knows the container);
* on ``delete``: runs runc's delete, then releases the container's grant once runc no longer
  knows the container (a failed delete of a live container keeps its grant);
* anything else: ``exec``\\ s runc at once (this module imports only :mod:`os` and :mod:`sys`
  on that path).

The real runc is ``NUMA_PIN_RUNC`` (a path, or a name looked up on ``PATH``), else ``runc`` on
``PATH``; a candidate that is this command itself is skipped. The config is the hook's
(``NUMA_PIN_CONFIG``, else ``/etc/numa-pin/config.yaml``).

Docker 20.10 (Debian 12) copies neither ``--annotation`` nor labels into ``config.json``, so a
container may also ask through its environment: ``NUMA_PIN_IO_<KEY>=<value>`` stands for the
annotation ``numa-pin.io/<key>`` (``NUMA_PIN_IO_CPUS=2``, ``NUMA_PIN_IO_HUGEPAGES_2MI=1Gi``,
``NUMA_PIN_IO_MEMORY_POLICY=bind``); an annotation that is present wins
(:func:`numa_pin.entry.runcstage.env_annotations`).
"""

from __future__ import annotations

import os
import sys

from numa_pin.entry.runcargs import COMMAND_VALUE_FLAGS, parse_argv

TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping

#: names the real runc (path or command name); default ``runc`` on PATH
RUNC_ENV = "NUMA_PIN_RUNC"


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def find_runc(env: Mapping[str, str], itself: str) -> str | None:
    """The real runc: ``NUMA_PIN_RUNC`` (a path, or a name looked up on ``PATH``), else ``runc``
    on ``PATH``; an executable regular file that is not ``itself`` (a ``runc`` on PATH that is
    this command, through a link or a copy at the same inode, is passed over). None if none."""
    name = env.get(RUNC_ENV) or "runc"
    if "/" in name:
        candidates = [name]
    else:
        candidates = [os.path.join(d or ".", name) for d in env.get("PATH", os.defpath).split(":")]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK) and not _same_file(path, itself):
            return path
    return None


def _fail(line: str, code: int) -> int:
    print(line, file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """The ``numa-pin-runc`` command: runc's arguments in, runc's exit code out (``exec`` for
    every subcommand but ``create`` and ``delete``)."""
    args = sys.argv[1:] if argv is None else argv
    runc = find_runc(os.environ, sys.argv[0] if argv is None else "")
    if runc is None:
        return _fail(f"numa-pin-runc: no runc to run ({RUNC_ENV} or runc on PATH; never numa-pin-runc itself)", 127)
    invocation = parse_argv(args)
    if invocation.container_id is None or invocation.command not in COMMAND_VALUE_FLAGS:
        try:
            os.execv(runc, [runc, *args])
        except OSError as exc:  # ENOEXEC, ETXTBSY, a file gone since it was found
            return _fail(f"numa-pin-runc: cannot run {runc}: {exc.strerror}", 127)
    from numa_pin.entry.runcstage import create, delete

    if invocation.command == "create":
        return create(runc, args, invocation, os.environ)
    return delete(runc, args, invocation, os.environ)


__all__ = ["RUNC_ENV", "find_runc", "main"]


if __name__ == "__main__":
    sys.exit(main())
