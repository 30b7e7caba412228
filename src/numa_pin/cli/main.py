"""The ``numa-pin`` command: argparse root, lazy subcommand loading, error boundary.

Each subcommand lives in its own module ``numa_pin.cli.cmd_<name>`` exposing ``NAME``,
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. :data:`COMMANDS` maps names
to module paths; adding a subcommand is one line there. Only the selected module is
imported (``numa-pin topology`` never imports pyroute2); the top-level ``--help`` and
usage errors import them all to list their one-line help.

Exit codes (shared with ``numa-pin-hook``, see :mod:`numa_pin.errors` and docs/troubleshooting.md): the
subcommand's return value on success; 1 when an admission is rejected; 2 for usage errors
(argparse errors, and a :class:`~numa_pin.errors.RequestError`, which here comes from the
flags); 3 for a configuration error; 4 for any other :class:`~numa_pin.errors.NumaPinError` or
an OS error; 70 for an unexpected exception (an internal error); 130 on Ctrl-C; 141 when stdout
is a closed pipe. Errors are printed as one line ``numa-pin: <kind>: <message>``. ``--debug``
(before or after the subcommand) re-raises instead, for a traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from numa_pin import __version__
from numa_pin.base.text import one_line
from numa_pin.errors import (
    EXIT_ERROR,
    EXIT_INTERNAL,
    EXIT_USAGE,
    AdmissionError,
    NumaPinError,
    RequestError,
    exit_code,
)

PROG = "numa-pin"

#: subcommand name -> module path; one line per subcommand
COMMANDS: dict[str, str] = {
    "topology": "numa_pin.cli.cmd_topology",
    "run": "numa_pin.cli.cmd_run",
    "plan": "numa_pin.cli.cmd_plan",
    "explain": "numa_pin.cli.cmd_explain",
    "status": "numa_pin.cli.cmd_status",
    "release": "numa_pin.cli.cmd_release",
    "reconcile": "numa_pin.cli.cmd_reconcile",
    "recover": "numa_pin.cli.cmd_recover",
    "serve": "numa_pin.cli.cmd_serve",
    "nrt": "numa_pin.cli.cmd_nrt",
    "metrics": "numa_pin.cli.cmd_metrics",
    "resize": "numa_pin.cli.cmd_resize",
}

EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
#: NumaPinError subclasses that mean the user asked for something malformed
USAGE_ERRORS: tuple[type[NumaPinError], ...] = (RequestError,)

_GLOBAL_FLAGS = frozenset({"--debug"})
_DEBUG_HELP = "show tracebacks instead of one-line errors"


def load_command(name: str) -> ModuleType:
    """Import the module of subcommand ``name``. Raises KeyError for an unknown name."""
    return importlib.import_module(COMMANDS[name])


def selected_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names, or None when argparse should see every command
    (no command, ``--help`` before it, an unknown global flag or an unknown command). Pure.
    """
    for arg in argv:
        if arg in _GLOBAL_FLAGS:
            continue
        return arg if arg in COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argparse tree; with ``only`` set, just that subcommand's module is imported."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Kubernetes Topology Manager NUMA alignment for OCI containers and processes.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    # --debug is also accepted after the subcommand; SUPPRESS keeps the global value
    # when it is not repeated there
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if only is not None and name != only:
            continue
        module = load_command(name)
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP, parents=[common])
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``numa-pin`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    Never raises (except with ``--debug``, or SystemExit from a subcommand's own code).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(selected_command(args_list))
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse: 0 after --help/--version, 2 on a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(
            f"{PROG}: error: a command is required (one of: {', '.join(COMMANDS)})", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        return int(args._run(args))
    except NumaPinError as err:
        if args.debug:
            raise
        _error_line(_subject(args, err) + f"{err.kind}: {err}")
        return EXIT_USAGE if isinstance(err, USAGE_ERRORS) else exit_code(err)
    except KeyboardInterrupt:
        if args.debug:
            raise
        _error_line("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        if args.debug:
            raise
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as err:
        if args.debug:
            raise
        _error_line(f"{type(err).__name__}: {err}")
        return EXIT_ERROR
    except Exception as err:  # the boundary: a user never sees a traceback
        if args.debug:
            raise
        _error_line(f"internal error: {type(err).__name__}: {err} (run with --debug for a traceback)")
        return EXIT_INTERNAL


def write_out(text: str) -> None:
    """Write ``text`` to stdout completely, looping over partial writes.

    With ``PYTHONUNBUFFERED`` set, ``sys.stdout.write`` goes straight to one ``write(2)``
    and silently drops the rest of a partial write; writing the bytes in a loop surfaces a
    closed pipe as BrokenPipeError instead. Raises OSError (BrokenPipeError) from stdout.
    """
    out = sys.stdout
    buffer = getattr(out, "buffer", None)
    if buffer is None:  # a plain text stream (some test harnesses)
        out.write(text)
        out.flush()
        return
    out.flush()
    view = memoryview(text.encode(getattr(out, "encoding", None) or "utf-8", errors="replace"))
    while view:
        written = buffer.write(view)
        if written is None:  # non-blocking stdout that is full
            raise BlockingIOError(errno.EAGAIN, "stdout is non-blocking and full")
        view = view[written:]
    buffer.flush()


def _subject(args: argparse.Namespace, err: NumaPinError) -> str:
    """``rejected NAME: `` or ``error NAME: `` once a command that admits (``run``) has named
    what it admits (``args.subject``), so its refusal reads as the hook's does; nothing for a
    usage error (a flag's), which stays ``numa-pin: RequestError: --flag: ...``."""
    subject = getattr(args, "subject", None)
    if subject is None or isinstance(err, USAGE_ERRORS):
        return ""
    return f"{'rejected' if isinstance(err, AdmissionError) else 'error'} {subject}: "


def _error_line(message: str) -> None:
    """One line on stderr: runs of whitespace (newlines included) become one space, and the
    remaining control characters (an escape sequence in a container id) are escaped."""
    print(f"{PROG}: {one_line(' '.join(message.split()))}", file=sys.stderr)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout replaced by an object without a real fd
        pass


if __name__ == "__main__":
    sys.exit(main())
