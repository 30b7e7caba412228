"""Config file precedence, YAML errors, the validated-config cache and lazy yaml import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numa_pin.config import ENV_VAR, Config, load_config, resolve_config_path
from numa_pin.config import load as load_mod
from numa_pin.errors import ConfigError
from waitfor import wait_for

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---- precedence --------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "flag": _write(tmp_path / "flag.yaml", "policy: restricted\n"),
        "env": _write(tmp_path / "env.yaml", "policy: single-numa-node\n"),
        "etc": _write(tmp_path / "etc" / "config.yaml", "policy: none\n"),
        "missing": tmp_path / "missing.yaml",
    }


PRECEDENCE = [
    ("flag_beats_all", "flag", "env", "etc", "restricted"),
    ("env_beats_etc", None, "env", "etc", "single-numa-node"),
    ("etc_when_alone", None, None, "etc", "none"),
    ("defaults_when_nothing", None, None, "missing", "best-effort"),
    ("empty_env_is_unset", None, "", "etc", "none"),
    ("flag_beats_missing_env", "flag", "missing", "missing", "restricted"),
]


@pytest.mark.parametrize(("flag", "env", "etc", "policy"), [p[1:] for p in PRECEDENCE], ids=[p[0] for p in PRECEDENCE])
def test_precedence(files: dict[str, Path], flag: str | None, env: str | None, etc: str, policy: str) -> None:
    environ = {} if env is None else {ENV_VAR: str(files[env]) if env else ""}
    c = load_config(None if flag is None else files[flag], env=environ, default_path=str(files[etc]))
    assert c.policy == policy
    expected_source = files[flag] if flag else files[env] if env else files[etc] if etc != "missing" else None
    assert c.source == (None if expected_source is None else str(expected_source))


MISSING = [
    ("flag_missing", "flag", "--config"),
    ("env_missing", "env", "$NUMA_PIN_CONFIG"),
    ("flag_empty", "empty", "--config"),
]


@pytest.mark.parametrize(("how", "word"), [m[1:] for m in MISSING], ids=[m[0] for m in MISSING])
def test_named_file_must_exist(files: dict[str, Path], how: str, word: str) -> None:
    missing = str(files["missing"])
    with pytest.raises(ConfigError) as info:
        if how == "flag":
            load_config(missing, env={}, default_path=str(files["etc"]))
        elif how == "empty":
            load_config("", env={}, default_path=str(files["etc"]))
        else:
            load_config(None, env={ENV_VAR: missing}, default_path=str(files["etc"]))
    assert word in str(info.value)
    if how != "empty":
        assert missing in str(info.value)


def test_resolve_config_path(files: dict[str, Path]) -> None:
    assert resolve_config_path(None, {}, str(files["missing"])) is None
    assert resolve_config_path(files["flag"], {}, str(files["etc"])) == str(files["flag"])


def test_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path, env={})


# ---- file-level errors -------------------------------------------------------------

FILE_ERRORS = [
    ("syntax", "policy: [none\n", "invalid YAML at line"),
    ("tab_indent", "cpu_manager:\n\toptions: {}\n", "invalid YAML at line 2"),
    ("duplicate_key", "policy: none\nscope: pod\npolicy: restricted\n", "duplicate key 'policy'"),
    ("duplicate_nested", "cpu_manager:\n  num_reserved_cpus: 1\n  num_reserved_cpus: 2\n", "duplicate key"),
    ("unhashable_key", "? [a, b]\n: 1\n", "invalid YAML"),
    ("not_mapping", "- policy\n", "must be a mapping"),
    ("scalar", "just text\n", "must be a mapping"),
    ("python_tag", "policy: !!python/object/apply:os.system [echo]\n", "invalid YAML"),
    ("unknown_key", "policy: none\nsysfs: /sys\n", "sysfs: unknown key"),
    ("nested_bad_value", "reserved_memory:\n  0:\n    memory: lots\n", "reserved_memory.0.memory"),
]


@pytest.mark.parametrize(("text", "word"), [f[1:] for f in FILE_ERRORS], ids=[f[0] for f in FILE_ERRORS])
def test_file_errors_name_the_file(tmp_path: Path, text: str, word: str) -> None:
    path = _write(tmp_path / "config.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value).startswith(f"{path}: ")
    assert word in str(info.value)


def test_yaml_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    # an explicit key may override a merged one; that is not a duplicate
    path = _write(tmp_path / "m.yaml", "inference:\n  <<: {hugepages: false, syslog: false}\n  syslog: true\n")
    with pytest.raises(ConfigError, match="inference.syslog: unknown key"):
        load_config(path, env={})  # merged keys are validated like any other
    path = _write(tmp_path / "ok.yaml", "inference:\n  <<: {hugepages: false, device_plugin_env: false}\n"
                  "  hugepages: true\n")
    c = load_config(path, env={})
    assert c.inference.hugepages is True and c.inference.device_plugin_env is False


def test_non_utf8_is_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"policy: \xff\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_config(path, env={})


def test_oversized_file_is_config_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.yaml", "#" * (2 << 20))
    with pytest.raises(ConfigError, match="larger than"):
        load_config(path, env={})


def test_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes("\ufeffpolicy: none\n".encode())
    assert load_config(path, env={}).policy == "none"


# ---- cache -------------------------------------------------------------------------


class _ParseCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = load_mod._parse_yaml

        def counting(text: str, source: str | None) -> object:
            self.calls += 1
            return real(text, source)

        monkeypatch.setattr(load_mod, "_parse_yaml", counting)


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> _ParseCounter:
    monkeypatch.setattr(load_mod, "_RACY_NS", 0)  # test files are always brand new
    return _ParseCounter(monkeypatch)


def test_recently_changed_file_is_not_cached(tmp_path: Path, cfg: Path) -> None:
    cache = tmp_path / "cache"
    load_config(cfg, env={}, cache_dir=cache)  # cfg was written a moment ago
    assert not cache.exists() or not os.listdir(cache)


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    return _write(tmp_path / "etc" / "config.yaml", "policy: restricted\nreserved_memory: {0: {memory: 1Gi}}\n")


def _cache_path(cache: Path, cfg: Path) -> Path:
    return Path(load_mod.cache_file(str(cache), os.path.realpath(cfg)))


def test_cache_hit_skips_yaml(tmp_path: Path, cfg: Path, counter: _ParseCounter) -> None:
    cache = tmp_path / "cache"
    first = load_config(cfg, env={}, cache_dir=cache)
    second = load_config(cfg, env={}, cache_dir=cache)
    assert counter.calls == 1
    assert first == second and second.source == str(cfg)
    assert second.reserved_memory[0]["memory"] == 1 << 30
    entry = _cache_path(cache, cfg)
    assert entry.stat().st_mode & 0o777 == 0o600
    assert cache.stat().st_mode & 0o777 == 0o700


def test_touch_invalidates(tmp_path: Path, cfg: Path, counter: _ParseCounter) -> None:
    cache = tmp_path / "cache"
    load_config(cfg, env={}, cache_dir=cache)
    st = cfg.stat()
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns - 10_000_000))  # in the past: never "racy"
    load_config(cfg, env={}, cache_dir=cache)
    assert counter.calls == 2
    load_config(cfg, env={}, cache_dir=cache)
    assert counter.calls == 2  # re-cached


def test_same_size_edit_with_mtime_restored_invalidates(tmp_path: Path, cfg: Path, counter: _ParseCounter) -> None:
    cache = tmp_path / "cache"
    assert load_config(cfg, env={}, cache_dir=cache).policy == "restricted"
    st = cfg.stat()
    text = cfg.read_text().replace("restricted", "none      ")
    with open(cfg, "r+") as fp:  # in place: same inode, same size
        fp.write(text)

    def restore_mtime() -> bool:  # an editor that preserves mtime; ctime is the kernel's coarse clock
        os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))
        return cfg.stat().st_ctime_ns != st.st_ctime_ns

    wait_for(restore_mtime, "the coarse kernel clock to tick, so ctime moves")
    assert cfg.stat().st_size == st.st_size and cfg.stat().st_ino == st.st_ino
    assert load_config(cfg, env={}, cache_dir=cache).policy == "none"  # ctime changed
    assert counter.calls == 2


def test_replaced_file_invalidates(tmp_path: Path, cfg: Path, counter: _ParseCounter) -> None:
    cache = tmp_path / "cache"
    load_config(cfg, env={}, cache_dir=cache)
    new = _write(tmp_path / "new.yaml", "policy: none\nreserved_memory: {0: {memory: 1Gi}}\n")
    os.replace(new, cfg)
    assert load_config(cfg, env={}, cache_dir=cache).policy == "none"
    assert counter.calls == 2


def _tamper(entry: Path, how: str) -> None:
    doc = json.loads(entry.read_text())
    if how == "garbage":
        entry.write_text("{not json")
        return
    if how == "version":
        doc["key"]["numa_pin"] = "0.0.0-other"
    elif how == "path":
        doc["key"]["path"] = "/elsewhere.yaml"
    elif how == "checksum":
        doc["config"]["policy"] = "none"
    elif how == "invalid_but_signed":
        doc["config"]["policy"] = "bogus"
        doc["checksum"] = load_mod._digest(doc["config"])
    elif how == "format":
        doc["format"] = 99
    elif how == "list":
        doc = [doc]
    entry.write_text(json.dumps(doc))


@pytest.mark.parametrize("how", ["garbage", "version", "path", "checksum", "invalid_but_signed", "format", "list"])
def test_bad_cache_is_ignored_and_rewritten(tmp_path: Path, cfg: Path, counter: _ParseCounter, how: str) -> None:
    cache = tmp_path / "cache"
    load_config(cfg, env={}, cache_dir=cache)
    entry = _cache_path(cache, cfg)
    _tamper(entry, how)
    os.chmod(entry, 0o600)
    assert load_config(cfg, env={}, cache_dir=cache).policy == "restricted"
    assert counter.calls == 2
    load_config(cfg, env={}, cache_dir=cache)
    assert counter.calls == 2  # rewritten and trusted again


@pytest.mark.parametrize("mode", [0o620, 0o602], ids=["group-writable", "world-writable"])
def test_cache_writable_by_others_is_not_trusted(tmp_path: Path, cfg: Path, counter: _ParseCounter, mode: int) -> None:
    cache = tmp_path / "cache"
    load_config(cfg, env={}, cache_dir=cache)
    os.chmod(_cache_path(cache, cfg), mode)
    load_config(cfg, env={}, cache_dir=cache)
    assert counter.calls == 2


def test_cache_symlink_is_not_followed(tmp_path: Path, cfg: Path, counter: _ParseCounter) -> None:
    cache = tmp_path / "cache"
    load_config(cfg, env={}, cache_dir=cache)
    entry = _cache_path(cache, cfg)
    real = tmp_path / "elsewhere.json"
    os.replace(entry, real)
    entry.symlink_to(real)
    load_config(cfg, env={}, cache_dir=cache)
    assert counter.calls == 2


def test_unwritable_cache_dir_is_harmless(tmp_path: Path, cfg: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert load_config(cfg, env={}, cache_dir=blocker / "cache").policy == "restricted"


def test_invalid_file_is_never_cached(tmp_path: Path, counter: _ParseCounter) -> None:
    cache = tmp_path / "cache"
    bad = _write(tmp_path / "bad.yaml", "policy: nope\n")
    for _ in range(2):
        with pytest.raises(ConfigError, match="policy"):
            load_config(bad, env={}, cache_dir=cache)
    assert counter.calls == 2
    assert not cache.exists() or not os.listdir(cache)


# ---- import cost -------------------------------------------------------------------

_PROBE = r"""
import sys
from numa_pin.config import load, load_config
load._RACY_NS = 0  # the file was just written
c = load_config(sys.argv[1] or None, env={}, cache_dir=sys.argv[2] or None, default_path="/nonexistent/numa-pin.yaml")
print(c.policy, "yaml" in sys.modules)
"""


def _probe(path: str, cache: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, path, cache], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_yaml_is_imported_only_to_parse(tmp_path: Path, cfg: Path) -> None:
    cache = str(tmp_path / "cache")
    assert _probe("", "") == "best-effort False"  # defaults: no yaml
    assert _probe(str(cfg), cache) == "restricted True"  # first load parses
    assert _probe(str(cfg), cache) == "restricted False"  # cache hit: no yaml


def test_defaults_config_equals_builtin(tmp_path: Path) -> None:
    assert load_config(None, env={}, default_path=str(tmp_path / "none.yaml")) == Config()
