"""Hostile input ends in one line naming the file, never a hang, a crash or "internal error"
(issue 10, §2). Before each fix:

* nested JSON in the OCI state or config.json: ``numa-pin: internal error ?: RecursionError``;
* a FIFO as ``--config`` or as the bundle's config.json: the hook blocked forever;
* tens of thousands of nested ``[`` in the config YAML: the C loader could overflow its stack;
* a YAML alias bomb: the loader expanded it into a billion values.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading

import pytest

from numa_pin.entry import hook as hook_main
from numa_pin.testing.node import FakeNode


@pytest.fixture
def node(tmp_path, monkeypatch):
    fake = FakeNode(tmp_path, "laptop", parent="")
    fake.add_container("c", 77)
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NUMA_PIN_DEBUG", raising=False)
    return fake


def run(argv, stdin: bytes, capsys, seconds: float = 30.0) -> tuple[int, str]:
    """The in-process hook, failed (not hung) when it blocks for ``seconds``."""
    box: dict = {}
    worker = threading.Thread(target=lambda: box.update(rc=hook_main.run(argv, io.BytesIO(stdin))), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"the hook blocked for more than {seconds}s"
    return box["rc"], capsys.readouterr().err


def one_line(err: str, *needles: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "internal error" not in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def state(node: FakeNode, bundle) -> bytes:
    return json.dumps({"id": "h1", "bundle": str(bundle), "pid": 77}).encode()


@pytest.mark.parametrize("where", ["state", "config.json"])
@pytest.mark.parametrize("opener, closer, levels", [("[", "]", 100), ("[", "]", 200_000), ('{"a":', "}", 100_000)],
                         ids=["100-lists", "200k-lists", "100k-objects"])
def test_deeply_nested_json_is_one_hook_input_error(node, capsys, where, opener, closer, levels):
    config = node.write_config()
    bundle = node.root / "bundle"
    bundle.mkdir()
    deep = opener * levels + "1" + closer * levels
    if where == "state":
        stdin = ('{"id": "h1", "bundle": "/b", "x": ' + deep + "}").encode()
        (bundle / "config.json").write_text("{}")
    else:
        stdin = state(node, bundle)
        (bundle / "config.json").write_text('{"annotations": ' + deep + "}")
    rc, err = run(["--config", str(config), "prestart"], stdin, capsys)
    assert rc != 0
    one_line(err, "HookInputError", "nested more than 64 levels deep")


def test_a_fifo_as_the_bundle_config_json_is_refused(node, capsys):
    config = node.write_config()
    bundle = node.root / "bundle"
    bundle.mkdir()
    os.mkfifo(bundle / "config.json")
    rc, err = run(["--config", str(config), "prestart"], state(node, bundle), capsys)
    assert rc != 0
    one_line(err, "HookInputError", str(bundle / "config.json"), "a FIFO")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_fifo_as_the_config_is_refused(node, capsys, monkeypatch, how):
    fifo = node.root / "config.yaml"
    os.mkfifo(fifo)
    bundle = node.root / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text("{}")
    if how == "env":
        monkeypatch.setenv("NUMA_PIN_CONFIG", str(fifo))
    argv = ["--config", str(fifo), "prestart"] if how == "flag" else ["prestart"]
    rc, err = run(argv, state(node, bundle), capsys)
    assert rc != 0
    one_line(err, "ConfigError", str(fifo), "a FIFO")


def _alias_bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("policy_options: " + "[" * 100 + "]" * 100 + "\n", "nested more than 64 levels deep"),
        ("".join("  " * i + f"k{i}:\n" for i in range(100)) + "  " * 100 + "v\n", "nested more than 64 levels deep"),
        (_alias_bomb(), "once aliases are expanded"),
    ],
    ids=["flow-nesting", "block-nesting", "alias-bomb"],
)
def test_config_shape_is_bounded(node, capsys, text, needle):
    config = node.root / "config.yaml"
    config.write_text(text)
    rc, err = run(["--config", str(config), "prestart"], b'{"id": "h1", "bundle": "/b", "pid": 77}', capsys)
    assert rc != 0
    one_line(err, "ConfigError", str(config), needle)


def test_fifty_thousand_nested_brackets_do_not_crash_a_fresh_hook(node, tmp_path):
    """In a subprocess, so a stack overflow in libyaml's composer would show as a signal."""
    config = tmp_path / "deep.yaml"
    config.write_text("policy: " + "[" * 50_000 + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "numa_pin.entry.hook", "--config", str(config), "prestart"],
        input=b'{"id": "h1", "bundle": "/b", "pid": 77}', capture_output=True, timeout=120,
        env={**os.environ, "NUMA_PIN_NO_AGENT": "1", "NUMA_PIN_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode > 0, proc.returncode  # a negative code is a signal
    one_line(proc.stderr.decode(), "ConfigError", str(config), "invalid YAML")
