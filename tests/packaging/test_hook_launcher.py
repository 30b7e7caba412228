"""``packaging/scripts/write-hook-launcher.py``: the ``numa-pin-hook`` command without ``site``.

The oracle for the directories is the interpreter itself: what ``sys.path`` holds with
``site`` minus what it holds without. The launcher must then admit and release on a fake node
exactly as the in-process hook does, and never import ``site``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from numa_pin.ledger.store import Ledger
from numa_pin.testing.node import FakeNode

REPO = Path(__file__).resolve().parents[2]
WRITER = REPO / "packaging/scripts/write-hook-launcher.py"


def _path(*flags: str) -> list[str]:
    out = subprocess.run([sys.executable, *flags, "-E", "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                         capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def _launcher(tmp_path: Path, name: str = "numa-pin-hook") -> Path:
    out = tmp_path / name
    subprocess.run([sys.executable, str(WRITER), sys.executable, str(out)], check=True, timeout=60)
    return out


def test_the_launcher_lists_what_site_would_add(tmp_path):
    lines = _launcher(tmp_path).read_text().splitlines()
    assert lines[0] == f"#!{sys.executable} -S"
    (listed,) = [line for line in lines if line.startswith("sys.path += ")]
    without_site = set(_path("-S"))
    assert eval(listed.removeprefix("sys.path += ")) == [d for d in _path() if d not in without_site]


def test_the_installed_hook_is_the_launcher():
    """``make venv`` writes it over the console script pip made."""
    hook = Path(sys.executable).parent / "numa-pin-hook"
    assert hook.read_text().splitlines()[0] == f"#!{sys.executable} -S", \
        "numa-pin-hook is pip's console script: make venv writes the launcher over it"


def test_the_launcher_admits_and_releases_without_site(tmp_path, tmp_path_factory):
    node = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    node.add_container("c0", 5000)
    config = node.write_config(policy="single-numa-node")
    launcher = _launcher(tmp_path)
    # the launcher's own code, run by the same interpreter with -S: what did the process import?
    probe = tmp_path / "probe.py"
    probe.write_text(launcher.read_text().replace("sys.exit(main())",
                                                  "rc = main()\nprint(' '.join(sorted(sys.modules)))\nsys.exit(rc)"))
    env = {"NUMA_PIN_NO_AGENT": "1", "NUMA_PIN_CACHE_DIR": str(node.cache_dir), "PATH": "/usr/bin:/bin"}
    state = node.oci_state("c0", 5000, {"numa-pin.io/cpus": "2"})
    admitted = subprocess.run([sys.executable, "-S", str(probe), "--config", str(config), "prestart"], input=state,
                              capture_output=True, env=env, timeout=120)
    assert (admitted.returncode, admitted.stderr) == (0, b"")
    assert "site" not in admitted.stdout.decode().split()
    assert len(Ledger(node.state_dir).read().grants["c0"].cpus) == 2
    released = subprocess.run([str(launcher), "--config", str(config), "poststop"], input=state,
                              capture_output=True, env=env, timeout=120)
    assert (released.returncode, released.stderr) == (0, b"")
    assert Ledger(node.state_dir).read().grants == {}


def test_the_runc_launcher_execs_runc(tmp_path):
    """``numa-pin-runc``'s launcher runs :mod:`numa_pin.entry.runc` without site; a passthrough
    subcommand replaces it with runc (same pid, same arguments)."""
    launcher = _launcher(tmp_path, "numa-pin-runc")
    text = launcher.read_text()
    assert text.startswith(f"#!{sys.executable} -S\n") and "from numa_pin.entry.runc import main" in text
    runc = tmp_path / "runc"
    runc.write_text(f"#!{sys.executable} -S\nimport json, os, sys\nprint(json.dumps([os.getpid(), sys.argv[1:]]))\n")
    runc.chmod(0o755)
    args = ["--root", "/run/r", "--log-format", "json", "state", "c0"]
    env = {"NUMA_PIN_RUNC": str(runc), "PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:  # this checkout's sources, as the tests run them
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = subprocess.Popen([str(launcher), *args], stdout=subprocess.PIPE, text=True, env=env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and json.loads(out) == [proc.pid, args]
