"""Find, read and cache the configuration file.

Precedence (the first that applies wins):

1. ``path`` given explicitly (``numa-pin --config PATH``): it must exist;
2. the ``NUMA_PIN_CONFIG`` environment variable, when set and non-empty: it must exist;
3. ``/etc/numa-pin/config.yaml`` when it exists;
4. the built-in defaults (:data:`numa_pin.config.schema.ITEMS`).

PyYAML is imported only when a file is actually parsed. With ``cache_dir`` the
validated configuration is kept as JSON in ``<cache_dir>/config-<hash>.json``, keyed by
the file's real path, ``st_dev``, ``st_ino``, ``st_size``, ``st_mtime_ns``,
``st_ctime_ns`` and the numa-pin version; a cache whose key differs, that does not
parse, fails its checksum or validation, or that is not a private file of the current
user is ignored (and rewritten). A cache directory that others could write (or one above it)
is refused with :class:`~numa_pin.errors.UnsafePathError`. A file changed within the last two seconds is not
cached, so two same-size edits inside one timestamp tick cannot leave a stale entry.
The cache only skips YAML parsing: its content is validated again on every load.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

from numa_pin import __version__
from numa_pin.base.boundedio import UnsafeInput, json_loads_bounded, open_regular, read_fd
from numa_pin.base.digest import sha256_hex
from numa_pin.base.safefs import ensure_dir, replace_private
from numa_pin.base.text import one_line
from numa_pin.config.schema import Config, config_from_dict
from numa_pin.errors import ConfigError, NumaPinError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

#: the system-wide configuration file
DEFAULT_PATH = "/etc/numa-pin/config.yaml"
#: environment variable naming a configuration file
ENV_VAR = "NUMA_PIN_CONFIG"
#: where :func:`entry_config` keeps the parsed config between runs when asked to cache
DEFAULT_CACHE_DIR = "/run/numa-pin"
#: environment variable naming another cache directory
CACHE_ENV = "NUMA_PIN_CACHE_DIR"

_CACHE_FORMAT = 1
#: a file changed this recently is not cached: a second same-size edit within one
#: timestamp tick would leave mtime and ctime unchanged ("racy git" problem)
_RACY_NS = 2_000_000_000
_MAX_CONFIG_BYTES = 1 << 20  # a config file larger than 1 MiB is a mistake
#: deepest nesting of lists and mappings in a config (a real one nests 3 or 4 levels)
_MAX_DEPTH = 64
#: most values (scalars and collections, aliases expanded) in a config
_MAX_NODES = 200_000


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] = os.environ,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    default_path: str = DEFAULT_PATH,
) -> Config:
    """Load the configuration following the precedence above.

    Raises:
        ConfigError: an explicitly named file (argument or ``NUMA_PIN_CONFIG``) is
            missing; a file is unreadable, not UTF-8, not YAML, or fails validation.
    """
    chosen = resolve_config_path(path, env, default_path)
    if chosen is None:
        return Config()
    return _load_file(chosen, None if cache_dir is None else os.fspath(cache_dir))


def entry_config(
    path: str | None,
    env: Mapping[str, str],
    *,
    cwd: str | None = None,
    cached: bool = False,
    or_defaults: bool = False,
) -> tuple[Config, str | None]:
    """The config an entry point runs with, and the cache directory it was read through (None
    when not ``cached``): the one loader of the hook, the agent, the NRI plugin, metrics and the
    operator commands. ``path`` (``--config``) wins over ``NUMA_PIN_CONFIG``, then the default
    file (:func:`load_config`).

    ``cwd``: relative paths (``path``, ``NUMA_PIN_CONFIG``, ``NUMA_PIN_CACHE_DIR``) are resolved
    against it (a hook's request names the directory it runs in); None leaves them to this
    process's own. ``cached``: read through ``NUMA_PIN_CACHE_DIR`` (default
    :data:`DEFAULT_CACHE_DIR`), as the hook does on every container start. ``or_defaults``: a
    config that cannot be loaded gives the built-in defaults instead of raising (the rootless
    hook, which must pass a container that asks for nothing).

    Raises:
        ConfigError: the named file is missing or invalid (not with ``or_defaults``).
        UnsafePathError: the cache directory is unsafe (not with ``or_defaults``).
    """
    named = env.get(ENV_VAR)
    if cwd is not None and named:
        env = {**env, ENV_VAR: at_dir(cwd, named)}
    if path is not None and cwd is not None:
        path = at_dir(cwd, path)
    cache_dir = None
    if cached:
        cache_dir = env.get(CACHE_ENV) or DEFAULT_CACHE_DIR
        cache_dir = cache_dir if cwd is None else at_dir(cwd, cache_dir)
    try:
        return load_config(path, env, cache_dir=cache_dir), cache_dir
    except NumaPinError:
        if not or_defaults:
            raise
        return Config(), cache_dir


def at_dir(cwd: str, path: str) -> str:
    """``path`` resolved against ``cwd`` (an absolute path is kept)."""
    return path if path.startswith("/") else f"{cwd.rstrip('/')}/{path}"


def resolve_config_path(
    path: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    default_path: str = DEFAULT_PATH,
) -> str | None:
    """The file :func:`load_config` would read, or None for the built-in defaults.

    Raises:
        ConfigError: the explicit path or the one in ``NUMA_PIN_CONFIG`` does not exist.
    """
    if path is not None:
        explicit = os.fspath(path)
        if not explicit or not os.path.exists(explicit):
            raise ConfigError("config file not found (named with --config)", path=explicit or "''")
        return explicit
    from_env = env.get(ENV_VAR, "")
    if from_env:
        if not os.path.exists(from_env):
            raise ConfigError(f"config file not found (named by ${ENV_VAR})", path=from_env)
        return from_env
    if os.path.exists(default_path):
        return default_path
    return None


def config_from_yaml(text: str, source: str | None = None) -> Config:
    """Parse and validate YAML text.

    Raises:
        ConfigError: the text is not YAML (line and column given) or fails validation.
    """
    return config_from_dict(_parse_yaml(text, source), source)


# ---- reading -----------------------------------------------------------------------


def _load_file(path: str, cache_dir: str | None) -> Config:
    real = os.path.realpath(path)
    try:
        fd, before = open_regular(real)
    except UnsafeInput as exc:
        raise ConfigError(str(exc), path=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot open: {exc.strerror}", path=path) from None
    try:
        key = _cache_key(real, before)
        if cache_dir is not None:
            try:
                ensure_dir(cache_dir, 0o700)  # UnsafePathError when others could write there
            except OSError:
                cache_dir = None  # cannot be created or examined: no cache, only slower
        if cache_dir is not None:
            cached = _read_cache(cache_dir, key, path)
            if cached is not None:
                return cached
        raw = _read_all(fd, path)
        stable = _cache_key(real, os.fstat(fd)) == key and not _recently_changed(before)
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    config = config_from_yaml(text, path)
    if cache_dir is not None and stable:
        _write_cache(cache_dir, key, config)
    return config


def _recently_changed(st: os.stat_result) -> bool:
    return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS


def _read_all(fd: int, path: str) -> bytes:
    try:
        return read_fd(fd, _MAX_CONFIG_BYTES)
    except UnsafeInput as exc:
        raise ConfigError(str(exc), path=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", path=path) from None


_loader_class: Any = None


def _loader() -> Any:
    """PyYAML's safe loader (libyaml when available) that refuses duplicate keys."""
    global _loader_class
    if _loader_class is not None:
        return _loader_class
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        duplicate = key in seen
                    except TypeError:
                        continue  # unhashable: the base class reports it
                    if duplicate:
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping",
                            node.start_mark,
                            f"found duplicate key {key!r}",
                            key_node.start_mark,
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    _loader_class = StrictLoader
    return StrictLoader


def _check_shape(text: str, source: str | None) -> None:
    """Walk YAML's event stream (libyaml's parser is iterative) before anything recursive
    runs: composing 50,000 nested ``[`` overflows the C loader's stack (SIGSEGV), and a chain
    of aliases ("billion laughs") multiplies into more nodes than any config has.

    Raises:
        ConfigError: nested deeper than :data:`_MAX_DEPTH`, or more than :data:`_MAX_NODES`
            nodes once aliases are expanded.
        yaml.YAMLError: the text is not YAML.
    """
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    open_counts: list[int] = [0]  # expanded nodes inside each open collection
    open_anchors: list[str | None] = [None]
    anchors: dict[str, int] = {}
    total = 0
    for event in yaml.parse(text, Loader=base):
        if isinstance(event, yaml.CollectionStartEvent):
            open_counts.append(1)
            open_anchors.append(event.anchor)
            total += 1
            if len(open_counts) - 1 > _MAX_DEPTH:
                mark = event.start_mark
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
                raise ConfigError(f"invalid YAML{where}: nested more than {_MAX_DEPTH} levels deep", path=source)
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            count, anchor = open_counts.pop(), open_anchors.pop()
            if anchor is not None:
                anchors[anchor] = count
            open_counts[-1] += count
            continue
        if isinstance(event, yaml.ScalarEvent):
            count = 1
            if event.anchor is not None:
                anchors[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            count = anchors.get(event.anchor, 1)
        else:
            continue
        open_counts[-1] += count
        total += count
        if total > _MAX_NODES:
            raise ConfigError(f"invalid YAML: more than {_MAX_NODES} values once aliases are expanded", path=source)


def _parse_yaml(text: str, source: str | None) -> Any:
    import yaml

    try:
        _check_shape(text, source)
        return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join((exc.problem or exc.context or "syntax error").split())
        raise ConfigError(f"invalid YAML{where}: {one_line(problem)}", path=source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {one_line(' '.join(str(exc).split()))}", path=source) from None
    except RecursionError:
        raise ConfigError("invalid YAML: nested too deeply", path=source) from None


# ---- cache -------------------------------------------------------------------------


def _cache_key(real: str, st: os.stat_result) -> dict[str, Any]:
    return {
        "path": real,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "numa_pin": __version__,
    }


def cache_file(cache_dir: str, real_path: str) -> str:
    """Where the cache of the config file ``real_path`` lives."""
    digest = sha256_hex(real_path.encode("utf-8", "surrogateescape"))[:16]
    return os.path.join(cache_dir, f"config-{digest}.json")


def _digest(config: Mapping[str, Any]) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return "sha256:" + sha256_hex(canonical.encode("utf-8"))


def _read_cache(cache_dir: str, key: Mapping[str, Any], source: str) -> Config | None:
    """The cached config when the cache is trustworthy and its key matches, else None."""
    target = cache_file(cache_dir, key["path"])
    try:
        fd, st = open_regular(target, follow=False)
    except (OSError, UnsafeInput):
        return None
    try:
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        doc = json_loads_bounded(_read_all(fd, target), _MAX_DEPTH)
    except (OSError, ValueError, ConfigError):
        return None
    finally:
        os.close(fd)
    if not isinstance(doc, dict) or doc.get("format") != _CACHE_FORMAT or doc.get("key") != key:
        return None
    body = doc.get("config")
    if not isinstance(body, dict) or doc.get("checksum") != _digest(body):
        return None
    try:
        return config_from_dict(body, source)
    except ConfigError:
        return None


def _write_cache(cache_dir: str, key: Mapping[str, Any], config: Config) -> None:
    """Best effort: a cache that cannot be written only costs the next load a parse."""
    body = json.loads(json.dumps(config.to_dict()))  # the form a reader will see (str keys)
    doc = {"format": _CACHE_FORMAT, "key": dict(key), "checksum": _digest(body), "config": body}
    try:
        payload = json.dumps(doc, sort_keys=True).encode("utf-8")
        replace_private(cache_dir, cache_file(cache_dir, key["path"]), payload)
    except (OSError, ValueError):
        pass


__all__ = ["CACHE_ENV", "DEFAULT_CACHE_DIR", "DEFAULT_PATH", "ENV_VAR", "at_dir", "cache_file", "config_from_yaml",
           "entry_config", "load_config", "resolve_config_path"]
