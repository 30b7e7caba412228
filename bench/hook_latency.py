#!/usr/bin/env python3
"""How long one ``numa-pin-hook`` admission takes, compared with a bare interpreter start.

Part 1 runs the installed hook as the runtime would (a fresh process, OCI state on stdin)
against a fake 2-socket machine (``intel-2s-ht`` from the machine kit) with a fake cgroup v1
tree, so it measures numa-pin's own cost: interpreter start, imports, config (cached),
topology (cached), ledger transaction, decision and cpuset writes. Each admission is followed
by a poststop release (timed separately) so every run sees the same machine.

Part 2 (root, runc installed) times ``runc run`` of a busybox ``true`` container with and
without the hook on this machine, to show what a container start pays in practice. runc's wall
time moves in steps (about 32, 64, 114 and 164 ms on the development VM: a prestart hook of
3 ms already moves a run from the first step to the second), so the bench also times hooks that
only start ``python3 -c pass``: the floor for any hook written in Python.

Part 3 repeats part 1 with a warm agent (``numa-pin serve`` on a temporary socket): the hook
then only starts the interpreter and hands the admission over (docs/agent.md).

Part 4 is the default, as a node set up from the README runs it: no agent at the start, and
the first hook that finds none starts one on demand. Every container counts, the first
included (it runs in-process and starts the agent).

Every figure is also given as a ratio to the bare interpreter start measured in the same loop
(runc: to ``runc run`` without the hook, in the same loop).

``--baseline-src DIR`` runs only part 1, for this checkout and for another one's ``src/`` (for
example ``git worktree add /tmp/base <commit>`` and ``--baseline-src /tmp/base/src``) in turns
within one loop, and prints the ratio of the two: a before/after that a busy machine skews less
than two separate runs would.

Usage: python bench/hook_latency.py [--runs N] [--skip-runc] [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
from numa_pin.testing.node import FakeNode  # noqa: E402  (after the src path is known)

VENV_BIN = Path(sys.executable).parent
HOOK = shutil.which("numa-pin-hook", path=str(VENV_BIN)) or shutil.which("numa-pin-hook")


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def timed(cmd: list[str], stdin: bytes | None = None, env: dict[str, str] | None = None) -> tuple[float, int, bytes]:
    return timed_cpu(cmd, stdin, env)[:3]


def timed_cpu(cmd: list[str], stdin: bytes | None = None,
              env: dict[str, str] | None = None) -> tuple[float, int, bytes, float]:
    """Wall time, exit status, stderr and the CPU time (user + system) the command used. The CPU
    time is what a busy machine skews least: other work delays the hook, it does not add to it."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=120)
    wall = time.perf_counter() - t0
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)
    return wall, proc.returncode, proc.stderr, cpu


def fake_node(root: Path) -> tuple[FakeNode, Path, dict[str, str]]:
    """A fake 2-socket machine, proc tree and cgroup v1 tree; returns (node, config path, env)."""
    node = FakeNode(root, "intel-2s-ht", parent="bench")
    config = node.write_config(settled=False, policy="restricted")
    # NUMA_PIN_NO_AGENT: part 1 measures the in-process hook even where an agent is running
    env = dict(os.environ, NUMA_PIN_CACHE_DIR=str(node.cache_dir), NUMA_PIN_NO_AGENT="1")
    return node, config, env


def add_container(node: FakeNode, index: int) -> bytes:
    """A container with 2 exclusive CPUs requested; returns the OCI state for the hook."""
    pid = node.add_container(f"c{index}", 100000 + index)
    return node.oci_state(f"c{index}", pid, {"numa-pin.io/cpus": "2"})


def measure(node: FakeNode, config: Path, env: dict[str, str], runs: int, warmups: int = 1) -> dict[str, float]:
    """Admit then release ``runs`` containers, one hook process each; bare starts interleaved."""
    return measure_trees([("", node, config, env, str(HOOK))], runs, warmups)[""]


def measure_trees(trees: list[tuple[str, FakeNode, Path, dict[str, str], str]], runs: int,
                  warmups: int = 1) -> dict[str, dict[str, float]]:
    """:func:`measure` for several source trees at once, each on its own fake node: every run
    admits and releases one container per tree, in turns (the order rotates each run), with one
    bare interpreter start per run, so a busy machine slows every tree alike. Besides wall times
    (``admit_p50``, ...) it gives each hook process's CPU time (``admit_cpu_p50``, ...)."""
    bare: list[float] = []
    kinds = ("admit", "release", "admit_cpu", "release_cpu")
    samples: dict[str, dict[str, list[float]]] = {label: {k: [] for k in kinds} for label, *_ in trees}
    first: dict[str, float] = {}
    # the loader caches only a config unchanged for 2 s; measure that steady state
    newest = max(config.stat().st_ctime for _, _, config, _, _ in trees)
    time.sleep(max(0.0, 2.1 - (time.time() - newest)))
    for label, node, config, env, hook in trees:
        warm = add_container(node, 0)
        for stage in ("prestart", "poststop") * warmups:  # fills the config and topology caches
            dt, rc, err = timed([hook, "--config", str(config), stage], warm, env)
            if rc:
                raise SystemExit(f"hook {label} failed during warm-up: {err.decode().strip()}")
    for i in range(1, runs + 1):
        bare.append(timed([sys.executable, "-c", "pass"])[0])
        turn = i % len(trees)
        for label, node, config, env, hook in trees[turn:] + trees[:turn]:
            state = add_container(node, i)
            for stage, kind in (("prestart", "admit"), ("poststop", "release")):
                dt, rc, err, cpu = timed_cpu([hook, "--config", str(config), stage], state, env)
                if rc:
                    raise SystemExit(f"hook {label} {stage} failed: {err.decode().strip()}")
                samples[label][kind].append(dt)
                samples[label][kind + "_cpu"].append(cpu)
                first.setdefault(label, dt)
    out: dict[str, dict[str, float]] = {}
    for label, got in samples.items():
        out[label] = {"first": first.get(label, 0.0), "bare_p50": pct(bare, 0.5), "bare_p95": pct(bare, 0.95)}
        for kind, values in got.items():
            out[label].update({f"{kind}_p50": pct(values, 0.5), f"{kind}_p95": pct(values, 0.95)})
    return out


def bench_hook(runs: int) -> dict[str, float]:
    """Part 1: the in-process hook."""
    with tempfile.TemporaryDirectory(prefix="numa-pin-bench-") as tmp:
        node, config, env = fake_node(Path(tmp))
        return measure(node, config, env, runs)


def check_loads(src: Path, env: dict[str, str]) -> None:
    """Fail unless the hook's interpreter, started as the launcher starts it, imports numa_pin from ``src``."""
    interpreter = Path(HOOK).read_text().splitlines()[0][2:].split()[0]
    probe = subprocess.run([interpreter, "-S", "-c", "import numa_pin; print(numa_pin.__file__)"], env=env,
                           capture_output=True, text=True, timeout=60)
    if not probe.stdout.startswith(str(src)):
        raise SystemExit(f"the hook would not load numa_pin from {src}: {probe.stdout or probe.stderr}")


def tree_hook(tmp: Path, src: Path) -> str:
    """The installed launcher, importing the hook's ``main`` from where ``src`` has it (it moved
    from ``numa_pin.hook.main`` to ``numa_pin.entry.hook``)."""
    module = "numa_pin.entry.hook" if (src / "numa_pin" / "entry" / "hook.py").is_file() else "numa_pin.hook.main"
    lines = [f"from {module} import main" if line.endswith(" import main") else line
             for line in Path(str(HOOK)).read_text().splitlines()]
    path = tmp / "numa-pin-hook"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return str(path)


def bench_baseline(runs: int, baseline_src: Path) -> dict[str, dict[str, float]]:
    """Part 1 for this checkout and for the numa_pin package under ``baseline_src`` (another
    checkout's ``src``, e.g. a ``git worktree add`` of an older commit), in one loop: the same
    hook launcher and interpreter, the baseline put first on the path by ``PYTHONPATH``."""
    # both trees byte-compiled, as an installed package is (PYTHONDONTWRITEBYTECODE would otherwise
    # leave one of them compiling every module at every start)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "src"), str(baseline_src)], check=True,
                   stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="numa-pin-bench-base-") as tmp:
        trees = []
        for label, src in (("this", REPO / "src"), ("baseline", baseline_src)):
            (Path(tmp) / label).mkdir()
            node, config, env = fake_node(Path(tmp) / label)
            env["PYTHONPATH"] = str(src)  # both the same way: first on the path, the same launcher
            check_loads(src, env)
            trees.append((label, node, config, env, tree_hook(Path(tmp) / label, src)))
        return measure_trees(trees, runs)


def bench_agent(runs: int) -> dict[str, float]:
    """Part 3: the same hook admissions, handed to a warm ``numa-pin serve`` on a temporary socket."""
    serve_cmd = shutil.which("numa-pin", path=str(VENV_BIN)) or shutil.which("numa-pin")
    with tempfile.TemporaryDirectory(prefix="numa-pin-bench-agent-") as tmp:
        root = Path(tmp)
        node, config, env = fake_node(root)
        sock, log = root / "agent" / "agent.sock", root / "agent.log"
        env = dict(env, NUMA_PIN_AGENT_SOCKET=str(sock))
        env.pop("NUMA_PIN_NO_AGENT", None)
        server = subprocess.Popen([serve_cmd, "serve", "--socket", str(sock), "--log", str(log)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while not sock.exists():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"numa-pin serve did not start: {server.stderr.read().decode().strip()}")
                time.sleep(0.05)
            result = measure(node, config, env, runs, warmups=2)
        finally:
            server.terminate()
            server.wait(timeout=60)
        served = sum(1 for line in log.read_text().splitlines() if json.loads(line).get("outcome") == "served")
    return {**result, "served": served, "expected": 2 * runs + 4}


def agents_on(sock: Path) -> list[int]:
    """pids of the ``numa-pin serve`` servers started for ``sock`` (not the children they fork)."""
    import psutil

    procs = [p for p in psutil.process_iter(["cmdline", "ppid"])
             if "serve" in (p.info["cmdline"] or []) and str(sock) in (p.info["cmdline"] or [])]
    pids = {p.pid for p in procs}
    return [p.pid for p in procs if p.info["ppid"] not in pids]


def stop_agents(sock: Path) -> None:
    for pid in agents_on(sock):
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass


def bench_default(runs: int) -> dict[str, float]:
    """Part 4: the hook as installed: no agent running, the first hook starts one on demand."""
    with tempfile.TemporaryDirectory(prefix="numa-pin-bench-default-") as tmp:
        root = Path(tmp)
        node, config, env = fake_node(root)
        sock = root / "run" / "agent.sock"
        env = {k: v for k, v in env.items() if k not in ("NUMA_PIN_NO_AGENT", "NUMA_PIN_AGENT_AUTOSTART")}
        env["NUMA_PIN_AGENT_SOCKET"] = str(sock)
        try:
            result = measure(node, config, env, runs, warmups=0)
            started = len(agents_on(sock))
        finally:
            stop_agents(sock)
    return {**result, "agents": started}


def bench_runc(runs: int) -> dict[str, float] | None:
    runc = shutil.which("runc")
    if os.geteuid() != 0 or runc is None or not Path("/bin/busybox").exists():
        return None
    sys.path.insert(0, str(REPO / "tests" / "e2e"))
    import harness

    serve_cmd = shutil.which("numa-pin", path=str(VENV_BIN)) or shutil.which("numa-pin")
    with tempfile.TemporaryDirectory(prefix="numa-pin-bench-runc-") as tmp:
        root = Path(tmp)
        config = root / "config.yaml"
        config.write_text(f"policy: best-effort\nstate_dir: {root / 'state'}\nsyslog: false\n")
        sock = root / "agent" / "agent.sock"
        auto_sock = root / "auto" / "agent.sock"  # nothing there: the first hook starts an agent
        base_env = [f"NUMA_PIN_CACHE_DIR={root / 'cache'}", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
        if os.environ.get("PYTHONPATH"):  # measuring another checkout's code with this venv
            base_env.append(f"PYTHONPATH={os.environ['PYTHONPATH']}")

        def hooks(extra: list[str]) -> dict:
            return {stage: [harness.hook_entry(HOOK, ["numa-pin-hook", "--config", str(config), stage],
                                               env=base_env + extra)] for stage in ("prestart", "poststop")}

        floor = {stage: [harness.hook_entry(sys.executable, [sys.executable, "-c", "pass"])]
                 for stage in ("prestart", "poststop")}
        bundles = {
            "plain": harness.make_bundle(root / "plain", args=["true"]),
            "floor": harness.make_bundle(root / "floor", args=["true"], hooks=floor),
            "hooked": harness.make_bundle(root / "hooked", args=["true"], hooks=hooks(["NUMA_PIN_NO_AGENT=1"]),
                                          annotations={"numa-pin.io/cpus": "1"}),
            "agent": harness.make_bundle(root / "agent-b", args=["true"],
                                         hooks=hooks([f"NUMA_PIN_AGENT_SOCKET={sock}", "NUMA_PIN_AGENT_AUTOSTART=0"]),
                                         annotations={"numa-pin.io/cpus": "1"}),
            "default": harness.make_bundle(root / "default-b", args=["true"],
                                           hooks=hooks([f"NUMA_PIN_AGENT_SOCKET={auto_sock}"]),
                                           annotations={"numa-pin.io/cpus": "1"}),
        }
        server = subprocess.Popen([serve_cmd, "serve", "--socket", str(sock)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        out: dict[str, list[float]] = {name: [] for name in bundles}
        try:
            deadline = time.monotonic() + 30
            while not sock.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(max(0.0, 2.1 - (time.time() - config.stat().st_ctime)))  # config becomes cacheable
            for i in range(runs + 1):
                for name, bundle in bundles.items():
                    t0 = time.perf_counter()
                    res = harness.run_runc(bundle, f"bench-{name}-{os.getpid()}-{i}", root=root / "runc")
                    dt = time.perf_counter() - t0
                    if res.returncode != 0:
                        raise SystemExit(f"runc {name} failed: {res.stderr.strip()}")
                    if i or name == "default":  # first round is warm-up, but "default" counts from its first container
                        out[name].append(dt)
        finally:
            server.terminate()
            server.wait(timeout=60)
            stop_agents(auto_sock)
    return {f"{name}_{q}": pct(v, 0.5 if q == "p50" else 0.95) for name, v in out.items() for q in ("p50", "p95")}


def print_baseline(runs: int, baseline_src: Path) -> int:
    if not (baseline_src / "numa_pin" / "__init__.py").is_file():
        print(f"{baseline_src} holds no numa_pin package (give a checkout's src/)", file=sys.stderr)
        return 1
    r = bench_baseline(runs, baseline_src)
    this, base = r["this"], r["baseline"]
    print(f"hook in-process (NUMA_PIN_NO_AGENT=1), fake 2-socket machine, this checkout ({REPO / 'src'}) and "
          f"baseline ({baseline_src}) in turns ({runs} runs each, {os.cpu_count()} CPUs here)")
    print(f"  python3 -c pass            p50 {1000 * this['bare_p50']:7.1f} ms   p95 {1000 * this['bare_p95']:7.1f} ms")
    for stage, key in (("prestart", "admit"), ("poststop", "release")):
        for label, got in (("baseline", base), ("this", this)):
            print(f"  {label:8s} hook {stage:9s}  p50 {1000 * got[key + '_p50']:7.1f} ms"
                  f"   p95 {1000 * got[key + '_p95']:7.1f} ms"
                  f"   ratio to bare p50: {got[key + '_p50'] / got['bare_p50']:.2f}x")
        print(f"  this / baseline {stage:9s} p50 {this[key + '_p50'] / base[key + '_p50']:.3f}x"
              f"   p95 {this[key + '_p95'] / base[key + '_p95']:.3f}x")
        print(f"  CPU time (user + system), p50: baseline {1000 * base[key + '_cpu_p50']:.1f} ms, this "
              f"{1000 * this[key + '_cpu_p50']:.1f} ms, this / baseline {this[key + '_cpu_p50'] / base[key + '_cpu_p50']:.3f}x")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--skip-runc", action="store_true")
    ap.add_argument("--baseline-src", type=Path, metavar="DIR",
                    help="only part 1, for this checkout and the numa_pin package under DIR (another checkout's "
                         "src/), in one loop, with the ratios of the two")
    args = ap.parse_args()
    if HOOK is None:
        print("numa-pin-hook is not installed (run make venv)", file=sys.stderr)
        return 1
    if args.baseline_src is not None:
        return print_baseline(args.runs, args.baseline_src.resolve())
    r = bench_hook(args.runs)
    ms = {k: 1000 * v for k, v in r.items()}
    print(f"hook in-process, no agent at all (NUMA_PIN_NO_AGENT=1), fake 2-socket machine "
          f"({args.runs} runs, {os.cpu_count()} CPUs here)")
    print(f"  python3 -c pass     p50 {ms['bare_p50']:7.1f} ms   p95 {ms['bare_p95']:7.1f} ms")
    print(f"  hook prestart       p50 {ms['admit_p50']:7.1f} ms   p95 {ms['admit_p95']:7.1f} ms"
          f"   ratio to bare p50: {r['admit_p50'] / r['bare_p50']:.2f}x")
    print(f"  hook poststop       p50 {ms['release_p50']:7.1f} ms   p95 {ms['release_p95']:7.1f} ms"
          f"   ratio to bare p50: {r['release_p50'] / r['bare_p50']:.2f}x")
    ra = bench_agent(args.runs)
    ma = {k: 1000 * v for k, v in ra.items() if k.endswith(("_p50", "_p95"))}
    print(f"hook through the warm agent (numa-pin serve), same fake machine "
          f"({ra['served']} of {ra['expected']} hooks served by the agent)")
    print(f"  python3 -c pass     p50 {ma['bare_p50']:7.1f} ms   p95 {ma['bare_p95']:7.1f} ms")
    print(f"  hook prestart       p50 {ma['admit_p50']:7.1f} ms   p95 {ma['admit_p95']:7.1f} ms"
          f"   ratio to bare p50: {ra['admit_p50'] / ra['bare_p50']:.2f}x")
    print(f"  hook poststop       p50 {ma['release_p50']:7.1f} ms   p95 {ma['release_p95']:7.1f} ms"
          f"   ratio to bare p50: {ra['release_p50'] / ra['bare_p50']:.2f}x")
    rd = bench_default(args.runs)
    md = {k: 1000 * v for k, v in rd.items() if k.endswith(("_p50", "_p95")) or k == "first"}
    print(f"hook as installed (no agent at the start; the first hook starts one on demand; "
          f"{rd['agents']} agent running after the runs), every container from the first")
    print(f"  python3 -c pass     p50 {md['bare_p50']:7.1f} ms   p95 {md['bare_p95']:7.1f} ms")
    print(f"  hook prestart       p50 {md['admit_p50']:7.1f} ms   p95 {md['admit_p95']:7.1f} ms"
          f"   ratio to bare p50: {rd['admit_p50'] / rd['bare_p50']:.2f}x   (first container {md['first']:.1f} ms)")
    print(f"  hook poststop       p50 {md['release_p50']:7.1f} ms   p95 {md['release_p95']:7.1f} ms"
          f"   ratio to bare p50: {rd['release_p50'] / rd['bare_p50']:.2f}x")
    if not args.skip_runc:
        rr = bench_runc(max(5, args.runs // 3))
        if rr is None:
            print("runc comparison skipped (needs root, runc and busybox-static)")
        else:
            print("runc run of busybox true, this machine (prestart + poststop hooks); runc's own wall time moves"
                  " in steps (about 32, 64, 114, 164 ms here), so 'python3 -c pass hooks' is the floor any"
                  " Python hook can reach")
            plain = rr["plain_p50"]
            for name, label in (("plain", "without hook"), ("floor", "python3 -c pass hooks"),
                                ("hooked", "hook in-process"),
                                ("agent", "hook + running agent"), ("default", "hook as installed")):
                print(f"  {label:20s} p50 {1000 * rr[name + '_p50']:7.1f} ms   p95 {1000 * rr[name + '_p95']:7.1f} ms"
                      f"   ratio to without: {rr[name + '_p50'] / plain:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
