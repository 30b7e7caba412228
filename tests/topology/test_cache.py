"""The topology cache returns what discovery returns, and notices run-time changes."""

import os

import pytest

from numa_pin.testing import machine, shapes
from numa_pin.topology import cache
from numa_pin.topology.discover import discover


@pytest.mark.parametrize("shape", ["intel-2s-ht", "gpu8-sriov", "cpuless-memory-node"], ids=str)
def test_round_trip_equals_discovery(tmp_path, shape):
    built = machine.build(shapes.SHAPES[shape](), tmp_path / "m")
    live = discover(built.sysfs_root, built.proc_root)
    assert cache.from_dict(cache.to_dict(live)) == live
    first = cache.cached_discover(built.sysfs_root, built.proc_root, str(tmp_path / "c"))
    second = cache.cached_discover(built.sysfs_root, built.proc_root, str(tmp_path / "c"))
    assert first == live and second == live


def _hugepage_file(sysfs_root):
    hp = os.path.join(sysfs_root, "devices/system/node/node0/hugepages")
    size = sorted(os.listdir(hp))[0]
    return os.path.join(hp, size, "nr_hugepages")


def test_fingerprint_change_forces_rediscovery(tmp_path):
    built = machine.build(shapes.SHAPES["intel-2s-ht"](), tmp_path / "m")
    cdir = str(tmp_path / "c")
    before = cache.cached_discover(built.sysfs_root, built.proc_root, cdir)
    path = _hugepage_file(built.sysfs_root)
    with open(path, "w") as fp:
        fp.write("7\n")
    after = cache.cached_discover(built.sysfs_root, built.proc_root, cdir)
    assert after != before
    assert after == discover(built.sysfs_root, built.proc_root)


def test_stale_entry_is_refreshed(tmp_path, monkeypatch):
    built = machine.build(shapes.SHAPES["laptop"](), tmp_path / "m")
    cdir = str(tmp_path / "c")
    cache.cached_discover(built.sysfs_root, built.proc_root, cdir, now=1000.0)
    calls = []
    real = discover

    def counting(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr("numa_pin.topology.discover.discover", counting)
    cache.cached_discover(built.sysfs_root, built.proc_root, cdir, now=1010.0)
    assert calls == []
    cache.cached_discover(built.sysfs_root, built.proc_root, cdir, now=1000.0 + cache.DEFAULT_MAX_AGE_S + 1)
    assert len(calls) == 1


@pytest.mark.parametrize("garbage", ["", "{", '{"format": 1}', "[]"], ids=["empty", "truncated", "no-fields", "list"])
def test_damaged_cache_falls_back_to_discovery(tmp_path, garbage):
    built = machine.build(shapes.SHAPES["laptop"](), tmp_path / "m")
    cdir = tmp_path / "c"
    cache.cached_discover(built.sysfs_root, built.proc_root, str(cdir))
    for f in cdir.iterdir():
        f.write_text(garbage)
    assert cache.cached_discover(built.sysfs_root, built.proc_root, str(cdir)) == discover(
        built.sysfs_root, built.proc_root
    )
