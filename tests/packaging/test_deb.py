"""The Debian package: ``make deb`` in a clean ``git clone``, what is in it, and that it runs.

The package is built from a fresh clone of this checkout's committed HEAD (so a file that only
exists in the working tree, or a build that needs the venv, fails here), with Debian's own
python3 and setuptools. The expectations come from the issue, not from the build script: the
dependency list, the paths, the interpreter. Installed two ways:

* extracted with ``dpkg -x`` into a temporary root and run with Debian's ``/usr/bin/python3``
  and Debian's python3-psutil/pyroute2/prctl/yaml (no venv on the path): ``--help``,
  ``topology``, ``plan``, and a hook admission and release on a fake node;
* for real, ``apt-get install ./numa-pin_*.deb`` on this machine (root only), then
  ``apt-get purge``: the files are there while installed and gone afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest
from crio_hooks import CRIO_DEFAULT_DIRS, PODMAN_EXTENSION_STAGES, check_dir

from numa_pin.agent.protocol import DEFAULT_SOCKET
from numa_pin.testing.node import FakeNode

pytestmark = pytest.mark.deb

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
SYSTEM_PYTHON = "/usr/bin/python3"
#: the issue's dependency list: Debian's interpreter and modules, nothing vendored
WANT_DEPENDS = {"python3 (>= 3.11)", "python3-psutil", "python3-pyroute2", "python3-prctl", "python3-yaml",
                 "python3-prometheus-client", "python3-protobuf", "python3-grpcio", "libbpf1"}
HOOKS_D = "usr/share/containers/oci/hooks.d"
#: podman's own hooks directory and the containers.conf.d drop-in that adds it to podman's hooks_dir
PODMAN_HOOKS_D = "usr/share/numa-pin/podman/hooks.d"
PODMAN_DROP_IN = "etc/containers/containers.conf.d/numa-pin.conf"
UNITS = ("numa-pin-agent.socket", "numa-pin-agent.service", "numa-pin-reconcile.timer", "numa-pin-reconcile.service",
         "numa-pin-nrt.service", "numa-pin-nri.service")
WANT_FILES = {
    "usr/bin/numa-pin", "usr/bin/numa-pin-hook", "usr/bin/numa-pin-runc",
    f"{HOOKS_D}/numa-pin.json", f"{HOOKS_D}/numa-pin-release.json", f"{PODMAN_HOOKS_D}/numa-pin-precreate.json",
    "etc/numa-pin/config.yaml", PODMAN_DROP_IN,
    "usr/lib/python3/dist-packages/numa_pin/nri/descriptors.binpb",
    "usr/lib/python3/dist-packages/numa_pin/podresources/descriptors.binpb",
    "usr/share/numa-pin/runc/hooks-snippet.json",
    "usr/share/numa-pin/containerd/config.toml", "usr/share/numa-pin/containerd/hooks.json",
    "usr/share/numa-pin/containerd/numa-pin-containerd-spec",
    "usr/share/doc/numa-pin/README.md", "usr/share/doc/numa-pin/docs/install.md",
    "usr/share/doc/numa-pin/docs/design/enforcer.md",
    "usr/lib/python3/dist-packages/numa_pin/__init__.py",
    "usr/lib/python3/dist-packages/numa_pin/cli/main.py",
    "usr/lib/python3/dist-packages/numa_pin/entry/hook.py",
    f"usr/lib/python3/dist-packages/numa_pin-{VERSION}.dist-info/METADATA",
    *(f"lib/systemd/system/{unit}" for unit in UNITS),
}
DEB_MODULES = ("psutil", "pyroute2", "prctl", "yaml", "prometheus_client")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 600), **kw)


def _need_tools() -> None:
    for tool in ("git", "make", "dpkg-deb", "dpkg"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    probe = _run([SYSTEM_PYTHON, "-c", "import setuptools, wheel"]) if os.path.exists(SYSTEM_PYTHON) else None
    if probe is None or probe.returncode != 0:
        pytest.skip("Debian's python3 with python3-setuptools and python3-wheel is needed to build the deb")


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make deb`` in a clean clone of this checkout; the .deb it made."""
    _need_tools()
    clone = tmp_path_factory.mktemp("deb") / "numa-pin"
    cloned = _run(["git", "clone", "-q", str(REPO), str(clone)])
    assert cloned.returncode == 0, cloned.stderr
    built = _run(["make", "-C", str(clone), "deb"])
    assert built.returncode == 0, built.stdout + built.stderr
    debs = sorted(clone.glob("*.deb"))
    assert [d.name for d in debs] == [f"numa-pin_{VERSION}_all.deb"], built.stdout
    assert _run(["git", "-C", str(clone), "status", "--porcelain"]).stdout == "", "make deb left files in the tree"
    return debs[0]


@pytest.fixture(scope="module")
def members(deb: Path) -> dict[str, tarfile.TarInfo]:
    """The data archive's members by path (no leading ``./``)."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True, timeout=120)
    tar_path = deb.with_suffix(".tar")
    tar_path.write_bytes(data.stdout)
    with tarfile.open(tar_path) as tar:
        return {m.name.removeprefix("./").rstrip("/"): m for m in tar.getmembers() if m.name not in ("./", ".")}


def _depends(field: str) -> set[str]:
    return {part.strip() for part in field.split(",") if part.strip()}


def test_control_fields(deb):
    fields = _run(["dpkg-deb", "-f", str(deb), "Package", "Version", "Architecture", "Depends"]).stdout
    parsed = dict(line.split(": ", 1) for line in fields.splitlines())
    assert (parsed["Package"], parsed["Version"], parsed["Architecture"]) == ("numa-pin", VERSION, "all")
    assert _depends(parsed["Depends"]) == WANT_DEPENDS
    info = _run(["dpkg-deb", "-I", str(deb), "conffiles"])
    assert info.stdout.split() == ["/etc/numa-pin/config.yaml", f"/{PODMAN_DROP_IN}"]


def test_the_prerm_knows_its_version(deb, tmp_path):
    """The prerm folds the ledger's journal before a downgrade: it compares with its own version,
    put in at build time (tests/packaging/test_prerm.py runs the script)."""
    control = tmp_path / "control"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True, capture_output=True, timeout=120)
    prerm = (control / "prerm").read_text()
    assert "@VERSION@" not in prerm and f'dpkg --compare-versions "$2" lt "{VERSION}"' in prerm
    assert os.access(control / "prerm", os.X_OK)


def test_files_and_nothing_vendored(members):
    assert WANT_FILES <= set(members), sorted(WANT_FILES - set(members))
    site = "usr/lib/python3/dist-packages/"
    tops = {name[len(site):].split("/")[0] for name in members if name.startswith(site) and name != site.rstrip("/")}
    assert tops == {"numa_pin", f"numa_pin-{VERSION}.dist-info"}
    assert not [n for n in members if re.search(r"(^|/)(\.venv|site-packages|__pycache__)(/|$)|\.so$|/bin/python", n)]
    for name in ("usr/bin/numa-pin", "usr/bin/numa-pin-hook", "usr/bin/numa-pin-runc"):
        assert members[name].mode & 0o111, f"{name} is not executable"


def _extract(deb: Path, root: Path) -> Path:
    subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True, timeout=120)
    return root


@pytest.fixture(scope="module")
def extracted(deb: Path, tmp_path_factory: pytest.TempPathFactory):
    root = _extract(deb, tmp_path_factory.mktemp("root"))
    yield root
    shutil.rmtree(root)
    assert not root.exists()


def test_crio_loads_every_hook_the_deb_puts_where_it_reads(extracted):
    """CRI-O stops at start-up on a hooks file its loader refuses (a podman-only precreate stage)."""
    read = {folder: check_dir(extracted / folder.lstrip("/"), extracted) for folder in CRIO_DEFAULT_DIRS
            if (extracted / folder.lstrip("/")).is_dir()}
    assert read == {"/" + HOOKS_D: ["numa-pin-release.json", "numa-pin.json"]}
    assert not (extracted / "etc/containers/oci/hooks.d").exists()


def test_podman_reads_the_precreate_hook_through_the_drop_in(extracted):
    engine = tomllib.loads((extracted / PODMAN_DROP_IN).read_text())["engine"]
    assert engine["hooks_dir"] == ["/" + HOOKS_D, "/" + PODMAN_HOOKS_D]
    assert check_dir(extracted / PODMAN_HOOKS_D, extracted, PODMAN_EXTENSION_STAGES) == ["numa-pin-precreate.json"]


def test_commands_run_on_debian_python(extracted):
    for name, want in (("numa-pin", "#!/usr/bin/python3"), ("numa-pin-hook", "#!/usr/bin/python3 -S"),
                       ("numa-pin-runc", "#!/usr/bin/python3 -S")):
        first = (extracted / "usr/bin" / name).read_text().splitlines()[0]
        assert first == want, f"{name}: {first}"


def test_shipped_files_point_at_installed_paths(extracted):
    for path in (f"{PODMAN_HOOKS_D}/numa-pin-precreate.json", f"{HOOKS_D}/numa-pin.json",
                 f"{HOOKS_D}/numa-pin-release.json"):
        hook = json.loads((extracted / path).read_text())
        assert hook["hook"]["path"] == "/usr/bin/numa-pin-hook"
    snippet = json.loads((extracted / "usr/share/numa-pin/runc/hooks-snippet.json").read_text())
    assert {e["path"] for stage in snippet["hooks"].values() for e in stage} == {"/usr/bin/numa-pin-hook"}
    units = {u: (extracted / "lib/systemd/system" / u).read_text() for u in UNITS}
    assert f"ListenStream={DEFAULT_SOCKET}\n" in units["numa-pin-agent.socket"]
    assert "ExecStart=/usr/bin/numa-pin serve\n" in units["numa-pin-agent.service"]
    assert "ExecStart=/usr/bin/numa-pin reconcile\n" in units["numa-pin-reconcile.service"]
    assert "ExecStart=/usr/bin/numa-pin nrt --watch " in units["numa-pin-nrt.service"]
    assert "ExecStart=/usr/bin/numa-pin serve --nri\n" in units["numa-pin-nri.service"]
    assert "/usr/local" not in "".join(units.values())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_units_verify(extracted):
    unit_dir = extracted / "lib/systemd/system"
    out = _run(["systemd-analyze", "verify", "--man=no", *(f"./{u}" for u in UNITS)], cwd=unit_dir)
    # the commands are not on this machine's /usr/bin unless the package is installed: checked above
    problems = [line for line in (out.stdout + out.stderr).splitlines()
                if line.strip() and "Command /usr/bin/numa-pin is not executable" not in line]
    assert problems == []


def _system_env(extracted: Path) -> dict[str, str]:
    """Debian's interpreter with only the extracted package added: no venv, no user site."""
    missing = [m for m in DEB_MODULES if _run([SYSTEM_PYTHON, "-c", f"import {m}"]).returncode]
    if missing:
        pytest.skip(f"Debian python3 modules missing: {missing} (apt-get install python3-psutil python3-pyroute2 "
                    "python3-prctl python3-yaml python3-prometheus-client)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "NUMA_PIN_"))}
    env["PYTHONPATH"] = str(extracted / "usr/lib/python3/dist-packages")
    env["PYTHONNOUSERSITE"] = "1"
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    return env


def test_extracted_package_runs(extracted, tmp_path):
    env = _system_env(extracted)
    where = _run([SYSTEM_PYTHON, "-c", "import numa_pin, yaml, psutil; print(numa_pin.__file__, yaml.__file__)"],
                 env=env)
    pkg, yaml_file = where.stdout.split()
    assert pkg.startswith(str(extracted)) and yaml_file.startswith("/usr/lib/python3/dist-packages/"), where
    cli = str(extracted / "usr/bin/numa-pin")
    helped = _run([cli, "--help"], env=env)
    assert helped.returncode == 0 and "topology" in helped.stdout, helped.stderr
    assert _run([cli, "--version"], env=env).stdout.strip() == f"numa-pin {VERSION}"
    topo = _run([cli, "topology", "--json"], env=env)
    assert topo.returncode == 0, topo.stderr
    online = Path("/sys/devices/system/cpu/online").read_text().strip()
    from numa_pin.base.cpuset import parse_list

    assert {int(c) for c in json.loads(topo.stdout)["cpus"]} == parse_list(online)
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nsyslog: false\n")
    plan = _run([cli, "plan", "--config", str(config), "--cpus", "1", "--json"], env=env)
    assert plan.returncode in (0, 1) and json.loads(plan.stdout)["container_id"] == "plan", plan.stderr


def test_extracted_hook_admits_and_releases(extracted, tmp_path, tmp_path_factory):
    env = _system_env(extracted)
    node = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    node.add_container("c0", 5000)
    config = node.write_config(policy="single-numa-node")
    env.update(NUMA_PIN_NO_AGENT="1", NUMA_PIN_CACHE_DIR=str(node.cache_dir))
    hook = str(extracted / "usr/bin/numa-pin-hook")
    state = node.oci_state("c0", 5000, {"numa-pin.io/cpus": "2"})
    admitted = subprocess.run([hook, "--config", str(config), "prestart"], input=state, capture_output=True,
                              env=env, timeout=120)
    assert (admitted.returncode, admitted.stderr) == (0, b"")
    status = json.loads(_run([str(extracted / "usr/bin/numa-pin"), "status", "--json", "--config", str(config)],
                             env=env).stdout)
    assert [g["container_id"] for g in status["grants"]] == ["c0"]
    # the metrics with Debian's prometheus_client (python3-prometheus-client), not the venv's
    where = _run([SYSTEM_PYTHON, "-c", "import prometheus_client; print(prometheus_client.__file__)"], env=env)
    assert where.stdout.startswith("/usr/lib/python3/dist-packages/"), where
    metrics = _run([str(extracted / "usr/bin/numa-pin"), "metrics", "--config", str(config)], env=env)
    assert metrics.returncode == 0, metrics.stderr
    from prometheus_client.parser import text_string_to_metric_families

    samples = {s.name: s.value for f in text_string_to_metric_families(metrics.stdout) for s in f.samples
               if not s.labels}
    assert samples["kubelet_topology_manager_admission_requests_total"] == 1
    assert samples["kubelet_cpu_manager_exclusive_cpu_allocation_count"] == 2
    released = subprocess.run([hook, "--config", str(config), "poststop"], input=state, capture_output=True,
                              env=env, timeout=120)
    assert (released.returncode, released.stderr) == (0, b"")
    status = json.loads(_run([str(extracted / "usr/bin/numa-pin"), "status", "--json", "--config", str(config)],
                             env=env).stdout)
    assert status["grants"] == []


def _installed(package: str) -> bool:
    out = _run(["dpkg-query", "-W", "-f=${Status}", package])
    return out.returncode == 0 and "installed" in out.stdout.split()


@pytest.mark.root
@pytest.mark.skipif(shutil.which("apt-get") is None, reason="installing with apt needs apt-get")
def test_apt_install_runs_and_purges(deb, tmp_path):
    """A real ``apt-get install ./numa-pin_<v>_all.deb`` on this machine, then ``apt-get purge``."""
    if _installed("numa-pin"):
        pytest.skip("numa-pin is already installed on this machine; not touching it")
    if Path("/var/lib/numa-pin").exists() or Path("/etc/numa-pin").exists():
        pytest.skip("/var/lib/numa-pin or /etc/numa-pin exists: purging would delete someone's state")
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "-y"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    local = tmp_path / deb.name  # apt wants a path it can read as _apt; /tmp is fine
    shutil.copy(deb, local)
    os.chmod(tmp_path, 0o755)
    try:
        got = _run([*apt, "install", str(local)], env=env)
        assert got.returncode == 0, got.stdout + got.stderr
        assert _installed("numa-pin")
        listed = set(_run(["dpkg", "-L", "numa-pin"]).stdout.split())
        assert {"/" + f for f in WANT_FILES} <= listed
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "NUMA_PIN_"))}
        clean["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
        assert _run(["numa-pin", "--version"], env=clean).stdout.strip() == f"numa-pin {VERSION}"
        topo = _run(["numa-pin", "topology"], env=clean)
        assert topo.returncode == 0 and topo.stdout.startswith("Machine: "), topo.stderr
        where = _run([SYSTEM_PYTHON, "-c", "import numa_pin; print(numa_pin.__file__)"], env=clean, cwd="/")
        assert where.stdout.strip() == "/usr/lib/python3/dist-packages/numa_pin/__init__.py"
        if shutil.which("systemd-analyze"):
            verify = _run(["systemd-analyze", "verify", "--man=no", *UNITS], env=clean)
            assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
        if shutil.which("podman") and Path(BUSYBOX).is_file():
            _podman_uses_the_installed_hooks(tmp_path, clean)
    finally:
        purged = _run([*apt, "purge", "numa-pin"], env=env)
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert not _installed("numa-pin")
    for gone in ("/usr/bin/numa-pin", "/usr/bin/numa-pin-hook", "/usr/lib/python3/dist-packages/numa_pin",
                 f"/{HOOKS_D}/numa-pin.json", "/etc/numa-pin", "/lib/systemd/system/numa-pin-agent.socket"):
        assert not Path(gone).exists(), f"{gone} left after purge"


BUSYBOX = "/bin/busybox"


def _podman_uses_the_installed_hooks(tmp_path: Path, env: dict[str, str]) -> None:
    """A plain ``podman run`` (no --hooks-dir) is admitted and released through the installed
    /usr/share/containers/oci/hooks.d files and /etc/numa-pin/config.yaml."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in ("sh", "cat"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    for d in ("proc", "sys", "dev", "tmp", "etc"):
        (rootfs / d).mkdir()
    store = Path("/run") / f"numa-pin-deb-{os.getpid()}"
    try:
        ran = _run(["podman", "--root", str(store / "root"), "--runroot", str(store / "run"), "--runtime", "runc",
                    "run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                    "--annotation", "numa-pin.io/cpus=1", "--rootfs", str(rootfs), "cat", "/proc/self/status"],
                   env=env)
        assert ran.returncode == 0, ran.stderr
        allowed = next(line.split(":", 1)[1].strip() for line in ran.stdout.splitlines()
                       if line.startswith("Cpus_allowed_list:"))
        status = json.loads(_run(["numa-pin", "status", "--json"], env=env).stdout)
        from numa_pin.base.cpuset import parse_list

        cpus = parse_list(allowed)
        assert len(cpus) == 1, f"one exclusive CPU expected, the container had {allowed}"
        assert not cpus & parse_list(status["reserved"])
        assert status["grants"] == [], "podman's poststop hook released the grant"
    finally:
        subprocess.run(["umount", "-R", str(store)], capture_output=True, timeout=60)
        shutil.rmtree(store, ignore_errors=True)
