"""A device numa-pin cannot place is said by ``plan`` as by ``explain``, and refused under
``inference.strict_devices`` (issue 37, item 1).

The device: a DRA GPU claim whose CDI spec file says a ``cdiVersion`` the CDI reference library
refuses too (1.2.0, unknown), so numa-pin cannot read it. The oracle for ``plan`` is what the
hook records for the same bundle and ``explain`` shows.
"""

from __future__ import annotations

import io
import json

import pytest

from numa_pin.cli.main import main
from numa_pin.entry.hook import run as hook_run
from numa_pin.testing import devtree
from numa_pin.testing.node import FakeNode

CLAIM = "k8s.gpu.nvidia.com/claim"
NAME = "6f1c3c1e-7b2a-4d1e-9b1e-0c7f9d2a4e11-gpu-0"


@pytest.fixture
def node(tmp_path, tmp_path_factory, monkeypatch):
    fake = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    fake.add_container("c0", 7000)
    spec = devtree.write_cdi_spec(tmp_path / "run-cdi", CLAIM, {NAME: [("/dev/nvidia3", 195, 3)]}, version="1.2.0")
    fake.spec_file = spec
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return fake


def _config(node: FakeNode, strict: bool) -> str:
    return str(node.write_config(policy="single-numa-node", kubelet_root=str(node.root / "no-kubelet"),
                                 cdi_spec_dirs=[str(node.spec_file.parent)],
                                 inference={"strict_devices": strict}))


def _bundle(node: FakeNode) -> tuple[str, bytes]:
    state = node.oci_state("c0", 7000, {"numa-pin.io/cpus": "2", "cdi.k8s.io/gpu": f"{CLAIM}={NAME}"})
    return json.loads(state)["bundle"], state


def test_plan_says_the_device_it_cannot_place_as_explain_does(node, capsys):
    config = _config(node, strict=False)
    bundle, state = _bundle(node)
    assert main(["plan", "--config", config, "--bundle", bundle, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["admit"] is True
    assert len(planned["notes"]) == 1
    assert f"{CLAIM}={NAME}" in planned["notes"][0] and str(node.spec_file) in planned["notes"][0]
    assert "cdiVersion '1.2.0'" in planned["notes"][0]
    assert main(["plan", "--config", config, "--bundle", bundle]) == 0
    text = capsys.readouterr().out.splitlines()
    assert [line for line in text if line.startswith("note:")] == [f"note:      {planned['notes'][0]}"]
    # the oracle: what the admission of the same bundle records, as explain shows it
    assert hook_run(["--config", config, "prestart"], io.BytesIO(state)) == 0
    capsys.readouterr()
    assert main(["explain", "--config", config, "c0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["grant"]["notes"] == planned["notes"]


def test_strict_devices_makes_plan_refuse_it_in_one_line(node, capsys):
    config = _config(node, strict=True)
    bundle, _ = _bundle(node)
    assert main(["plan", "--config", config, "--bundle", bundle]) != 0
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and "inference.strict_devices" in err and "cannot place" in err
    assert f"{CLAIM}={NAME}" in err
