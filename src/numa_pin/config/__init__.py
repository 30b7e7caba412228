"""numa-pin configuration: the schema (one table of keys and defaults) and the loader.

``load_config(path=None, env=os.environ, cache_dir=None) -> Config`` applies the
precedence ``--config`` > ``$NUMA_PIN_CONFIG`` > ``/etc/numa-pin/config.yaml`` >
built-in defaults. See :mod:`numa_pin.config.schema` for every key and
:mod:`numa_pin.config.render` for the sample file and the docs' table written from them (not
imported here: the hook imports this package on every container start).
"""

from numa_pin.config.keys import ITEMS, ConfigItem
from numa_pin.config.load import DEFAULT_PATH, ENV_VAR, config_from_yaml, load_config, resolve_config_path
from numa_pin.config.model import Config, CpuManagerConfig, CpuManagerOptions, DeviceSelector, InferenceConfig
from numa_pin.config.schema import config_from_dict

__all__ = [
    "DEFAULT_PATH",
    "ENV_VAR",
    "ITEMS",
    "Config",
    "ConfigItem",
    "CpuManagerConfig",
    "CpuManagerOptions",
    "DeviceSelector",
    "InferenceConfig",
    "config_from_dict",
    "config_from_yaml",
    "load_config",
    "resolve_config_path",
]
