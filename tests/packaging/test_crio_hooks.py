"""The hooks files in this checkout against CRI-O's hook loader (``crio_hooks``), and the podman
drop-in that keeps the podman-only precreate file out of CRI-O's directory.

The deb's own files (what ``make deb`` puts where CRI-O reads) are checked in ``test_deb.py``.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from crio_hooks import CRIO_DEFAULT_DIRS, PODMAN_EXTENSION_STAGES, check_dir, check_file

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"
DROP_IN = PACKAGING / "podman" / "containers.conf.d" / "numa-pin.conf"
#: where the deb puts the podman-only hooks (build-deb.sh)
PODMAN_HOOKS = "/usr/share/numa-pin/podman/hooks.d"
PODMAN_DEFAULT_DIR = "/usr/share/containers/oci/hooks.d"

GOOD = {"version": "1.0.0", "hook": {"path": "/usr/bin/hook", "args": ["hook", "prestart"], "timeout": 30},
        "when": {"always": True}, "stages": ["prestart"]}


def _with(**changes: object) -> dict:
    doc = json.loads(json.dumps(GOOD))
    for dotted, value in changes.items():
        node = doc
        *parents, last = dotted.split("__")
        for key in parents:
            node = node[key]
        if value is _DROP:
            del node[last]
        else:
            node[last] = value
    return doc


_DROP = object()

# (doc, the words of CRI-O's refusal or None when it loads the file)
CASES = {
    "oci-stage": (GOOD, None),
    "every-oci-stage": (_with(stages=["createContainer", "createRuntime", "prestart", "poststart", "poststop",
                                      "startContainer"]), None),
    "empty-stages": (_with(stages=[]), None),
    "unknown-keys-ignored": (_with(extra={"x": 1}, hook__extra="y"), None),
    "annotation-regexps": (_with(when={"annotations": {"^numa-pin\\.io/.*$": ".+"}}), None),
    "precreate": (_with(stages=["precreate"]), "unknown stage 'precreate'"),
    "precreate-among-others": (_with(stages=["prestart", "precreate"]), "unknown stage 'precreate'"),
    "stage-key-in-other-case": (_with(stages=_DROP, Stages=["precreate"]), "unknown stage 'precreate'"),
    "stages-missing": (_with(stages=_DROP), "missing required property: stages"),
    "stages-null": (_with(stages=None), "missing required property: stages"),
    "old-version": (_with(version="0.1.0"), "only 1.0.0"),
    "version-missing": (_with(version=_DROP), "only 1.0.0"),
    "path-missing": (_with(hook__path=_DROP), "missing required property: hook.path"),
    "path-absent": (_with(hook__path="/usr/bin/absent"), "does not exist"),
    "timeout-string": (_with(hook__timeout="30"), "type *int"),
    "timeout-fraction": (_with(hook__timeout=30.5), "type *int"),
    "always-string": (_with(when={"always": "true"}), "type *bool"),
    "args-not-strings": (_with(hook__args=["hook", 1]), "type []string"),
    "look-ahead": (_with(when={"commands": ["^(?=x)"]}), "invalid command"),
    "bad-regexp": (_with(when={"annotations": {"(": ""}}), "invalid annotation key"),
    "not-an-object": ([GOOD], "not a JSON object"),
}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A package root holding the one program the cases name."""
    program = tmp_path / "root" / "usr/bin/hook"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    return tmp_path / "root"


@pytest.mark.parametrize(("doc", "refusal"), CASES.values(), ids=CASES.keys())
def test_the_checker_follows_the_loader(tmp_path: Path, root: Path, doc: object, refusal: str | None) -> None:
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(doc))
    if refusal is None:
        check_file(path, root)
    else:
        with pytest.raises(ValueError, match=re.escape(refusal)):
            check_file(path, root)


def test_the_checker_reads_json_files_only(tmp_path: Path, root: Path) -> None:
    folder = tmp_path / "hooks.d"
    folder.mkdir()
    (folder / "notes.txt").write_text("stages: precreate")
    (folder / "dangling.json").symlink_to(tmp_path / "absent.json")
    (folder / "a.json").write_text(json.dumps(GOOD))
    assert check_dir(folder, root) == ["a.json"]


def _checkout_root(tmp_path: Path) -> Path:
    """A root where the checkout's files find their program (``/usr/local/bin/numa-pin-hook``)."""
    program = tmp_path / "usr/local/bin/numa-pin-hook"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    return tmp_path


def test_the_shared_hooks_are_files_crio_loads(tmp_path: Path) -> None:
    """``packaging/hooks.d`` is what docs/install.md tells CRI-O users to install, whole."""
    assert check_dir(PACKAGING / "hooks.d", _checkout_root(tmp_path)) == ["numa-pin-release.json", "numa-pin.json"]


def test_the_precreate_hook_is_podmans_alone(tmp_path: Path) -> None:
    """The precreate file would stop CRI-O; podman, with its extension stages, loads it."""
    root = _checkout_root(tmp_path)
    folder = PACKAGING / "podman" / "hooks.d"
    with pytest.raises(ValueError, match="unknown stage 'precreate'"):
        check_dir(folder, root)
    assert check_dir(folder, root, PODMAN_EXTENSION_STAGES) == ["numa-pin-precreate.json"]


def test_the_drop_in_adds_podmans_directory_and_keeps_the_default() -> None:
    """podman reads ``hooks_dir`` whole from the last file that sets it (4.3 and 5.x), so the
    drop-in lists podman's default directory (what it reads without one) before numa-pin's;
    CRI-O's default directories do not include numa-pin's podman directory."""
    engine = tomllib.loads(DROP_IN.read_text())["engine"]
    assert engine["hooks_dir"] == [PODMAN_DEFAULT_DIR, PODMAN_HOOKS]
    assert PODMAN_HOOKS not in CRIO_DEFAULT_DIRS
    assert set(engine) == {"hooks_dir"}, "the drop-in changes nothing else in podman"
