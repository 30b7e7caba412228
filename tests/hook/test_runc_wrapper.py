"""``numa-pin-runc`` in front of a fake runc that records its argv, pid and the config it saw.

Oracles: the fake runc's own record (arguments byte for byte, its pid equal to the wrapper's
when it was exec'd, the bundle's config.json as runc read it) and the ledger.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import numa_pin
from numa_pin.base.cpuset import parse_list
from numa_pin.entry.runc import find_runc
from numa_pin.entry.runcargs import Invocation, parse_argv
from numa_pin.entry.runcstage import env_annotations, known_keys, log_errors
from numa_pin.ledger.store import Ledger
from numa_pin.testing.node import FakeNode

CID = "d680dbfc38086ec0adbb6455398a7277789ba05de692609ea79f57db512b07dc"
SRC = str(Path(numa_pin.__file__).resolve().parents[1])
#: what Docker 20.10's shim passed runc on this project's CI (the path parts shortened)
GLOBALS = ["--root", "/run/docker/runtime-runc/moby", "--log", "/run/t/log.json", "--log-format", "json"]

FAKE_RUNC = """#!{python} -S
import json, os, sys
args = sys.argv[1:]
seen = None
for flag in ("--bundle", "-b"):
    if flag in args and os.path.isdir(args[args.index(flag) + 1]):
        with open(os.path.join(args[args.index(flag) + 1], "config.json")) as fh:
            seen = json.load(fh)
with open(os.environ["FAKE_RUNC_LOG"], "a") as fh:
    fh.write(json.dumps({{"pid": os.getpid(), "argv": args, "config": seen}}) + "\\n")
sys.exit(int(os.environ.get("FAKE_RUNC_STATE_RC" if "state" in args else "FAKE_RUNC_RC", "0")))
"""

WRAPPER = """#!{python}
import sys
sys.path.insert(0, {src!r})
from numa_pin.entry.runc import main
sys.exit(main())
"""


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([*GLOBALS, "create", "--bundle", "/b", "--pid-file", "/b/init.pid", CID],
         Invocation(tuple(GLOBALS), "create", CID, "/b")),
        (["--root", "/r", "--systemd-cgroup", "--debug", "create", "--bundle", "/b", "--console-socket", "/s",
          "--pid-file", "/p", "c1"], Invocation(("--root", "/r", "--systemd-cgroup", "--debug"), "create", "c1", "/b")),
        (["-root=/r", "--log-format=json", "create", "-b", "/b", "c1"],
         Invocation(("-root=/r", "--log-format=json"), "create", "c1", "/b")),
        (["create", "--bundle=/b", "c1"], Invocation((), "create", "c1", "/b")),
        (["create", "c1", "--bundle", "/b", "--no-pivot"], Invocation((), "create", "c1", "/b")),
        (["create", "--no-pivot", "--preserve-fds", "2", "c1"], Invocation((), "create", "c1", None)),
        (["create", "--", "-odd"], Invocation((), "create", "-odd", None)),
        (["--log", "create", "delete", "c1"], Invocation(("--log", "create"), "delete", "c1", None)),
        ([*GLOBALS, "delete", "--force", CID], Invocation(tuple(GLOBALS), "delete", CID, None)),
        (["--root", "/r", "state", "c1"], Invocation(("--root", "/r"), "state", None, None)),
        (["--version"], Invocation(("--version",), None)),
        (["create", "--bundle", "/b"], Invocation((), "create", None, "/b")),
    ],
    ids=["docker-create", "systemd-console", "equals-one-dash", "bundle-equals", "flags-after-id",
         "default-bundle", "double-dash", "log-value-named-create", "docker-delete", "state", "version-only",
         "create-without-id"],
)
def test_runc_command_lines_parse_as_runc_parses_them(argv, expected):
    assert repr(parse_argv(argv)) == repr(expected)


@pytest.mark.parametrize(
    "env, expected",
    [
        (["NUMA_PIN_IO_CPUS=2", "PATH=/bin"], {"numa-pin.io/cpus": "2"}),
        (["NUMA_PIN_IO_HUGEPAGES_2MI=1Gi", "NUMA_PIN_IO_MEMORY_POLICY=bind"],
         {"numa-pin.io/hugepages-2Mi": "1Gi", "numa-pin.io/memory-policy": "bind"}),
        (["NUMA_PIN_IO_CPUS=1", "NUMA_PIN_IO_CPUS=3"], {"numa-pin.io/cpus": "3"}),
        (["NUMA_PIN_IO_BOGUS_KEY=1"], {"numa-pin.io/bogus-key": "1"}),
        (["NUMA_PIN_CPUS=0-3", "NUMA_PIN_IO_", "NUMA_PIN_IO_CPUS", 7], {}),
    ],
    ids=["cpus", "mixed-case-keys", "last-wins", "unknown-kept-for-refusal", "not-requests"],
)
def test_container_environment_becomes_annotations(env, expected):
    assert env_annotations(env, known_keys()) == expected


@pytest.fixture
def rig(tmp_path, monkeypatch):
    """A fake Docker node (containers under /docker), the fake runc and the wrapper script."""
    fake = FakeNode(tmp_path, "laptop", parent="docker")
    cfg = fake.write_config(tmp_path / "config.yaml", settled=False, policy="restricted")
    runc = tmp_path / "bin" / "runc"
    runc.parent.mkdir()
    runc.write_text(FAKE_RUNC.format(python=sys.executable))
    runc.chmod(0o755)
    wrapper = tmp_path / "numa-pin-runc"
    wrapper.write_text(WRAPPER.format(python=sys.executable, src=SRC))
    wrapper.chmod(0o755)
    log = tmp_path / "runc.log"
    env = {"PATH": f"{runc.parent}:/usr/bin:/bin", "NUMA_PIN_CONFIG": str(cfg),
           "NUMA_PIN_CACHE_DIR": str(tmp_path / "cache"), "FAKE_RUNC_LOG": str(log)}
    bundle = tmp_path / "bundle"
    bundle.mkdir()

    class Rig:
        node = fake

        @staticmethod
        def config(env_vars=(), annotations=None, cgroups_path=f"/docker/{CID}") -> Path:
            doc = {"ociVersion": "1.0.2-dev", "process": {"args": ["sh"], "env": ["PATH=/bin", *env_vars]},
                   "linux": {"cgroupsPath": cgroups_path, "resources": {"pids": {"limit": 99}}}}
            if annotations is not None:
                doc["annotations"] = annotations
            (bundle / "config.json").write_text(json.dumps(doc))
            return bundle / "config.json"

        @staticmethod
        def run(args, **extra_env) -> tuple[subprocess.CompletedProcess[str], int]:
            proc = subprocess.Popen([str(wrapper), *args], env={**env, **extra_env}, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            out, err = proc.communicate(timeout=60)
            return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid

        @staticmethod
        def calls() -> list[dict]:
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

        @staticmethod
        def grants() -> dict:
            return dict(Ledger(str(fake.state_dir)).read().grants)

    Rig.bundle = bundle
    return Rig


def _create(rig) -> list[str]:
    log = ["--log", str(rig.bundle.parent / "log.json"), "--log-format", "json"]
    return [*GLOBALS[:2], *log, "--systemd-cgroup", "create", "--bundle", str(rig.bundle), "--pid-file",
            str(rig.bundle / "init.pid"), "--console-socket", "/run/t/console.sock", CID]


@pytest.mark.parametrize(
    "args",
    [[*GLOBALS, "start", CID], ["--root", "/r", "--debug", "state", CID], [*GLOBALS, "kill", CID, "9"],
     ["--version"], [*GLOBALS, "create", "--bundle", "/nonexistent"], []],
    ids=["start", "state", "kill", "version", "create-without-id", "no-args"],
)
def test_other_subcommands_exec_runc_with_the_same_argv(rig, args):
    done, pid = rig.run(args)
    assert done.returncode == 0, done.stderr
    (call,) = rig.calls()
    assert call["argv"] == args and call["pid"] == pid, "runc replaced the wrapper's process (exec)"


def test_create_writes_the_grant_into_config_json_before_runc_reads_it(rig):
    rig.config(env_vars=["NUMA_PIN_IO_CPUS=2"])
    done, _ = rig.run(_create(rig))
    assert done.returncode == 0, done.stderr
    grant = rig.grants()[CID]
    assert grant.pid is None and len(grant.cpus) == 2
    (call,) = rig.calls()
    assert call["argv"] == _create(rig)
    seen = call["config"]
    assert parse_list(seen["linux"]["resources"]["cpu"]["cpus"]) == grant.cpus
    assert seen["linux"]["resources"]["pids"] == {"limit": 99}, "the rest of the config is kept"
    assert seen["annotations"] == {"numa-pin.io/cpus": "2"}
    assert json.loads((rig.bundle / "config.json").read_text()) == seen
    assert [p.name for p in rig.bundle.iterdir()] == ["config.json"], "no temporary file left"


def test_an_annotation_wins_over_the_environment(rig):
    rig.config(env_vars=["NUMA_PIN_IO_CPUS=3"], annotations={"numa-pin.io/cpus": "1"})
    done, _ = rig.run(_create(rig))
    assert done.returncode == 0, done.stderr
    assert len(rig.grants()[CID].cpus) == 1


def test_a_container_asking_nothing_keeps_its_config_untouched(rig):
    path = rig.config()
    before = path.read_bytes(), path.stat().st_ino
    done, _ = rig.run(_create(rig))
    assert done.returncode == 0, done.stderr
    assert (path.read_bytes(), path.stat().st_ino) == before
    assert rig.grants() == {} and len(rig.calls()) == 1


@pytest.mark.parametrize(
    "env_vars, cgroups_path, kind",
    [(["NUMA_PIN_IO_CPUS=64"], f"/docker/{CID}", "rejected {cid}: TopologyAffinityError"),
     (["NUMA_PIN_IO_CPUZ=1"], f"/docker/{CID}", "error {cid}: RequestError: numa-pin.io/cpuz"),
     (["NUMA_PIN_IO_CPUS=1"], "/docker/another-container", "error {cid}: HookInputError")],
    ids=["no-fit", "unknown-variable", "cgroups-path-names-another-container"],
)
def test_a_refusal_is_one_line_runc_never_runs_and_nothing_is_held(rig, env_vars, cgroups_path, kind):
    path = rig.config(env_vars=env_vars, cgroups_path=cgroups_path)
    before = path.read_bytes()
    done, _ = rig.run(_create(rig))
    assert done.returncode == 1
    assert done.stderr.startswith("numa-pin: " + kind.format(cid=CID)) and done.stderr.count("\n") == 1, done.stderr
    assert rig.calls() == [] and rig.grants() == {} and path.read_bytes() == before
    logged = json.loads((rig.bundle.parent / "log.json").read_text().splitlines()[-1])
    assert (logged["level"], logged["msg"] + "\n") == ("error", done.stderr), "the shim shows runc's last logged error"


@pytest.mark.parametrize(
    "log_format, parse",
    [("json", lambda line: json.loads(line)["msg"]),
     ("text", lambda line: json.loads(line.split(" msg=", 1)[1]))],
    ids=["json", "text"],
)
def test_refusals_are_logged_in_runcs_log_format(tmp_path, log_format, parse):
    log = tmp_path / "log"
    log.write_text("earlier line\n")
    lines = ['numa-pin: rejected c: TopologyAffinityError: "quoted" \\ and more']
    log_errors(str(log), log_format, lines)
    written = log.read_text().splitlines()
    assert written[0] == "earlier line" and [parse(line) for line in written[1:]] == lines
    assert "level" + ("\": \"error" if log_format == "json" else "=error") in written[1]


@pytest.mark.parametrize(
    "state_rc, held", [(1, False), (0, True)], ids=["runc-left-nothing", "runc-kept-the-container"],
)
def test_a_failed_runc_create_releases_what_runc_does_not_know(rig, state_rc, held):
    rig.config(env_vars=["NUMA_PIN_IO_CPUS=1"])
    done, _ = rig.run(_create(rig), FAKE_RUNC_RC="3", FAKE_RUNC_STATE_RC=str(state_rc))
    assert done.returncode == 3
    assert (CID in rig.grants()) is held
    assert [c["argv"][len(GLOBALS) + 1] for c in rig.calls()] == ["create", "state"]
    assert rig.calls()[1]["argv"] == [*_create(rig)[:len(GLOBALS) + 1], "state", CID], "with runc's global flags"


@pytest.mark.parametrize(
    "runc_rc, state_rc, held",
    [(0, 0, False), (1, 1, False), (1, 0, True)],
    ids=["deleted", "failed-but-gone", "failed-container-still-there"],
)
def test_delete_releases_after_runc_once_runc_no_longer_knows_the_container(rig, runc_rc, state_rc, held):
    rig.config(env_vars=["NUMA_PIN_IO_CPUS=1"])
    assert rig.run(_create(rig))[0].returncode == 0
    delete = [*GLOBALS, "delete", "--force", CID]
    done, _ = rig.run(delete, FAKE_RUNC_RC=str(runc_rc), FAKE_RUNC_STATE_RC=str(state_rc))
    assert done.returncode == runc_rc
    assert (CID in rig.grants()) is held
    assert rig.calls()[1]["argv"] == delete


def test_runc_is_never_the_wrapper_itself(tmp_path):
    real = tmp_path / "real" / "runc"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    me = tmp_path / "numa-pin-runc"
    me.write_text("#!/bin/sh\n")
    me.chmod(0o755)
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "runc").symlink_to(me)
    path = f"{loop}:{real.parent}"
    assert find_runc({"PATH": path}, str(me)) == str(real)
    assert find_runc({"PATH": path, "NUMA_PIN_RUNC": str(loop / "runc")}, str(me)) is None
    assert find_runc({"PATH": path, "NUMA_PIN_RUNC": str(real)}, str(me)) == str(real)
    assert find_runc({"PATH": str(loop)}, str(me)) is None


def test_no_runc_is_one_line_and_exit_127(rig):
    done, _ = rig.run(["state", CID], PATH="/nonexistent", NUMA_PIN_RUNC="")
    assert done.returncode == 127 and done.stderr.count("\n") == 1 and "no runc" in done.stderr
    assert os.path.exists(rig.bundle)


def test_a_runc_that_cannot_be_executed_is_one_line_and_exit_127(rig, tmp_path):
    broken = tmp_path / "broken-runc"
    broken.write_bytes(b"\x00\x01 not a program")
    broken.chmod(0o755)
    done, _ = rig.run(["state", CID], NUMA_PIN_RUNC=str(broken))
    assert done.returncode == 127 and done.stderr.count("\n") == 1 and "cannot run" in done.stderr, done.stderr
