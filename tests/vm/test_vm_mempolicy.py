"""``numa-pin run --memory-policy`` on a real 2-node kernel (issue 26, section 4).

Guest layout (DEFAULT_NUMA): node 0 = CPUs 0-1, node 1 = CPUs 2-3; CPU 0 is reserved, so three
exclusive CPUs span both nodes under ``best-effort`` and the grant's memory nodes are 0-1. The
oracle is the kernel: ``/proc/self/numa_maps`` of the command numa-pin exec'd, which names the
policy of each mapping and counts its pages per node (``N0=``, ``N1=``) once they are touched.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from .guest import GuestResult, run_in_guest_with_retry, unavailable_reason

pytestmark = pytest.mark.vm

GUEST_SCRIPT = r"""
set -u
"$NP_PY" "$NP_SHARED/driver.py" > "$NP_SHARED/driver.out" 2>&1
"""

#: the command numa-pin runs: touch 64 MiB of private anonymous memory, print the numa_maps line
#: with the most pages (that mapping)
TOUCH = (
    "import mmap\n"
    "m = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\n"
    "for i in range(0, 64 << 20, 4096):\n"
    "    m[i] = 1\n"
    "def pages(line):\n"
    "    return sum(int(f.split('=')[1]) for f in line.split() if f[:1] == 'N' and '=' in f)\n"
    "print(max(open('/proc/self/numa_maps'), key=pages), end='')\n"
)

GUEST_DRIVER = r'''
import json, os, subprocess, sys
from pathlib import Path

shared = Path(os.environ["NP_SHARED"])
numa_pin = str(Path(sys.executable).with_name("numa-pin"))
work = Path("/run/np-mempolicy")
work.mkdir(parents=True, exist_ok=True)
config = work / "config.yaml"
config.write_text(f"policy: best-effort\nstate_dir: {work / 'state'}\nsyslog: false\n")
report = {}
for mode in ("interleave", "bind", "preferred-many", "weighted-interleave"):
    res = subprocess.run([numa_pin, "run", "--config", str(config), "--cpus", "3", "--memory-policy", mode, "--",
                          sys.executable, str(shared / "touch.py")], capture_output=True, text=True, timeout=300)
    report[mode] = {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}
report["kernel"] = os.uname().release
(shared / "report.json").write_text(json.dumps(report, indent=2))
'''


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)

    def make_shared() -> Path:
        shared = tmp_path_factory.mktemp("mempolicy")
        (shared / "driver.py").write_text(textwrap.dedent(GUEST_DRIVER))
        (shared / "touch.py").write_text(TOUCH)
        return shared

    result: GuestResult = run_in_guest_with_retry(make_shared, GUEST_SCRIPT, timeout=600)
    assert "report.json" in result.files, (
        f"rc={result.rc}\n{result.files.get('driver.out', b'').decode()}\nconsole:{result.console[-2000:]}")
    print(f"guest boot + mempolicy checks + poweroff: {result.elapsed_s:.1f}s")
    return json.loads(result.text("report.json"))


def pages(line: str) -> dict[str, int]:
    return {k: int(v) for k, v in (f.split("=") for f in line.split() if f[:1] == "N" and "=" in f)}


def test_interleave_spreads_the_pages_over_both_granted_nodes(report):
    r = report["interleave"]
    assert r["rc"] == 0, r["stderr"]
    assert " interleave:0-1 " in r["stdout"], r["stdout"]
    per = pages(r["stdout"])
    assert set(per) == {"N0", "N1"} and abs(per["N0"] - per["N1"]) <= 0.1 * (per["N0"] + per["N1"]), per


@pytest.mark.parametrize("mode, word", [("bind", "bind:0-1"), ("preferred-many", "prefer (many):0-1")])
def test_bind_and_preferred_many_name_both_nodes(report, mode, word):
    r = report[mode]
    assert r["rc"] == 0, r["stderr"]
    assert word in r["stdout"], r["stdout"]


def test_weighted_interleave_is_set_or_refused_in_one_line(report):
    r = report["weighted-interleave"]
    if r["rc"] == 0:
        assert "weighted interleave:0-1" in r["stdout"], r["stdout"]
    else:
        assert "kernel 6.9" in r["stderr"] and r["stderr"].count("\n") == 1, r["stderr"]
