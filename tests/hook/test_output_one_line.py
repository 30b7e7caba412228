"""Every message is one line with control characters escaped: hook stderr, reason files, syslog,
the CLI's error boundary and ``status`` / ``explain`` output (issue 10, section 4).

Before: a newline in a container id or a ``PCIDEVICE_*`` value printed a second, forged
``numa-pin: ...`` line; a pod id sent escape codes to the operator's terminal.
"""

from __future__ import annotations

import io
import json

import pytest

from numa_pin.cli.main import main as cli_main
from numa_pin.entry import hook as hook_main
from numa_pin.testing.node import FakeNode

FORGED = "\nnuma-pin: admitted forged: cpus 0-3 mems 0 (none/container)\x1b[2J"


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


def assert_one_safe_line(text: str) -> None:
    got = lines(text)
    assert len(got) == 1, text
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in got[0]), got[0]


@pytest.fixture
def node(tmp_path, monkeypatch):
    fake = FakeNode(tmp_path, "gpu8-sriov", parent="")
    fake.add_container("c", 77)
    config = fake.write_config(settled=False, policy="single-numa-node", syslog=True,
                               devices={"intel.com/sriov": [{"drivers": ["iavf"]}]})
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    logged: list[str] = []
    monkeypatch.setattr("syslog.syslog", lambda prio, msg: logged.append(msg))
    return fake, config, logged


def hook(config, fake, cid: str, spec: dict, stage: str = "prestart") -> int:
    bundle = fake.root / "bundle"
    bundle.mkdir(exist_ok=True)
    # the pid's cgroup is /c: the bundle says so, as runtimes do
    (bundle / "config.json").write_text(json.dumps({**spec, "linux": {"cgroupsPath": "/c"}}))
    state = json.dumps({"id": cid, "bundle": str(bundle), "pid": 77})
    return hook_main.run(["--config", str(config), stage], io.BytesIO(state.encode()))


@pytest.mark.parametrize(
    "cid, spec",
    [
        ("ctr", {"process": {"env": ["PCIDEVICE_INTEL_COM_SRIOV=0000:99:00.0" + FORGED]}}),
        ("ctr", {"annotations": {"numa-pin.io/pod": "p" + FORGED, "numa-pin.io/cpus": "999"}}),
    ],
    ids=["pcidevice-value", "pod-annotation"],
)
def test_hook_report_is_one_escaped_line_everywhere(node, capsys, cid, spec):
    fake, config, logged = node
    assert hook(config, fake, cid, spec) == 1
    err = capsys.readouterr().err
    assert_one_safe_line(err)
    assert "\\n" in err or "\\x1b" in err or "ctr" in err
    assert [m for m in logged] == [err.strip()]
    reasons = list((fake.state_dir / "reasons").iterdir())
    assert len(reasons) == 1
    assert_one_safe_line(json.loads(reasons[0].read_text())["line"])
    assert cli_main(["explain", cid, "--config", str(config)]) == 0
    assert_one_safe_line(capsys.readouterr().out)


def test_a_hostile_container_id_is_refused_in_one_escaped_line_and_nothing_is_kept(node, capsys):
    """A container id with a newline and escape codes is refused before anything is decided
    (issue 34, item 7): one escaped line, no grant, and no reason file keyed by that id."""
    fake, config, logged = node
    assert hook(config, fake, "ctr" + FORGED, {"annotations": {"numa-pin.io/cpus": "1"}}) != 0
    err = capsys.readouterr().err
    assert_one_safe_line(err)
    assert "control character" in err and "\\n" in err
    assert all("\n" not in m and "\x1b" not in m for m in logged)
    assert cli_main(["status", "--json", "--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out)["grants"] == []
    assert not list((fake.state_dir / "reasons").glob("*.json"))


def test_cli_error_boundary_escapes_yaml_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: [\x1b[31m\n")
    assert cli_main(["status", "--config", str(bad)]) != 0
    assert_one_safe_line(capsys.readouterr().err)


def test_plan_text_escapes_the_bundle_name_and_reason(node, capsys):
    fake, config, _ = node
    bundle = fake.root / "ctr\nnuma-pin: admitted forged\x1b[2J"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"annotations": {"numa-pin.io/cpus": "999"}}))
    assert cli_main(["plan", "--bundle", str(bundle), "--config", str(config)]) == 1  # rejected
    out = capsys.readouterr().out
    assert "\x1b" not in out and not [line for line in out.splitlines() if line.startswith("numa-pin")]
    assert out.splitlines()[0] == "container: ctr\\nnuma-pin: admitted forged\\x1b[2J"
