"""Config validation: every error path names its dotted key; defaults live in one table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.config import ITEMS, Config, DeviceSelector, config_from_dict, config_from_yaml, load_config
from numa_pin.config.parse import CPU_MANAGER_OPTIONS, POLICIES, SCOPES
from numa_pin.config.render import reference_table, sample_yaml
from numa_pin.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

# (id, document, dotted key that must appear in the message, another word that must appear)
ERRORS: list[tuple[str, Any, str, str]] = [
    ("unknown_top", {"polcy": "none"}, "polcy", "did you mean policy"),
    ("unknown_nested", {"cpu_manager": {"reserved": "0"}}, "cpu_manager.reserved", "unknown key"),
    ("unknown_cpu_option", {"cpu_manager": {"options": {"full-pcpu-only": True}}},
     "cpu_manager.options.full-pcpu-only", "did you mean full-pcpus-only"),
    ("unknown_inference", {"inference": {"gpus": True}}, "inference.gpus", "unknown key"),
    ("dotted_key_at_top", {"cpu_manager.num_reserved_cpus": 2}, "cpu_manager.num_reserved_cpus", "unknown key"),
    ("int_key", {3: "x"}, "3", "unknown key"),
    ("policy_enum", {"policy": "strict"}, "policy", "single-numa-node"),
    ("policy_case", {"policy": "Best-Effort"}, "policy", "must be one of"),
    ("policy_bool", {"policy": False}, "policy", "must be one of"),
    ("policy_null", {"policy": None}, "policy", "must be one of"),
    ("scope_enum", {"scope": "node"}, "scope", "container, pod"),
    ("policy_options_list", {"policy_options": ["a"]}, "policy_options", "mapping"),
    ("policy_option_unknown", {"policy_options": {"prefer-closest": "true"}},
     "policy_options.prefer-closest", "unknown policy option"),
    ("policy_option_float", {"policy_options": {"max-allowable-numa-nodes": 8.5}},
     "policy_options.max-allowable-numa-nodes", "string, boolean or integer"),
    ("policy_option_null", {"policy_options": {"prefer-closest-numa-nodes": None}},
     "policy_options.prefer-closest-numa-nodes", "null"),
    ("cpu_manager_scalar", {"cpu_manager": 3}, "cpu_manager", "mapping"),
    ("cpu_options_list", {"cpu_manager": {"options": ["full-pcpus-only"]}}, "cpu_manager.options", "mapping"),
    ("cpu_option_word", {"cpu_manager": {"options": {"full-pcpus-only": "yes"}}},
     "cpu_manager.options.full-pcpus-only", "boolean"),
    ("cpu_option_two", {"cpu_manager": {"options": {"align-by-socket": 2}}},
     "cpu_manager.options.align-by-socket", "boolean"),
    ("reserved_cpus_bad", {"cpu_manager": {"reserved_cpus": "0-x"}}, "cpu_manager.reserved_cpus", "bad cpulist"),
    ("reserved_cpus_range", {"cpu_manager": {"reserved_cpus": "3-1"}}, "cpu_manager.reserved_cpus", "bad range"),
    ("reserved_cpus_empty", {"cpu_manager": {"reserved_cpus": ""}}, "cpu_manager.reserved_cpus", "null"),
    ("reserved_cpus_list", {"cpu_manager": {"reserved_cpus": [0, 1]}}, "cpu_manager.reserved_cpus", "cpulist"),
    ("reserved_cpus_negative", {"cpu_manager": {"reserved_cpus": -1}}, "cpu_manager.reserved_cpus", "cpulist"),
    ("num_reserved_negative", {"cpu_manager": {"num_reserved_cpus": -1}}, "cpu_manager.num_reserved_cpus",
     "non-negative"),
    ("num_reserved_bool", {"cpu_manager": {"num_reserved_cpus": True}}, "cpu_manager.num_reserved_cpus", "bool"),
    ("num_reserved_str", {"cpu_manager": {"num_reserved_cpus": "2"}}, "cpu_manager.num_reserved_cpus", "str"),
    # kubelet's TestStaticPolicyStartWithResvList: "size of 0-1 did not equal 1"
    ("reserved_cpus_count_smaller", {"cpu_manager": {"reserved_cpus": "0-1", "num_reserved_cpus": 1}},
     "cpu_manager.reserved_cpus", "unable to reserve the required amount of CPUs (size of 0-1 did not equal 1)"),
    ("reserved_cpus_count_zero", {"cpu_manager": {"reserved_cpus": "0,8-9", "num_reserved_cpus": 0}},
     "cpu_manager.reserved_cpus", "size of 0,8-9 did not equal 0"),
    ("reserved_memory_list", {"reserved_memory": [1]}, "reserved_memory", "mapping"),
    ("reserved_memory_node", {"reserved_memory": {"zero": {"memory": "1Gi"}}}, "reserved_memory.zero", "NUMA node"),
    ("reserved_memory_node_negative", {"reserved_memory": {-1: {"memory": "1Gi"}}}, "reserved_memory.-1", "NUMA node"),
    ("reserved_memory_node_twice", {"reserved_memory": {0: {"memory": "1"}, "0": {"memory": "2"}}},
     "reserved_memory.0", "twice"),
    ("reserved_memory_resource", {"reserved_memory": {0: {"cpu": "1"}}}, "reserved_memory.0.cpu", "hugepages-<size>"),
    ("reserved_memory_hugepage_size", {"reserved_memory": {0: {"hugepages-big": "1"}}},
     "reserved_memory.0.hugepages-big", "hugepages-<size>"),
    ("reserved_memory_resource_twice", {"reserved_memory": {0: {"hugepages-2Mi": "2Mi", "hugepages-2048Ki": "4Mi"}}},
     "reserved_memory.0.hugepages-2048Ki", "twice"),
    ("reserved_memory_quantity", {"reserved_memory": {0: {"memory": "1GB"}}}, "reserved_memory.0.memory", "'1GB'"),
    ("reserved_memory_negative", {"reserved_memory": {1: {"memory": "-1Gi"}}}, "reserved_memory.1.memory", "negative"),
    ("reserved_memory_float", {"reserved_memory": {1: {"memory": 1.5}}}, "reserved_memory.1.memory", "not a quantity"),
    ("reserved_memory_huge", {"reserved_memory": {1: {"memory": "9Ei"}}}, "reserved_memory.1.memory", "larger than"),
    ("devices_list", {"devices": ["nvidia.com/gpu"]}, "devices", "mapping"),
    ("devices_bad_name", {"devices": {"nvidia.com/": [{"vendors": ["10de"]}]}}, "devices.nvidia.com/",
     "resource names"),
    ("devices_not_list", {"devices": {"nvidia.com/gpu": {"vendors": ["10de"]}}}, "devices.nvidia.com/gpu",
     "list of selectors"),
    ("devices_empty_list", {"devices": {"nvidia.com/gpu": []}}, "devices.nvidia.com/gpu", "non-empty"),
    ("selector_scalar", {"devices": {"nvidia.com/gpu": ["10de"]}}, "devices.nvidia.com/gpu[0]", "mapping"),
    ("selector_empty", {"devices": {"nvidia.com/gpu": [{}]}}, "devices.nvidia.com/gpu[0]", "every PCI device"),
    ("selector_unknown", {"devices": {"nvidia.com/gpu": [{"vendors": ["10de"]}, {"vendor": ["10de"]}]}},
     "devices.nvidia.com/gpu[1].vendor", "unknown selector key"),
    ("selector_vendor_str", {"devices": {"r/x": [{"vendors": "10de"}]}}, "devices.r/x[0].vendors", "list of strings"),
    ("selector_vendor_hex", {"devices": {"r/x": [{"vendors": ["nvidia"]}]}}, "devices.r/x[0].vendors[0]", "hex id"),
    ("selector_vendor_long", {"devices": {"r/x": [{"vendors": ["0x10de0"]}]}}, "devices.r/x[0].vendors[0]", "4 digits"),
    ("selector_device_int", {"devices": {"r/x": [{"devices": [0x1234]}]}}, "devices.r/x[0].devices[0]", "string"),
    ("selector_class_len", {"devices": {"r/x": [{"classes": ["030"]}]}}, "devices.r/x[0].classes[0]", "2, 4 or 6"),
    ("selector_address", {"devices": {"r/x": [{"addresses": ["3b:00"]}]}}, "devices.r/x[0].addresses[0]",
     "PCI address"),
    ("selector_driver_empty", {"devices": {"r/x": [{"drivers": [""]}]}}, "devices.r/x[0].drivers[0]", "non-empty"),
    ("selector_is_vf_str", {"devices": {"r/x": [{"is_vf": "true"}]}}, "devices.r/x[0].is_vf", "true or false"),
    ("selector_netdev_int", {"devices": {"r/x": [{"has_netdev": 1}]}}, "devices.r/x[0].has_netdev", "true or false"),
    ("inference_str", {"inference": {"hugepages": "yes"}}, "inference.hugepages", "true or false"),
    ("inference_scalar", {"inference": True}, "inference", "mapping"),
    ("sysfs_relative", {"sysfs_root": "sys"}, "sysfs_root", "absolute path"),
    ("proc_int", {"proc_root": 5}, "proc_root", "absolute path"),
    ("cgroup_null", {"cgroup_root": None}, "cgroup_root", "absolute path"),
    ("state_dir_nul", {"state_dir": "/var/\0lib"}, "state_dir", "absolute path"),
    ("lock_timeout_str", {"lock_timeout_s": "10s"}, "lock_timeout_s", "seconds"),
    ("lock_timeout_negative", {"lock_timeout_s": -1}, "lock_timeout_s", "between"),
    ("lock_timeout_nan", {"lock_timeout_s": float("nan")}, "lock_timeout_s", "between"),
    ("lock_timeout_bool", {"lock_timeout_s": True}, "lock_timeout_s", "seconds"),
    ("syslog_str", {"syslog": "on"}, "syslog", "true or false"),
]


@pytest.mark.parametrize(("doc", "key", "word"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_invalid_config_names_key_and_file(doc: Any, key: str, word: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(doc, "/etc/numa-pin/config.yaml")
    message = str(info.value)
    assert info.value.key == key
    assert f"{key}: " in message
    assert message.startswith("/etc/numa-pin/config.yaml: ")
    assert word in message
    assert info.value.path == "/etc/numa-pin/config.yaml"


@pytest.mark.parametrize("doc", [[1, 2], "policy: none", 42], ids=["list", "string", "int"])
def test_document_must_be_a_mapping(doc: Any) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        config_from_dict(doc, "f.yaml")


def test_empty_document_and_empty_sections_are_defaults() -> None:
    assert config_from_dict(None) == Config()
    assert config_from_dict({}) == Config()
    assert config_from_yaml("cpu_manager:\ninference:\npolicy_options:\nreserved_memory:\ndevices:\n") == Config()


def test_full_config_is_typed_and_normalised() -> None:
    text = """
policy: single-numa-node
scope: pod
policy_options:
  prefer-closest-numa-nodes: "true"
  max-allowable-numa-nodes: 16
cpu_manager:
  options:
    full-pcpus-only: "t"
    distribute-cpus-across-numa: 1
    strict-cpu-reservation: true
  reserved_cpus: "0,8-9"
  num_reserved_cpus: 3
reserved_memory:
  0: {memory: 1Gi, hugepages-2048Ki: 4Mi}
  "1": {hugepages-1Gi: 1Gi}
devices:
  nvidia.com/gpu:
    - vendors: ["10DE"]
      classes: ["0302"]
  intel.com/sriov:
    - {vendors: ["0x8086"], devices: ["154c"], drivers: [iavf], pf_names: [ens1f0], is_vf: true,
       has_netdev: true, addresses: ["3B:02.1", "0001:af:00.0"]}
inference: {guaranteed_cpus: false, hugepages: false, device_plugin_env: false}
sysfs_root: /host/sys
proc_root: /host/proc
cgroup_root: /host/sys/fs/cgroup
state_dir: /run/numa-pin
lock_timeout_s: 2.5
syslog: false
"""
    c = config_from_yaml(text, "x.yaml")
    assert c.source == "x.yaml"
    assert (c.policy, c.scope) == ("single-numa-node", "pod")
    assert dict(c.policy_options) == {"prefer-closest-numa-nodes": "true", "max-allowable-numa-nodes": 16}
    assert c.cpu_manager.options.enabled() == (
        "full-pcpus-only", "distribute-cpus-across-numa", "strict-cpu-reservation")
    assert c.cpu_manager.reserved_cpus == frozenset({0, 8, 9})
    assert c.cpu_manager.num_reserved_cpus == 3
    assert c.reserved_memory == {0: {"memory": 1 << 30, "hugepages-2Mi": 4 << 20}, 1: {"hugepages-1Gi": 1 << 30}}
    assert c.devices["nvidia.com/gpu"] == (DeviceSelector(vendors=("0x10de",), classes=("0x0302",)),)
    assert c.devices["intel.com/sriov"] == (
        DeviceSelector(vendors=("0x8086",), devices=("0x154c",), drivers=("iavf",), pf_names=("ens1f0",),
                       is_vf=True, has_netdev=True, addresses=("0000:3b:02.1", "0001:af:00.0")),
    )
    assert not any((c.inference.guaranteed_cpus, c.inference.hugepages, c.inference.device_plugin_env))
    assert (c.sysfs_root, c.proc_root, c.cgroup_root, c.state_dir) == (
        "/host/sys", "/host/proc", "/host/sys/fs/cgroup", "/run/numa-pin")
    assert c.lock_timeout_s == 2.5 and c.syslog is False
    # the JSON form round-trips (this is what the cache stores)
    assert config_from_dict(json.loads(json.dumps(c.to_dict()))) == c


@pytest.mark.parametrize(
    "cpu_manager, expected",
    [
        ({"reserved_cpus": "0-1"}, 2),  # the default num_reserved_cpus (1) is not a contradiction
        ({"reserved_cpus": "0-1", "num_reserved_cpus": 2}, 2),
        ({"reserved_cpus": 3, "num_reserved_cpus": 1}, 1),
        ({"num_reserved_cpus": 4}, 4),
        ({}, 1),
    ],
    ids=["list-with-default-count", "list-and-its-count", "one-cpu-list", "count-alone", "defaults"],
)
def test_reserved_cpus_list_sets_the_count(cpu_manager, expected: int) -> None:
    """kubelet derives the reserved count from --reserved-cpus (it overrides the CPU amounts); a
    count written beside the list must agree with it (the refusals are in ERRORS)."""
    assert config_from_dict({"cpu_manager": cpu_manager}).cpu_manager.num_reserved_cpus == expected


def test_reserved_cpus_int_is_one_cpu() -> None:
    assert config_from_yaml("cpu_manager: {reserved_cpus: 0}").cpu_manager.reserved_cpus == frozenset({0})


# ---- one table of defaults --------------------------------------------------------


@pytest.mark.parametrize("section", ["inference", "isolation"])
def test_the_yaml_form_of_a_section_has_every_key_of_the_table(section: str) -> None:
    keys = sorted(item.key[len(section) + 1:] for item in ITEMS if item.key.startswith(section + "."))
    assert keys and sorted(Config().to_dict()[section]) == keys


def test_defaults_come_from_the_table() -> None:
    flat = {item.key: item.default for item in ITEMS}
    c = Config()
    assert c.policy == flat["policy"] == "best-effort"
    assert c.scope == flat["scope"] == "container"
    assert c.cpu_manager.num_reserved_cpus == flat["cpu_manager.num_reserved_cpus"] == 1
    assert c.cpu_manager.reserved_cpus is None
    assert c.cpu_manager.options.as_kubelet() == {n: flat[f"cpu_manager.options.{n}"] for n in CPU_MANAGER_OPTIONS}
    assert c.lock_timeout_s == flat["lock_timeout_s"] == 10
    roots = (c.sysfs_root, c.proc_root, c.cgroup_root, c.state_dir)
    assert roots == ("/sys", "/proc", "/sys/fs/cgroup", "/var/lib/numa-pin")
    assert c.syslog is True and c.inference.guaranteed_cpus and c.inference.hugepages and c.inference.device_plugin_env
    assert dict(c.policy_options) == {} and dict(c.reserved_memory) == {} and dict(c.devices) == {}


_BOOL_KEYS = [item.key for item in ITEMS if item.type == "bool"]


@pytest.mark.parametrize("key", _BOOL_KEYS, ids=_BOOL_KEYS)
def test_every_switch_reaches_its_field(key: str) -> None:
    """A switch set against its default lands on the record field its dotted key names."""
    flat = {item.key: item.default for item in ITEMS}
    doc: dict[str, object] = {}
    *sections, name = key.split(".")
    node = doc
    for part in sections:
        node = node.setdefault(part, {})  # type: ignore[assignment]
    node[name] = not flat[key]
    value: object = config_from_dict(doc)
    for part in key.split("."):
        value = getattr(value, part.replace("-", "_"))
    assert value is (not flat[key])


def test_every_item_is_documented_and_typed() -> None:
    for item in ITEMS:
        assert item.meaning.endswith(".") and item.type, item.key
        assert item.parse(item.default, item.key) is not None or item.default is None


def test_sample_file_is_generated_from_the_table() -> None:
    sample = (REPO / "packaging" / "config.yaml").read_text()
    assert sample == sample_yaml(), "regenerate packaging/config.yaml from numa_pin.config.render.sample_yaml()"
    assert load_config(REPO / "packaging" / "config.yaml") == Config()
    for item in ITEMS:
        assert f"{item.key.rsplit('.', 1)[-1]}:" in sample


def test_docs_carry_the_reference_table() -> None:
    doc = (REPO / "docs" / "ledger-config.md").read_text()
    assert reference_table() in doc, "paste numa_pin.config.render.reference_table() into docs/ledger-config.md"


# ---- properties -------------------------------------------------------------------

_cpulists = st.frozensets(st.integers(0, 255), min_size=1, max_size=6)
_hex4 = st.integers(0, 0xFFFF).map(lambda v: f"{v:x}")


@st.composite
def valid_docs(draw: st.DrawFn) -> dict[str, Any]:
    from numa_pin.base.cpuset import format_list

    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["policy"] = draw(st.sampled_from(POLICIES))
    if draw(st.booleans()):
        doc["scope"] = draw(st.sampled_from(SCOPES))
    doc["policy_options"] = draw(st.dictionaries(
        st.sampled_from(["prefer-closest-numa-nodes", "max-allowable-numa-nodes"]),
        st.one_of(st.booleans(), st.integers(-5, 64), st.text(max_size=5)),
    ))
    reserved = draw(st.none() | _cpulists)
    doc["cpu_manager"] = {
        "options": draw(st.dictionaries(st.sampled_from(CPU_MANAGER_OPTIONS),
                                        st.sampled_from([True, False, "true", "F", 0, 1]))),
        "reserved_cpus": None if reserved is None else format_list(reserved),
        # a count beside a list must be the list's size (kubelet refuses the disagreement)
        "num_reserved_cpus": draw(st.integers(0, 16)) if reserved is None else len(reserved),
    }
    doc["reserved_memory"] = draw(st.dictionaries(
        st.integers(0, 15),
        st.dictionaries(st.sampled_from(["memory", "hugepages-2Mi", "hugepages-1Gi"]),
                        st.integers(0, 1 << 40).map(str), min_size=1),
    ))
    doc["devices"] = draw(st.dictionaries(
        st.sampled_from(["nvidia.com/gpu", "intel.com/sriov", "amd.com/gpu"]),
        st.lists(st.fixed_dictionaries({}, optional={
            "vendors": st.lists(_hex4, min_size=1, max_size=2),
            "drivers": st.lists(st.sampled_from(["vfio-pci", "iavf", "nvidia"]), min_size=1),
            "is_vf": st.booleans(),
        }).filter(bool), min_size=1, max_size=2),
    ))
    doc["lock_timeout_s"] = draw(st.floats(0, 3600))
    return doc


@given(valid_docs())
def test_valid_documents_roundtrip_through_json(doc: dict[str, Any]) -> None:
    c = config_from_dict(doc)
    assert config_from_dict(json.loads(json.dumps(c.to_dict()))) == c


_known_names = sorted(
    {part for item in ITEMS for part in item.key.split(".")} | {"memory", "0", "vendors", "nvidia.com/gpu"}
)
_keys = st.one_of(st.sampled_from(_known_names), st.text(max_size=8), st.integers(-2, 3))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
                     st.sampled_from(["1Gi", "0-3", "/sys", "true", "best-effort", "0x10de"]))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(_keys, inner, max_size=4)), max_leaves=12)


@given(st.dictionaries(_keys, _values, max_size=6))
def test_random_documents_raise_only_config_error(doc: dict[Any, Any]) -> None:
    try:
        c = config_from_dict(doc, "fuzz.yaml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.yaml: ")
    else:
        assert isinstance(c, Config)


@given(st.builds(lambda sections: {"cpu_manager": sections}, st.dictionaries(_keys, _values, max_size=4)))
def test_random_sections_raise_only_config_error(doc: dict[str, Any]) -> None:
    try:
        config_from_dict(doc)
    except ConfigError:
        pass


@given(st.text(alphabet=st.sampled_from(list("abc:-{}[]\"'#&*!|>% \n\t0123456789.,?")), max_size=60))
def test_random_yaml_text_raises_only_config_error(text: str) -> None:
    try:
        config_from_yaml(text, "fuzz.yaml")
    except ConfigError:
        pass
