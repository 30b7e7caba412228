"""The systemd guest's builder without booting anything: mirror, recipe hash, qemu command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import sysimage
from .test_vm_systemd import INSTALL_DOC, ctr_recipe


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"debian.sources": "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n"
                            "\nTypes: deb\nURIs: http://security.example/debian-security\n"},
         "http://mirror.example/debian"),
        ({"sources.list": "# comment\ndeb [arch=amd64] http://ftp.example/debian bookworm main\n"},
         "http://ftp.example/debian"),
        ({"sources.list": "deb http://security.debian.org/debian-security bookworm-security main\n"},
         "http://deb.debian.org/debian"),
        ({}, "http://deb.debian.org/debian"),
    ],
    ids=["deb822", "one-line-with-options", "only-security", "none"],
)
def test_the_archive_is_the_one_apt_uses(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert sysimage.archive_mirror((tmp_path / "sources.list", tmp_path)) == expected


def test_the_recipe_hash_follows_what_goes_into_the_tree() -> None:
    kernel = Path("/boot/vmlinuz-6.1.0-9-amd64")
    base = sysimage.recipe("http://deb.debian.org/debian", kernel)
    same = sysimage.recipe("http://deb.debian.org/debian", kernel)
    assert sysimage.recipe_hash(base) == sysimage.recipe_hash(same)
    changed = [
        sysimage.recipe("http://other.example/debian", kernel),
        sysimage.recipe("http://deb.debian.org/debian", Path("/boot/vmlinuz-6.1.0-10-amd64")),
        {**base, "packages": [*base["packages"], "strace"]},  # type: ignore[list-item]
        {**base, "version": sysimage.RECIPE_VERSION + 1},
    ]
    assert len({sysimage.recipe_hash(r) for r in changed} | {sysimage.recipe_hash(base)}) == len(changed) + 1


def test_qemu_boots_two_nodes_on_the_unified_hierarchy_under_tcg(tmp_path: Path) -> None:
    argv = sysimage.qemu_argv(Path("/k"), Path("/i"), tmp_path / "root.ext4", tmp_path)
    joined = " ".join(argv)
    assert "accel=tcg" in joined and "kvm" not in joined
    assert "systemd.unified_cgroup_hierarchy=1" in argv[argv.index("-append") + 1]
    nodes = [argv[i + 1] for i, a in enumerate(argv) if a == "-numa"]
    assert nodes == [f"node,nodeid={i},memdev=m{i},cpus={cpus}" for i, (_, cpus) in enumerate(sysimage.NUMA)]
    assert f"mount_tag={sysimage.SHARE_TAG}" in joined


@pytest.mark.parametrize("node", [None, 1], ids=["no-device", "device-on-node-1"])
def test_qemu_puts_the_guests_device_behind_an_iommu_on_its_node(tmp_path: Path, node: int | None) -> None:
    """The IOMMU comes before every PCI device (qemu refuses it after one); with a device, the disk
    and the share sit on the root bus by name (left to find a bus, one takes the expander bridge's,
    where only bridges may go); the device sits behind a root port of an expander bridge of ``node``."""
    argv = sysimage.qemu_argv(Path("/k"), Path("/i"), tmp_path / "root.ext4", tmp_path, node)
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]
    iommu = "intel_iommu=on" in argv[argv.index("-append") + 1]
    if node is None:
        assert not iommu and not devices and "if=virtio" in argv[argv.index("-drive") + 1]
        return
    assert "-virtfs" not in argv and "if=none" in argv[argv.index("-drive") + 1]
    assert [d for d in devices if d.startswith("virtio-")] == [
        "virtio-blk-pci,drive=vda,bus=pcie.0", f"virtio-9p-pci,fsdev={sysimage.SHARE_TAG},"
        f"mount_tag={sysimage.SHARE_TAG},bus=pcie.0"]
    assert iommu and devices[0].startswith("intel-iommu,")
    bridge, port, device = devices[-3:]
    assert f"numa_node={node}" in bridge and f"bus=pxb{node}" in port and device == f"{sysimage.DEVICE[0]},bus=rp{node}"


def test_the_install_doc_ctr_recipe_is_found_and_unindented() -> None:
    recipe = ctr_recipe(INSTALL_DOC.read_text())
    lines = recipe.splitlines()
    assert lines[0].startswith("ctr oci spec > spec.json")
    assert lines[-1].startswith("ctr run --rm --config spec-with-hooks.json")
    assert "EOF" in lines, "the heredoc's end marker is at the start of its line"


def test_each_flavour_has_its_own_recipe_and_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = Path("/boot/vmlinuz-6.1.0-9-amd64")
    for flavour in (sysimage.BOOKWORM, sysimage.TRIXIE):
        monkeypatch.delenv(flavour.cache_env, raising=False)
    bookworm = sysimage.recipe("http://deb.debian.org/debian", kernel)
    trixie = sysimage.recipe("http://deb.debian.org/debian", kernel, sysimage.TRIXIE)
    assert (bookworm["suite"], trixie["suite"]) == ("bookworm", "trixie")
    assert sysimage.recipe_hash(bookworm) != sysimage.recipe_hash(trixie)
    assert '[plugins."io.containerd.nri.v1.nri"]\n  disable = false' in str(trixie["containerd"])
    assert "nri" not in str(bookworm["containerd"])
    assert sysimage.cache_dir() != sysimage.cache_dir(sysimage.TRIXIE)
    monkeypatch.setenv(sysimage.TRIXIE.cache_env, "/somewhere")
    assert sysimage.cache_dir(sysimage.TRIXIE) == Path("/somewhere")
    # dpkg -i of the checkout's deb in either guest needs every package the deb depends on there
    control = (sysimage.REPO / "packaging" / "deb" / "control.in").read_text()
    depends = next(line for line in control.splitlines() if line.startswith("Depends:"))
    wanted = {dep.split("(")[0].strip() for dep in depends.removeprefix("Depends:").split(",")}
    for flavour in (sysimage.BOOKWORM, sysimage.TRIXIE, sysimage.SID):
        recipe = sysimage.recipe("http://deb.debian.org/debian", kernel, flavour)
        present = {*recipe["packages"], *recipe["apt"]}  # type: ignore[misc]
        assert wanted - {"python3"} <= present, (flavour.suite, wanted - present)


@pytest.mark.parametrize("flavour", [sysimage.BOOKWORM, sysimage.TRIXIE, sysimage.SID], ids=["bookworm", "trixie", "sid"])
def test_debootstrap_gets_the_flavours_suite_and_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          flavour: sysimage.Flavour) -> None:
    calls: list[list[str]] = []

    class Stop(Exception):
        pass

    def fake_run(argv: list[str], log: Path, timeout: float, **kw: object) -> None:
        calls.append(argv)
        raise Stop

    monkeypatch.setattr(sysimage, "_run", fake_run)
    monkeypatch.setattr(sysimage, "kernel_pair", lambda: (Path("/boot/vmlinuz-6.1.0-9-amd64"), Path("/i")))
    monkeypatch.setattr(sysimage, "archive_mirror", lambda: "http://mirror.example/debian")
    monkeypatch.setenv(flavour.cache_env, str(tmp_path / "cache"))
    with pytest.raises(Stop):
        sysimage.base_tree(tmp_path / "log", flavour)
    (argv,) = calls
    include = next(a for a in argv if a.startswith("--include=")).removeprefix("--include=").split(",")
    assert sorted(include) == sorted(flavour.packages) and flavour.suite in argv
