"""``numa-pin status --map`` and ``--map-file``: every CPU of the machine appears exactly once,
marked by the holder the ledger records; the grid's rows are cores (thread siblings); devices
carry their holder. The oracles are read here directly: the kit's sysfs files (online, offline,
isolated, node cpulists, thread siblings), the ledger, and ``status --json`` for the reserved
CPUs. The text is parsed from its plain form; colour only on a terminal without NO_COLOR."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.cli.main import main
from numa_pin.cli.nodemap import FREE, human_bytes, picture, render_html, render_text
from numa_pin.devices.model import DeviceInfo
from numa_pin.entry.hook import run as hook_run
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.ledger.store import Ledger
from numa_pin.testing import machine, shapes
from numa_pin.testing.node import FakeNode

#: (shape, isolated CPUs written into its sysfs copy, (container, cpus) admitted)
CASES = [
    pytest.param("intel-2s-ht", "30-31", [("c0", "2"), ("c1", "4"), ("c2", "1")], id="intel-2s-ht-isolated"),
    pytest.param("offline-smt", "", [("c0", "3"), ("c1", "2")], id="offline-smt"),
    pytest.param("intel-2s-snc2", "", [("c0", "4"), ("c1", "6"), ("c2", "2")], id="snc2"),
]


def _node(tmp_path: Path, tmp_path_factory, monkeypatch, shape: str, isolated: str, n: int) -> FakeNode:
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    fake = FakeNode(tmp_path / "node", shape, machines=tmp_path_factory.getbasetemp() / "machines")
    copy = tmp_path / "sysfs"  # the kit's tree is shared: isolate on a copy
    shutil.copytree(fake.sysfs_root, copy, symlinks=True)
    (copy / "devices/system/cpu/isolated").write_text(isolated + "\n")
    fake.sysfs_root = copy
    for i in range(n):
        fake.add_container(f"c{i}", 7000 + i)
    fake.config = fake.write_config(policy="best-effort", kubelet_root=str(tmp_path / "no-kubelet"))
    return fake


def _sysfs_list(root: Path, rel: str) -> frozenset[int]:
    path = root / rel
    return parse_list(path.read_text().strip("\0\n ")) if path.exists() else frozenset()


def _expected_holders(fake: FakeNode, capsys) -> dict[int, str]:
    """Every CPU of the machine -> its holder, from sysfs, the ledger and `status --json`."""
    assert main(["status", "--config", str(fake.config), "--json"]) == 0
    reserved = parse_list(json.loads(capsys.readouterr().out)["reserved"])
    root = fake.sysfs_root
    online = _sysfs_list(root, "devices/system/cpu/online")
    offline = _sysfs_list(root, "devices/system/cpu/offline")
    isolated = _sysfs_list(root, "devices/system/cpu/isolated")
    assert online and not online & offline
    out = {cpu: "offline" for cpu in offline}
    for cpu in online:
        out[cpu] = "reserved" if cpu in reserved else "isolated" if cpu in isolated else "shared"
    for cid, grant in Ledger(str(fake.state_dir)).read().grants.items():
        for cpu in grant.cpus:
            out[cpu] = cid  # the ids here are their own shortest form (c0, c1, ...)
    return out


def _parse_text(text: str) -> tuple[dict[int, str], list[list[int]], list[str]]:
    """(cpu -> holder, the CPUs of each core row, every line) of the plain text map."""
    seen: dict[int, str] = {}
    rows: list[list[int]] = []
    core = False
    for line in text.splitlines():
        m = re.match(r"^  (core \S+|offline):(.*)$", line)
        more = re.match(r"^ {3,}(\d.*)$", line)  # a core's threads that did not fit on its line
        if not m and not more:
            core = False
            continue
        cells = [(int(c), h) for c, h in re.findall(r"(\d+) (\S+)", (m or more).group(m and 2 or 1))]
        for cpu, holder in cells:
            assert cpu not in seen, f"CPU {cpu} drawn twice"
            seen[cpu] = holder
        if m:
            core = m.group(1).startswith("core")
            if core:
                rows.append([c for c, _ in cells])
        elif core:
            rows[-1] += [c for c, _ in cells]
    return seen, rows, text.splitlines()


@pytest.mark.parametrize("shape, isolated, admissions", CASES)
def test_text_map_draws_every_cpu_once_with_its_holder(tmp_path, tmp_path_factory, monkeypatch, capsys,
                                                       shape, isolated, admissions):
    fake = _node(tmp_path, tmp_path_factory, monkeypatch, shape, isolated, len(admissions))
    for i, (cid, cpus) in enumerate(admissions):
        state = fake.oci_state(cid, 7000 + i, {"numa-pin.io/cpus": cpus})
        assert hook_run(["--config", str(fake.config), "prestart"], io.BytesIO(state)) == 0
    capsys.readouterr()
    expected = _expected_holders(fake, capsys)
    assert main(["status", "--config", str(fake.config), "--map"]) == 0
    text = capsys.readouterr().out
    assert "\x1b" not in text  # not a terminal: plain
    seen, rows, _ = _parse_text(text)
    assert seen == expected
    # a row is one core: its CPUs are each other's thread siblings, as sysfs says
    offline = {c for c, h in expected.items() if h == "offline"}
    for row in rows:
        for cpu in row:
            siblings = _sysfs_list(fake.sysfs_root, f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
            assert siblings - offline == set(row)
    # each node's section lists exactly its cpulist
    sections = re.split(r"^node (\d+):", text, flags=re.M)[1:]
    for node_id, body in zip(sections[::2], sections[1::2], strict=True):
        cpulist = _sysfs_list(fake.sysfs_root, f"devices/system/node/node{node_id}/cpulist")
        drawn = {c for line in body.splitlines() if line.startswith("  core ")
                 for c, _ in re.findall(r"(\d+) (\S+)", line.split(":", 1)[1])}
        assert {int(c) for c in drawn} == cpulist - _sysfs_list(fake.sysfs_root, "devices/system/cpu/offline")


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cpus: list[tuple[int, str]] = []
        self.devices: list[tuple[str, str]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "td" and "data-cpu" in a:
            self.cpus.append((int(a["data-cpu"]), a["data-holder"]))
        if tag == "tr" and "data-device" in a:
            self.devices.append((a["data-device"], a["data-holder"]))
        for key in ("src", "href"):
            assert key not in a, f"an external asset: <{tag} {key}={a[key]!r}>"


def test_html_page_draws_every_cpu_once_and_is_standalone(tmp_path, tmp_path_factory, monkeypatch, capsys):
    fake = _node(tmp_path, tmp_path_factory, monkeypatch, "intel-2s-ht", "31", 2)
    for i, cpus in enumerate(("2", "3")):
        assert hook_run(["--config", str(fake.config), "prestart"],
                        io.BytesIO(fake.oci_state(f"c{i}", 7000 + i, {"numa-pin.io/cpus": cpus}))) == 0
    capsys.readouterr()
    expected = _expected_holders(fake, capsys)
    page = tmp_path / "out" / "map.html"
    page.parent.mkdir()
    assert main(["status", "--config", str(fake.config), "--map-file", str(page)]) == 0
    assert capsys.readouterr().out == ""  # the file only, unless --map too
    assert page.stat().st_mode & 0o777 == 0o644
    cells = _Cells()
    cells.feed(page.read_text())
    assert sorted(c for c, _ in cells.cpus) == sorted(expected)  # each once
    assert dict(cells.cpus) == expected
    assert "script" not in cells.tags and "link" not in cells.tags


def test_devices_carry_their_holder_and_ids_are_escaped():
    """The pure picture on a hand-made ledger: every device once, with the grant that lists it."""
    spec = shapes.SHAPES["intel-2s-ht"]()
    topology = machine.expected_topology(spec)
    hostile = "<b>evil\x1b[31m"
    state = LedgerState(grants={
        "g1": Grant("g1", "p", "ns/p/a", "exclusive", cpus=frozenset({2, 3}),
                    devices={"example.com/nic": ("0000:01:00.0",)}),
        hostile: Grant(hostile, "p2", "b", "exclusive", cpus=frozenset({20}),
                       devices={"example.com/nic": ("0000:81:00.0",)}),
    })
    devices = {"example.com/nic": (DeviceInfo("0000:01:00.0", (0,)), DeviceInfo("0000:02:00.0", (0,)),
                                   DeviceInfo("0000:81:00.0", (1,)), DeviceInfo("0000:99:00.0", ()))}
    pic = picture(topology, state, short={"g1": "g1", hostile: hostile}, devices=devices)
    rows = [d for n in pic["nodes"] for d in n["devices"]] + pic["elsewhere"]["devices"]
    assert sorted(d["id"] for d in rows) == sorted(d.id for d in devices["example.com/nic"])
    holders = {d["id"]: d["holder"] for d in rows}
    assert holders["0000:01:00.0"] == "g1" and holders["0000:02:00.0"] == FREE == holders["0000:99:00.0"]
    assert holders["0000:81:00.0"] != FREE
    text, html = render_text(pic), render_html(pic)
    assert "\x1b" not in text and "<b>evil" not in html and "&lt;b&gt;evil" in html
    assert "0000:99:00.0" in text.split("no NUMA node:", 1)[1]


def test_colour_only_on_a_terminal_without_no_color(tmp_path, tmp_path_factory, monkeypatch, capsys):
    fake = _node(tmp_path, tmp_path_factory, monkeypatch, "intel-2s-ht", "", 1)
    assert hook_run(["--config", str(fake.config), "prestart"],
                    io.BytesIO(fake.oci_state("c0", 7000, {"numa-pin.io/cpus": "2"}))) == 0

    def on_a_terminal(**env: str) -> str:
        leader, follower = pty.openpty()
        environ = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | env
        proc = subprocess.Popen([sys.executable, "-m", "numa_pin.cli.main", "status", "--config", str(fake.config),
                                 "--map"], stdout=follower, stderr=subprocess.PIPE, env=environ)
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        os.close(leader)
        assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
        return b"".join(chunks).decode()

    coloured = on_a_terminal()
    assert "\x1b[" in coloured
    plain = on_a_terminal(NO_COLOR="1")
    assert "\x1b" not in plain
    assert _parse_text(re.sub(r"\x1b\[[0-9;]*m", "", coloured).replace("\r", ""))[0] == \
        _parse_text(plain.replace("\r", ""))[0]


@pytest.mark.parametrize("n, text", [
    pytest.param(0, "0", id="zero"), pytest.param(1023, "1023", id="bytes"), pytest.param(1 << 20, "1Mi", id="mi"),
    pytest.param(20670668 << 10, "19.7Gi", id="gi-rounded"), pytest.param(3 << 40, "3Ti", id="ti"),
])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def _wide_picture(shape: str) -> dict:
    """A node drawn at its widest: three memory resources per node, holder labels of the longest
    drawn length, a device of a long resource name, CPUs offline on no node."""
    topology = machine.expected_topology(shapes.SHAPES[shape]())
    cpus = sorted(topology.cpu_ids)
    long_id = "a-container-id-much-longer-than-any-label-drawn"
    state = LedgerState(grants={
        long_id: Grant(long_id, "p", "ns/pod/a", "exclusive", cpus=frozenset(cpus[2:6]),
                       devices={"example.com/a-device-resource-of-a-rather-long-name": ("0000:01:00.0",)}),
        "b" * 30: Grant("b" * 30, "p2", "ns/pod/b", "exclusive", cpus=frozenset(cpus[-3:])),
    })
    zones = {n: [{"name": name, "capacity": str(9 << 40), "allocatable": str(1023 << 30), "available": str(7 << 28)}
                 for name in ("memory", "hugepages-2Mi", "hugepages-1Gi")] for n in topology.node_ids}
    devices = {"example.com/a-device-resource-of-a-rather-long-name": (
        DeviceInfo("0000:01:00.0", (topology.node_ids[0],)), DeviceInfo("0000:02:00.0", ()))}
    return picture(topology, state, short={long_id: long_id, "b" * 30: "b" * 30}, devices=devices,
                   memory_zones=zones, offline={4096: None})


@pytest.mark.parametrize("shape", ["intel-2s-ht", "power-no-package-id", "amd-nps4-8node"])
@pytest.mark.parametrize("colour", [False, True], ids=["plain", "colour"])
def test_text_map_fits_80_columns(shape: str, colour: bool) -> None:
    """Every line of the terminal map is at most 80 columns wide (the node line with its memory
    was 108, SMT4 rows with long labels wider still), and nothing is lost by the wrapping."""
    pic = _wide_picture(shape)
    text = render_text(pic, colour=colour)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert colour == ("\x1b[" in text)
    wide = [line for line in plain.splitlines() if len(line) > 80]
    assert not wide, wide
    seen, rows, _ = _parse_text(plain)
    drawn = {c: h for n in pic["nodes"] for r in n["cores"] for c, h in r["cpus"]} | {4096: "offline"}
    assert seen == drawn
    assert rows == [[c for c, _ in r["cpus"]] for n in pic["nodes"] for r in n["cores"]]
    used = re.escape(human_bytes((1023 << 30) - (7 << 28)))
    for name in ("memory", "hugepages-2Mi", "hugepages-1Gi"):
        assert len(re.findall(rf"^  {name}: {used} of 1023Gi used$", plain, re.M)) == len(pic["nodes"])
    flat = " ".join(plain.split())
    assert "device example.com/a-device-resource-of-a-rather-long-name 0000:01:00.0: a-container-id-much-lon" in flat
