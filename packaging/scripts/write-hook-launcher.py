#!/usr/bin/env python3
"""Write the ``numa-pin-hook`` (or ``numa-pin-runc``) command: PYTHON started with ``-S``, the site directories listed.

A runtime starts the hook on every container start, and the ``site`` module is a good part of
an interpreter's start: it reads the site directories and runs their ``.pth`` files (about 3 ms
of a 9-11 ms start on Debian 12, with a venv or with Debian's own python3). The hook needs
nothing ``site`` does but the directories it adds to ``sys.path``, so this launcher skips
``site`` and lists those directories, read from PYTHON when the launcher is written (a venv's
``site-packages`` and an editable checkout's ``src``; Debian's ``dist-packages``).
``PYTHONPATH`` still applies (``-S``, not ``-I``).

Usage: write-hook-launcher.py PYTHON OUT [PACKAGE_DIR]

OUT's file name says which command it is (:data:`COMMANDS`): ``numa-pin-runc``, Docker's runtime
in front of runc, starts on every runc call of every container (``state``, ``start``, ``kill``,
``delete``), so it gets the same launcher.

PACKAGE_DIR (for a package being built): where numa_pin will be installed; it must be one of
the site directories. Without it, numa_pin must already be importable from one of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

#: the commands this writes, by file name: the module whose ``main`` each runs
COMMANDS = {"numa-pin-hook": "numa_pin.entry.hook", "numa-pin-runc": "numa_pin.entry.runc"}

TEMPLATE = """#!{python} -S
# {name}, started without the site module (a runtime starts it on every container start);
# the directories site would add, read from {python} when this file was written:
import sys

sys.path += {dirs!r}

from {module} import main

sys.exit(main())
"""


def site_dirs(python: str) -> list[str]:
    """The ``sys.path`` entries ``site`` adds for ``python``, in its order."""
    def path(*flags: str) -> list[str]:
        out = subprocess.run([python, *flags, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                             capture_output=True, text=True, check=True, env={"PATH": os.defpath})
        return json.loads(out.stdout)

    bare = set(path("-S", "-E"))
    return [d for d in path("-E") if d not in bare]


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: write-hook-launcher.py PYTHON OUT [PACKAGE_DIR]", file=sys.stderr)
        return 2
    python, out = argv[:2]
    name = os.path.basename(out)
    module = COMMANDS.get(name, COMMANDS["numa-pin-hook"])
    dirs = site_dirs(python)
    found = argv[2] in dirs if len(argv) == 3 else any(os.path.isdir(os.path.join(d, "numa_pin")) for d in dirs)
    if not found:
        print(f"write-hook-launcher: numa_pin would be in none of {python}'s site directories {dirs}",
              file=sys.stderr)
        return 1
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(TEMPLATE.format(python=python, dirs=dirs, name=name if name in COMMANDS else "numa-pin-hook",
                                 module=module))
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
