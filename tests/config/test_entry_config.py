"""The one loader of every entry point (``entry_config``): relative paths against the request's
directory, the cache directory, and the rootless hook's fallback to the built-in defaults. The
oracle is ``load_config`` given the absolute paths by hand."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from numa_pin.config import Config, load_config
from numa_pin.config import load as load_mod
from numa_pin.config.load import CACHE_ENV, ENV_VAR, entry_config
from numa_pin.errors import ConfigError, UnsafePathError


@pytest.fixture
def where(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(load_mod, "_RACY_NS", 0)  # the files are brand new: cached all the same
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "flag.yaml").write_text("policy: restricted\n")
    (tmp_path / "etc" / "env.yaml").write_text("policy: single-numa-node\n")
    (tmp_path / "etc" / "bad.yaml").write_text("policy: [unclosed\n")
    os.chmod(tmp_path, 0o755)
    return tmp_path


# (id, --config, NUMA_PIN_CONFIG, NUMA_PIN_CACHE_DIR, cwd is the tmp dir, cached,
#  the file load_config must read, the cache directory expected (relative to the tmp dir))
RESOLVED = [
    ("hook_flag_relative", "etc/flag.yaml", None, "cache", True, True, "etc/flag.yaml", "cache"),
    ("hook_env_relative", None, "etc/env.yaml", "cache", True, True, "etc/env.yaml", "cache"),
    ("hook_flag_beats_env", "etc/flag.yaml", "etc/env.yaml", "c2", True, True, "etc/flag.yaml", "c2"),
    ("absolute_kept", "/ABS/etc/flag.yaml", None, "/ABS/cache", True, True, "etc/flag.yaml", "cache"),
    ("not_cached_has_no_cache_dir", "etc/flag.yaml", None, "cache", True, False, "etc/flag.yaml", None),
    ("cli_process_cwd", "etc/flag.yaml", None, None, False, False, "etc/flag.yaml", None),
    ("cli_env_process_cwd", None, "etc/env.yaml", None, False, False, "etc/env.yaml", None),
]


@pytest.mark.parametrize(("flag", "env", "cache", "use_cwd", "cached", "reads", "cache_at"),
                         [r[1:] for r in RESOLVED], ids=[r[0] for r in RESOLVED])
def test_paths_resolve_against_the_request_directory(where, monkeypatch, flag, env, cache, use_cwd, cached, reads,
                                                     cache_at):
    def absolute(path):
        return None if path is None else path.replace("/ABS", str(where))

    monkeypatch.chdir(where)  # the CLI (no cwd) leaves relative paths to this process's directory
    environ = {k: absolute(v) for k, v in ((ENV_VAR, env), (CACHE_ENV, cache)) if v is not None}
    config, cache_dir = entry_config(absolute(flag), environ, cwd=str(where) if use_cwd else None, cached=cached)
    expected = load_config(str(where / reads), {})
    assert (config.policy, os.path.realpath(config.source or "")) == (expected.policy, str(where / reads))
    assert cache_dir == (None if cache_at is None else str(where / cache_at))
    if cache_dir is not None:
        assert any(name.startswith("config-") for name in os.listdir(cache_dir))  # read through the cache


def _unsafe_cache(where: Path) -> str:
    shared = where / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # others could plant the cache: refused
    return str(shared / "cache")


# (id, --config, cache directory, the error without or_defaults)
UNREADABLE = [
    ("flag_missing", "etc/missing.yaml", None, ConfigError),
    ("not_yaml", "etc/bad.yaml", None, ConfigError),
    ("cache_dir_unsafe", "etc/flag.yaml", _unsafe_cache, UnsafePathError),
]


@pytest.mark.parametrize(("flag", "cache", "error"), [u[1:] for u in UNREADABLE], ids=[u[0] for u in UNREADABLE])
def test_or_defaults_gives_the_built_in_config(where, flag, cache, error):
    environ = {} if cache is None else {CACHE_ENV: cache(where)}
    with pytest.raises(error):
        entry_config(flag, environ, cwd=str(where), cached=True)
    config, _ = entry_config(flag, environ, cwd=str(where), cached=True, or_defaults=True)
    assert config == Config()
