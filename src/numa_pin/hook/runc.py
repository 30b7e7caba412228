"""``numa-pin-runc``: an OCI runtime command in front of runc, for engines that run no OCI hooks.

Docker Engine starts containers through a runtime binary (``/etc/docker/daemon.json``'s
``runtimes``) and offers no hook stage of its own. Registered there, this command takes runc's
command line unchanged and

* on ``create``: finds the bundle and the container id as runc parses them, runs numa-pin's
  precreate decision on ``<bundle>/config.json`` (what podman's precreate hook runs:
  :mod:`numa_pin.hook.precreate` through :func:`numa_pin.invoke.run`), writes the edited config
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
(:func:`numa_pin.hook.runcstage.env_annotations`).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

#: names the real runc (path or command name); default ``runc`` on PATH
RUNC_ENV = "NUMA_PIN_RUNC"
#: runc's global flags that take a value (urfave/cli: ``--flag value``, ``--flag=value``, one or two dashes)
GLOBAL_VALUE_FLAGS = frozenset({"log", "log-format", "root", "criu", "rootless"})
#: the value flags of the subcommands numa-pin reads; every other flag of theirs is a switch
COMMAND_VALUE_FLAGS = {
    "create": frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds", "pidfd-socket"}),
    "delete": frozenset(),
}


class Invocation:
    """What numa-pin needs of runc's command line: the global arguments (everything before the
    subcommand), the subcommand, its container id and (``create``) its bundle as given."""

    __slots__ = ("bundle", "command", "container_id", "global_args")

    def __init__(self, global_args: tuple[str, ...], command: str | None, container_id: str | None = None,
                 bundle: str | None = None) -> None:
        self.global_args = global_args
        self.command = command
        self.container_id = container_id
        self.bundle = bundle

    def __repr__(self) -> str:
        return (f"Invocation(global_args={self.global_args!r}, command={self.command!r}, "
                f"container_id={self.container_id!r}, bundle={self.bundle!r})")


def _flag(arg: str) -> tuple[str, str | None]:
    """``(name, value after '=' or None)`` of a flag argument, with one or two dashes."""
    name = arg[2:] if arg.startswith("--") else arg[1:]
    key, sep, value = name.partition("=")
    return key, (value if sep else None)


def parse_argv(argv: Sequence[str]) -> Invocation:
    """runc's command line as runc reads it (pure): Go's flag rules for the global flags (they
    stop at the first argument that is not a flag, or after ``--``), then the subcommand's
    flags, which urfave/cli also takes after the positional arguments; the first positional
    argument is the container id. A value flag's value is the next argument unless it came
    after ``=``; ``create``'s bundle defaults to the working directory (None here)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        name, value = _flag(arg)
        i += 2 if name in GLOBAL_VALUE_FLAGS and value is None else 1
    global_args = tuple(argv[: min(i, len(argv))])
    if i >= len(argv):
        return Invocation(global_args, None)
    command = argv[i]
    value_flags = COMMAND_VALUE_FLAGS.get(command)
    if value_flags is None:
        return Invocation(global_args, command)
    container_id = bundle = None
    rest = argv[i + 1:]
    j = 0
    while j < len(rest):
        arg = rest[j]
        j += 1
        if arg == "--":
            if container_id is None and j < len(rest):
                container_id = rest[j]
            break
        if arg.startswith("-") and arg != "-":
            name, value = _flag(arg)
            if name in value_flags and value is None:
                value = rest[j] if j < len(rest) else None
                j += 1
            if name in ("bundle", "b"):
                bundle = value
        elif container_id is None:
            container_id = arg
    return Invocation(global_args, command, container_id, bundle)


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
        os.execv(runc, [runc, *args])
    from numa_pin.hook.runcstage import create, delete

    cid, global_args = invocation.container_id, invocation.global_args
    if invocation.command == "create":
        return create(runc, args, global_args, cid, invocation.bundle, os.environ)
    return delete(runc, args, global_args, cid, os.environ)


__all__ = ["COMMAND_VALUE_FLAGS", "GLOBAL_VALUE_FLAGS", "RUNC_ENV", "Invocation", "find_runc", "main", "parse_argv"]


if __name__ == "__main__":
    sys.exit(main())
