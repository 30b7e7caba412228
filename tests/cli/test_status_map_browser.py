"""The ``status --map-file`` page in a real browser: Debian's chromium opens it headless and takes a
screenshot; the PNG must exist, have the window's size, not be blank, and show every colour the
page's legend gives a holder drawn on the map (decoded here with zlib, no imaging library)."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import struct
import subprocess
import zlib

import pytest

from numa_pin.cli.main import main
from numa_pin.entry.hook import run as hook_run
from numa_pin.testing.node import FakeNode

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH, HEIGHT = 1200, 1600
TIMEOUT_S = 120  # a bound for a hung browser, never a speed check


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) pixels) of an 8-bit, non-interlaced RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    assert header is not None
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, header
    bpp = 3 if colour_type == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line) if bpp == 3 else bytes(v for k, v in enumerate(line) if k % 4 != 3))
        prev = line
    return width, height, rows


def colour_counts(rows: list[bytes]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        for i in range(0, len(row), 3):
            key = row[i:i + 3].hex()
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_page_renders_in_chromium_with_the_legend_colours(tmp_path, tmp_path_factory, monkeypatch, capsys):
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    fake = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    for i in range(2):
        fake.add_container(f"c{i}", 7000 + i)
    config = fake.write_config(policy="best-effort", kubelet_root=str(tmp_path / "no-kubelet"))
    for i, cpus in enumerate(("4", "2")):
        assert hook_run(["--config", str(config), "prestart"],
                        io.BytesIO(fake.oci_state(f"c{i}", 7000 + i, {"numa-pin.io/cpus": cpus}))) == 0
    page = tmp_path / "map.html"
    assert main(["status", "--config", str(config), "--map-file", str(page)]) == 0
    capsys.readouterr()
    html = page.read_text()
    legend = dict(re.findall(r'<div data-holder="([^"]+)"><span class="swatch" style="background:#([0-9a-f]{6})"', html))
    drawn = set(re.findall(r'data-cpu="\d+" data-holder="([^"]+)"', html))
    assert {"c0", "c1", "reserved", "shared"} <= drawn <= set(legend)
    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
           f"--screenshot={shot}", page.as_uri()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "HOME": str(tmp_path)})
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert shot.exists(), out.decode(errors="replace")[-2000:]
    width, height, rows = decode_png(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    counts = colour_counts(rows)
    assert len(counts) > 8, "a blank screenshot"
    background = max(counts, key=lambda k: counts[k])
    assert counts[background] < width * height * 0.95, "almost all one colour: nothing was drawn"
    for holder in sorted(drawn):
        # a CPU cell is ~110x34 px of its colour; the swatch adds 40x20
        assert counts.get(legend[holder], 0) >= 800, f"{holder}'s colour #{legend[holder]} is not on the screen"
    absent = [h for h in legend if h not in drawn and h not in ("isolated", "offline", "free")]
    assert absent == []
