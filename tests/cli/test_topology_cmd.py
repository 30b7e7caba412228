"""``numa-pin topology`` and the CLI boundary: exit codes, one-line errors, lazy imports."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from numa_pin.cli import main as cli
from numa_pin.errors import AdmissionError, ConfigError, PolicyError, RequestError, SysfsError

CPU = "devices/system/cpu"
NODE = "devices/system/node"


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def _machine(root: Path, ncpus: int = 4, numa: bool = True) -> Path:
    """One socket, ``ncpus // 2`` cores with 2 threads (c and c + ncpus/2), one node."""
    half = ncpus // 2
    files = {f"{CPU}/online": f"0-{ncpus - 1}"}
    for c in range(ncpus):
        core = c % half
        topo = f"{CPU}/cpu{c}/topology"
        files[f"{topo}/physical_package_id"] = "0"
        files[f"{topo}/core_id"] = str(core)
        files[f"{topo}/thread_siblings_list"] = f"{core},{core + half}"
    if numa:
        files.update(
            {
                f"{NODE}/online": "0",
                f"{NODE}/node0/cpulist": f"0-{ncpus - 1}",
                f"{NODE}/node0/distance": "10",
                f"{NODE}/node0/meminfo": "Node 0 MemTotal: 4096 kB\nNode 0 MemFree: 2048 kB",
            }
        )
    return _write(root, files)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return _machine(tmp_path / "sys")


def test_text_output(root: Path, capsys) -> None:
    assert cli.main(["topology", "--sysfs-root", str(root)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "NUMA node 0" in out
    assert "core 0: 0,2" in out and "core 1: 1,3" in out
    assert "4096 kB" in out


def test_json_output(root: Path, capsys) -> None:
    assert cli.main(["topology", "--sysfs-root", str(root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["numa_nodes"]["0"]["cpus"] == [0, 1, 2, 3]
    assert data["numa_nodes"]["0"]["distances"] == {"0": 10}
    assert data["cpus"]["3"]["siblings"] == [1, 3] and data["cpus"]["3"]["core"] == 1
    assert data["pci_devices"] == []


@pytest.mark.parametrize(
    "proc_arg,expected_kb", [(True, 777), (False, 0)], ids=["proc-root-given", "fake-sys-no-proc"]
)
def test_proc_root_defaults_to_none_for_fake_sysfs(
    tmp_path: Path, capsys, proc_arg: bool, expected_kb: int
) -> None:
    sysfs = _machine(tmp_path / "sys", numa=False)
    proc = _write(tmp_path / "proc", {"meminfo": "MemTotal: 777 kB\nMemFree: 7 kB"})
    argv = ["topology", "--sysfs-root", str(sysfs), "--json"]
    if proc_arg:
        argv += ["--proc-root", str(proc)]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["numa_nodes"]["0"]["memory_total_kb"] == expected_kb


BROKEN = [
    (lambda r: (r / CPU / "online").unlink(), f"{CPU}/online"),
    (lambda r: (r / NODE / "node0/distance").write_text("10 20\n"), f"{NODE}/node0/distance"),
    (
        lambda r: (r / CPU / "cpu1/topology/core_id").write_text("one\n"),
        f"{CPU}/cpu1/topology/core_id",
    ),
    (
        lambda r: (r / NODE / "node0/meminfo").write_text("\n".join(["garbage"] * 3)),
        f"{NODE}/node0/meminfo",
    ),
]


@pytest.mark.parametrize(
    "breakage,rel",
    BROKEN,
    ids=["missing-file", "bad-distance-row", "garbage-int", "multiline-garbage"],
)
def test_broken_root_one_line_error(root: Path, capsys, breakage, rel: str) -> None:
    breakage(root)
    assert cli.main(["topology", "--sysfs-root", str(root)]) == 4
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("numa-pin: SysfsError: ")
    assert str(root / rel) in lines[0]


def test_broken_root_subprocess_has_no_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    proc = subprocess.run(
        [sys.executable, "-m", "numa_pin.cli.main", "topology", "--sysfs-root", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 4
    assert proc.stdout == ""
    assert proc.stderr == f"numa-pin: SysfsError: {missing / CPU / 'online'}: missing\n"


@pytest.mark.parametrize("where", ["global", "after-command"])
def test_debug_reraises(tmp_path: Path, where: str) -> None:
    argv = ["topology", "--sysfs-root", str(tmp_path / "none")]
    argv = ["--debug", *argv] if where == "global" else [*argv, "--debug"]
    with pytest.raises(SysfsError):
        cli.main(argv)


@pytest.mark.parametrize(
    "argv,code",
    [
        ([], 2),
        (["bogus"], 2),
        (["topology", "--bogus"], 2),
        (["--nope", "topology"], 2),
        (["--help"], 0),
        (["topology", "--help"], 0),
        (["--version"], 0),
    ],
    ids=[
        "no-command",
        "unknown-command",
        "unknown-option",
        "unknown-global",
        "help",
        "command-help",
        "version",
    ],
)
def test_usage_exit_codes(argv: list[str], code: int, capsys) -> None:
    assert cli.main(argv) == code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if code == 2:
        assert "numa-pin" in err and "error" in err
    if argv == ["--help"]:
        assert "topology" in out


def _raising(exc: BaseException):
    def run(args) -> int:
        raise exc

    return run


@pytest.mark.parametrize(
    "exc,code,stderr",
    [
        (
            RequestError("bad cpus value '-3'", annotation="--cpus"),
            2,
            "numa-pin: RequestError: --cpus: bad cpus value '-3'\n",
        ),
        (
            PolicyError("unknown policy 'strict'"),
            3,  # a configuration error (distinct codes, issue 10 section 5)
            "numa-pin: PolicyError: unknown policy 'strict'\n",
        ),
        (
            SysfsError("/x/y", "line one\nline two"),
            4,
            "numa-pin: SysfsError: /x/y: line one line two\n",
        ),
        (KeyboardInterrupt(), 130, "numa-pin: interrupted\n"),
        (AdmissionError("no fit"), 1, "numa-pin: AdmissionError: no fit\n"),
        (ConfigError("bad", key="policy", path="/c.yaml"), 3, "numa-pin: ConfigError: /c.yaml: policy: bad\n"),
        (ZeroDivisionError("boom\x1b[2J"), 70,
         "numa-pin: internal error: ZeroDivisionError: boom\\x1b[2J (run with --debug for a traceback)\n"),
        (
            PermissionError(13, "Permission denied", "/x/cpuset.cpus"),
            4,
            "numa-pin: PermissionError: [Errno 13] Permission denied: '/x/cpuset.cpus'\n",
        ),
    ],
    ids=["usage-error", "policy-error", "multiline-message", "ctrl-c", "rejection", "config-error", "internal-error",
         "os-error"],
)
def test_error_boundary(monkeypatch, capsys, exc: BaseException, code: int, stderr: str) -> None:
    module = importlib.import_module(cli.COMMANDS["topology"])
    monkeypatch.setattr(module, "run", _raising(exc))
    assert cli.main(["topology"]) == code
    assert capsys.readouterr().err == stderr


def test_broken_pipe_exits_quietly(tmp_path: Path) -> None:
    # enough CPUs that the JSON overflows the pipe buffer after the reader has gone
    root = _machine(tmp_path / "sys", ncpus=1024)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "numa_pin.cli.main",
            "topology",
            "--sysfs-root",
            str(root),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(16)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == cli.EXIT_BROKEN_PIPE
    assert err == ""


def test_topology_does_not_import_other_commands(root: Path) -> None:
    code = (
        "import sys\n"
        "from numa_pin.cli.main import main\n"
        "assert 'numa_pin.topology.discover' not in sys.modules\n"
        f"rc = main(['topology', '--sysfs-root', {str(root)!r}])\n"
        "heavy = sorted(m for m in sys.modules\n"
        "               if m.split('.')[0] in ('pyroute2', 'psutil', 'yaml'))\n"
        "cmds = sorted(m for m in sys.modules if m.startswith('numa_pin.cli.cmd_'))\n"
        "print(rc, heavy, cmds, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "0 [] ['numa_pin.cli.cmd_topology']"


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_command_module_contract(name: str) -> None:
    module = importlib.import_module(cli.COMMANDS[name])
    assert module.NAME == name
    assert isinstance(module.HELP, str) and module.HELP
    assert callable(module.add_arguments) and callable(module.run)


@pytest.mark.parametrize(
    "argv,selected",
    [
        (["topology", "--json"], "topology"),
        (["--debug", "topology"], "topology"),
        (["--help", "topology"], None),
        ([], None),
        (["nope"], None),
        (["--sysfs-root", "topology"], None),
    ],
    ids=["command-first", "after-debug", "help-first", "empty", "unknown", "unknown-flag-first"],
)
def test_selected_command(argv: list[str], selected: str | None) -> None:
    assert cli.selected_command(argv) == selected
