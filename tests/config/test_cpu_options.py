"""The CPU manager's static-policy options are one record: what the config file sets is what
the CPU provider and allocators read, under the names and defaults of the key table."""

import pytest

from numa_pin.config import ITEMS, CpuManagerOptions, config_from_dict
from numa_pin.config.cpu_options import OPTION_NAMES, CpuOptions
from numa_pin.errors import PolicyError

PREFIX = "cpu_manager.options."
TABLE = {item.key[len(PREFIX):]: item.default for item in ITEMS if item.key.startswith(PREFIX)}


def test_the_config_and_the_decision_share_one_record():
    assert CpuManagerOptions is CpuOptions
    opts = config_from_dict({"cpu_manager": {"options": {"align-by-socket": True}}}).cpu_manager.options
    assert isinstance(opts, CpuOptions) and opts.enabled() == ("align-by-socket",)


def test_the_key_table_names_every_option_with_the_record_default():
    assert sorted(OPTION_NAMES.values()) == sorted(TABLE)
    assert CpuOptions().as_kubelet() == TABLE


@pytest.mark.parametrize(
    "options, message",
    [({"full-pcpus-only": True, "distribute-cpus-across-cores": True}, "full-pcpus-only and distribute-cpus-across-cores"),
     ({"distribute-cpus-across-numa": True, "distribute-cpus-across-cores": True},
      "distribute-cpus-across-numa and distribute-cpus-across-cores")],
    ids=["full-pcpus-with-cores", "numa-with-cores"],
)
def test_a_refused_pair_from_the_config_file_is_refused_by_the_record_itself(options, message):
    opts = config_from_dict({"cpu_manager": {"options": options}}).cpu_manager.options
    with pytest.raises(PolicyError, match=message):
        opts.check_pairs()
