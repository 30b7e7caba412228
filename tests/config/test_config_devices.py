"""Device resources in the config: validated at load time, as the inventory will use them.

Each bad value here must be refused by ``load_config`` with the file and the dotted key
named, not at the first admission that builds the inventory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from numa_pin.config import (
    DeviceSelector,
    config_from_dict,
    config_from_yaml,
    load_config,
)
from numa_pin.devices.inventory import DeviceResource, inventory
from numa_pin.devices.selector import Selector
from numa_pin.errors import ConfigError
from numa_pin.testing.machine import expected_topology
from numa_pin.testing.shapes import shape

SRIOV = "intel.com/sriov_vf"

# (id, the selector list or {name: selectors}, the key named, a word of the message)
BAD = [
    ("pf-name-bad-range", {SRIOV: [{"pf_names": ["ens2f0#x-y"]}]}, f"devices.{SRIOV}[0].pf_names[0]", "ranges"),
    ("pf-name-backwards-range", {SRIOV: [{"pf_names": ["ens2f0", "ens2f0#3-1"]}]},
     f"devices.{SRIOV}[0].pf_names[1]", "backwards"),
    ("pf-name-empty-range", {SRIOV: [{"pf_names": ["ens2f0#"]}]}, f"devices.{SRIOV}[0].pf_names[0]", "ranges"),
    ("pf-name-space", {SRIOV: [{"pf_names": ["ens 2f0"]}]}, f"devices.{SRIOV}[0].pf_names[0]", "netdev name"),
    ("pf-name-second-selector", {SRIOV: [{"is_vf": True}, {"pf_names": ["#0-3"]}]},
     f"devices.{SRIOV}[1].pf_names[0]", "netdev name"),
    ("vendor-not-hex", {SRIOV: [{"vendors": ["intel"]}]}, f"devices.{SRIOV}[0].vendors[0]", "hex id"),
    ("vendor-five-digits", {SRIOV: [{"vendors": ["0x80860"]}]}, f"devices.{SRIOV}[0].vendors[0]", "4 digits"),
    ("device-not-hex", {SRIOV: [{"devices": ["0x15zz"]}]}, f"devices.{SRIOV}[0].devices[0]", "hex id"),
    ("class-three-digits", {SRIOV: [{"classes": ["0x020"]}]}, f"devices.{SRIOV}[0].classes[0]", "2, 4 or 6"),
    ("address-no-function", {SRIOV: [{"addresses": ["0000:3b:02"]}]}, f"devices.{SRIOV}[0].addresses[0]",
     "PCI address"),
    ("address-function-8", {SRIOV: [{"addresses": ["3b:02.8"]}]}, f"devices.{SRIOV}[0].addresses[0]",
     "PCI address"),
    ("resource-name-no-domain", {"gpu": [{"vendors": ["10de"]}]}, "devices.gpu", "vendor.example/name"),
    ("resource-name-upper-domain", {"Nvidia.com/gpu": [{"vendors": ["10de"]}]}, "devices.Nvidia.com/gpu",
     "DNS domain"),
    ("resource-name-reserved", {"kubernetes.io/gpu": [{"vendors": ["10de"]}]}, "devices.kubernetes.io/gpu",
     "reserved"),
]


@pytest.mark.parametrize(("case", "devices", "key", "word"), BAD, ids=[c[0] for c in BAD])
def test_bad_device_config_is_refused_at_load(tmp_path: Path, case: str, devices: object, key: str,
                                              word: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"devices": devices}))
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.path == str(path)
    assert info.value.key == key
    assert str(info.value).startswith(f"{path}: {key}: ")
    assert word in str(info.value)


def test_the_config_builds_the_selector_the_inventory_uses(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "devices:\n"
        f"  {SRIOV}:\n"
        "    - {pf_names: [\"ens2f0#0-1\", \"ens2f0#3\"], is_vf: true, vendors: [\"8086\"]}\n"
        "  nvidia.com/gpu:\n"
        "    - {classes: [\"0302\"], addresses: [\"18:00.0\", \"0000:3D:00.0\"]}\n"
    )
    config = load_config(path, env={})
    selectors = [s for sels in config.devices.values() for s in sels]
    assert DeviceSelector is Selector
    assert all(type(s) is Selector for s in selectors)
    # the inventory takes the config's selectors as they are; the expected devices are read
    # off the gpu8-sriov shape (E810 PF ens2f0 at 32:00.0 with VFs 32:01.0-3; GPUs by address)
    topo = expected_topology(shape("gpu8-sriov"))
    resources = [DeviceResource(name, sels) for name, sels in config.devices.items()]
    found = {name: tuple(d.id for d in infos) for name, infos in inventory(topo, resources).items()}
    assert found == {
        SRIOV: ("0000:32:01.0", "0000:32:01.1", "0000:32:01.3"),
        "nvidia.com/gpu": ("0000:18:00.0", "0000:3d:00.0"),
    }


def test_selectors_round_trip_through_the_cache_form() -> None:
    text = f"devices:\n  {SRIOV}:\n    - {{pf_names: [\" ens2f0#0-3,6 \"], drivers: [\" iavf\"]}}\n"
    config = config_from_yaml(text, "c.yaml")
    assert config.devices[SRIOV] == (Selector(pf_names=("ens2f0#0-3,6",), drivers=("iavf",)),)
    # the JSON form is what the config cache stores and validates again
    assert config_from_dict(json.loads(json.dumps(config.to_dict()))) == config
