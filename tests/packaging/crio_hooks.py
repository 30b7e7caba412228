"""CRI-O's load-time rules for a hooks directory, written out as a checker for the tests.

CRI-O builds its hook manager once at start-up (``hooks.New(ctx, config.HooksDir, []string{})``
in cri-o's ``internal/lib/container_server.go``: no extension stages), and a file its loader
refuses stops CRI-O (``level=fatal msg="unknown stage \\"precreate\\""``). The loader is
containers/common ``pkg/hooks`` (vendored by CRI-O as ``go.podman.io/common``): ``read.go``
(``ReadDir``, ``Read``), ``1.0.0/hook.go`` (``Hook``, ``Validate``) and ``1.0.0/when.go``.
What it does, and so what :func:`check_dir` checks:

* every entry of the directory whose name ends in ``.json`` is read (others are skipped; a
  dangling link is skipped too); ``crio.conf``'s ``hooks_dir`` lists the directories, by
  default only ``/usr/share/containers/oci/hooks.d`` (``pkg/config/config.go``);
* the file is a JSON object; its ``version`` picks the reader: ``1.0.0``, or ``0.1.0`` and a
  missing version for the old format (numa-pin ships none: refused here as unmodelled);
* Go's ``encoding/json`` decodes it into ``{version string, hook {path string, args []string,
  env []string, timeout *int}, when {always *bool, annotations map[string]string, commands
  []string, hasBindMounts *bool}, stages []string}``: keys match case-insensitively (the last
  one wins), unknown keys are ignored, a value of the wrong JSON type is an error, and
  ``null`` leaves the field unset;
* ``Validate``: ``version`` is ``1.0.0``; ``hook.path`` is not empty and exists (numa-pin's
  own check here, against the package's root, since a missing program is skipped quietly
  rather than loaded); every ``when.annotations`` key and value and every ``when.commands``
  entry compiles as a Go (RE2) regular expression; ``stages`` is present (``null`` is not);
  every stage is one of the OCI stages below (no extension stage: no ``precreate``).

The regular expressions are compiled with Python's ``re`` after refusing what RE2 lacks
(look-around, back-references, possessive and atomic groups), which is close enough for the
patterns a hooks file holds.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

#: ``validStages`` of containers/common ``pkg/hooks/1.0.0/hook.go``
OCI_STAGES = frozenset({"createContainer", "createRuntime", "prestart", "poststart", "poststop", "startContainer"})
#: the extension stages podman's libpod passes (``container_internal.go``, ``setupOCIHooks``)
PODMAN_EXTENSION_STAGES = ("precreate", "poststop")
#: the directory CRI-O reads when ``crio.conf`` does not set ``hooks_dir``
CRIO_DEFAULT_DIRS = ("/usr/share/containers/oci/hooks.d",)
#: Perl syntax RE2 (Go's regexp) refuses
_NOT_RE2 = re.compile(r"\(\?(?:[=!>]|<[=!])|\\[1-9]|[*+?}]\+")

_STRING, _STRINGS, _INT, _BOOL, _STRING_MAP = "string", "[]string", "*int", "*bool", "map[string]string"
_HOOK = {"path": _STRING, "args": _STRINGS, "env": _STRINGS, "timeout": _INT}
_WHEN = {"always": _BOOL, "annotations": _STRING_MAP, "commands": _STRINGS, "hasbindmounts": _BOOL}


def _fields(doc: object, shape: dict[str, object], where: str) -> dict[str, object]:
    """``doc`` decoded the way Go decodes a JSON object into a struct of ``shape``."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: cannot unmarshal {type(doc).__name__} into a struct")
    out: dict[str, object] = {}
    for key, value in doc.items():
        name = key.lower()
        if name not in shape or value is None:
            continue
        out[name] = _typed(value, shape[name], f"{where}.{key}")
    return out


def _typed(value: object, kind: object, where: str) -> object:
    """``value`` checked against one Go type of the hook file."""
    if isinstance(kind, dict):
        return _fields(value, kind, where)
    ok = {
        _STRING: isinstance(value, str),
        _BOOL: isinstance(value, bool),
        _INT: isinstance(value, int) and not isinstance(value, bool),
        _STRINGS: isinstance(value, list) and all(isinstance(v, str) for v in value),
        _STRING_MAP: isinstance(value, dict) and all(isinstance(v, str) for v in value.values()),
    }[str(kind)]
    if not ok:
        raise ValueError(f"{where}: cannot unmarshal {json.dumps(value)} into Go value of type {kind}")
    return value


def _go_regexp(pattern: str, what: str) -> None:
    if _NOT_RE2.search(pattern):
        raise ValueError(f"invalid {what} {pattern!r}: syntax Go's regexp does not have")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid {what} {pattern!r}: {exc}") from exc


def check_file(path: Path, root: Path, extension_stages: tuple[str, ...] = ()) -> None:
    """Raise ``ValueError`` naming the rule when CRI-O would refuse the hooks file ``path``.

    ``root`` is where absolute paths in the file (``hook.path``) are looked up;
    ``extension_stages`` are the caller's extra stages (none for CRI-O; podman passes
    :data:`PODMAN_EXTENSION_STAGES`).
    """
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path.name}: version check: not a JSON object")
    version = _fields(doc, {"version": _STRING}, path.name).get("version", "")
    if version != "1.0.0":
        raise ValueError(f"{path.name}: hook version {version!r}: only 1.0.0 files are modelled here")
    hook = _fields(doc, {"version": _STRING, "hook": _HOOK, "when": _WHEN, "stages": _STRINGS}, path.name)
    program = str(dict(hook.get("hook", {})).get("path", ""))  # type: ignore[call-overload]
    if not program:
        raise ValueError(f"{path.name}: missing required property: hook.path")
    if not os.path.lexists(root / program.lstrip("/")):
        raise ValueError(f"{path.name}: hook.path {program} does not exist")
    when = dict(hook.get("when", {}))  # type: ignore[call-overload]
    for key, value in dict(when.get("annotations", {})).items():
        _go_regexp(key, "annotation key")
        _go_regexp(value, "annotation value")
    for command in list(when.get("commands", [])):
        _go_regexp(command, "command")
    if "stages" not in hook:
        raise ValueError(f"{path.name}: missing required property: stages")
    for stage in list(hook["stages"]):  # type: ignore[call-overload]
        if stage not in OCI_STAGES and stage not in extension_stages:
            raise ValueError(f"{path.name}: unknown stage {stage!r}")


def check_dir(folder: Path, root: Path, extension_stages: tuple[str, ...] = ()) -> list[str]:
    """The names of the files the loader reads in ``folder``, each checked; raise on the first it refuses."""
    read = []
    for entry in sorted(folder.iterdir()):
        if not entry.name.endswith(".json") or (entry.is_symlink() and not entry.exists()):
            continue
        check_file(entry, root, extension_stages)
        read.append(entry.name)
    return read
