"""runc's command line as runc reads it (pure): what :mod:`numa_pin.entry.runc` needs of it.

runc parses its arguments with urfave/cli v1 over Go's flag package: global flags come before
the subcommand, one or two dashes, ``--flag value`` or ``--flag=value``, a switch never takes the
next argument, and parsing stops at the first argument that is not a flag (or after ``--``); a
subcommand's flags may also follow its positional arguments, of which the first is the
container id.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from collections.abc import Sequence

#: runc's global flags that take a value (urfave/cli: ``--flag value``, ``--flag=value``, one or two dashes)
GLOBAL_VALUE_FLAGS = frozenset({"log", "log-format", "root", "criu", "rootless"})
#: the value flags of the subcommands numa-pin reads; every other flag of theirs is a switch
COMMAND_VALUE_FLAGS = {
    "create": frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds", "pidfd-socket"}),
    "delete": frozenset(),
}


class Invocation:
    """What numa-pin needs of runc's command line: the global arguments (everything before the
    subcommand), the subcommand, its container id, (``create``) its bundle as given, and the
    log file and format runc was told to write its errors to (``--log``, ``--log-format``)."""

    __slots__ = ("bundle", "command", "container_id", "global_args", "log", "log_format")

    def __init__(self, global_args: tuple[str, ...], command: str | None, container_id: str | None = None,
                 bundle: str | None = None) -> None:
        self.global_args = global_args
        self.command = command
        self.container_id = container_id
        self.bundle = bundle
        values = _global_values(global_args)
        self.log = values.get("log")
        self.log_format = values.get("log-format", "text")

    def __repr__(self) -> str:
        return (f"Invocation(global_args={self.global_args!r}, command={self.command!r}, "
                f"container_id={self.container_id!r}, bundle={self.bundle!r})")


def _flag(arg: str) -> tuple[str, str | None]:
    """``(name, value after '=' or None)`` of a flag argument, with one or two dashes."""
    name = arg[2:] if arg.startswith("--") else arg[1:]
    key, sep, value = name.partition("=")
    return key, (value if sep else None)


def _global_values(global_args: Sequence[str]) -> dict[str, str]:
    """The values of the global value flags, the last one of a name winning (Go's flag package)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(global_args):
        name, value = _flag(global_args[i])
        i += 1
        if name in GLOBAL_VALUE_FLAGS:
            if value is None and i < len(global_args):
                value = global_args[i]
                i += 1
            if value is not None:
                out[name] = value
    return out


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


__all__ = ["COMMAND_VALUE_FLAGS", "GLOBAL_VALUE_FLAGS", "Invocation", "parse_argv"]
