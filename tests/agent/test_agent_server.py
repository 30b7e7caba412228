"""The warm agent (``numa-pin serve``) and the hook's fallback to running in-process.

The node is the kit's ``intel-2s-ht`` machine with a fake proc tree and a fake cgroup v1 tree
under ``tmp_path`` (the same set-up as tests/hook/test_hook_fuzz.py). The hook is the installed
``numa-pin-hook`` script, run as a runtime runs it: a fresh process, OCI state on stdin. The
server is ``numa-pin serve --socket <tmp> --log <tmp>``; its log (one JSON line per request)
is how a test knows that the agent, not the in-process fallback, ran a hook.

The oracle for "same result" is the same hook run in-process (``NUMA_PIN_NO_AGENT=1``) on an
identical second node: exit code, stderr and the ledger grant must be equal.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from numa_pin.agent import client, preload, protocol, request, server, spare
from numa_pin.base.cpuset import parse_list
from numa_pin.base.record import replace
from numa_pin.errors import NumaPinError
from numa_pin.hook.oci import MAX_DOCUMENT_BYTES
from numa_pin.ledger.model import Grant
from numa_pin.ledger.store import Ledger
from numa_pin.reporting.report import reason_path
from numa_pin.resources.node.warm import WarmState
from numa_pin.testing.node import FakeNode
from waitfor import wait_for

BIN = Path(sys.executable).parent
HOOK = shutil.which("numa-pin-hook", path=str(BIN))
NUMA_PIN = shutil.which("numa-pin", path=str(BIN))
pytestmark = pytest.mark.skipif(HOOK is None or NUMA_PIN is None, reason="numa-pin scripts not installed")
WAIT_S = 60.0  # generous bound for a server to start or children to be reaped (never a speed check)


# ---- a fake node -----------------------------------------------------------------------------


class Node(FakeNode):
    """One fake node: machine, proc, cgroup v1 cpuset tree, config, state and cache dirs."""

    def __init__(self, root: Path, machines: Path, containers: int = 8) -> None:
        super().__init__(root, "intel-2s-ht", machines=machines)
        self.sysfs, self.proc, self.cg = self.sysfs_root, self.proc_root, self.cgroup_root
        self.state, self.cache = self.state_dir, self.cache_dir
        for i in range(containers):
            self.add_container(f"c{i}", self.pid(i))
        self.config = self.write_config(policy="single-numa-node")

    @staticmethod
    def pid(i: int) -> int:
        return 5000 + i

    def state_json(self, i: int, annotations: dict[str, str] | None = None) -> bytes:
        return self.oci_state(f"c{i}", self.pid(i), annotations)

    def grants(self) -> dict[str, dict]:
        """The ledger's grants, as dicts without the creation time."""
        out = {}
        for cid, grant in Ledger(self.state).read().grants.items():
            d = grant.to_dict()
            d.pop("created")
            out[cid] = d
        return out

    def granted(self, cid: str) -> frozenset[int]:
        """The exclusive CPUs the ledger gives ``cid``."""
        return Ledger(self.state).read().grants[cid].cpus

    def node_cpus(self) -> list[frozenset[int]]:
        """CPUs of each NUMA node, read from the fake sysfs."""
        nodes = sorted(self.sysfs.glob("devices/system/node/node[0-9]*"), key=lambda d: int(d.name[4:]))
        return [parse_list((d / "cpulist").read_text().strip()) for d in nodes]

    def cpus_of(self, i: int) -> frozenset[int]:
        return parse_list(self.cpuset(f"c{i}")[0])


def hook_env(node: Node, sock: Path | None, **extra: str) -> dict[str, str]:
    """The hook's environment: no agent at all when ``sock`` is None."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMA_PIN_")}
    env["NUMA_PIN_CACHE_DIR"] = str(node.cache)
    env["NUMA_PIN_AGENT_AUTOSTART"] = "0"  # the on-demand tests below turn it on
    if sock is None:
        env["NUMA_PIN_NO_AGENT"] = "1"
        env["NUMA_PIN_AGENT_SOCKET"] = str(node.root / "no-such-agent.sock")
    else:
        env["NUMA_PIN_AGENT_SOCKET"] = str(sock)
    env.update(extra)
    return env


def run_hook(node: Node, stdin: bytes, stage: str = "prestart", sock: Path | None = None, *,
             argv: list[str] | None = None, cwd: Path | None = None, **extra: str) -> tuple[int, str]:
    args = argv if argv is not None else ["--config", str(node.config), stage]
    proc = subprocess.run([HOOK, *args], input=stdin, capture_output=True, env=hook_env(node, sock, **extra),
                          cwd=cwd, timeout=120)
    return proc.returncode, proc.stderr.decode()


# ---- a real server ---------------------------------------------------------------------------


class Served:
    """A ``numa-pin serve`` subprocess on a socket under ``root``."""

    def __init__(self, root: Path, version: str | None = None, max_children: int | None = None,
                 rehearse_every_s: float | None = None, *, read_timeout_s: float | None = None,
                 idle_exit_s: float | None = None) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.sock = root / "run" / "agent.sock"
        self.log = root / "agent.log"
        self.err = root / "agent.err"
        args = ["serve", "--socket", str(self.sock), "--log", str(self.log)]
        if idle_exit_s is not None:
            args += ["--idle-exit", f"{idle_exit_s:g}"]
        patches = {  # module attributes set before serve starts
            "numa_pin.__version__": version,  # an agent of another version, as after an upgrade without a restart
            "server.MAX_CHILDREN": max_children,  # a server at its limit of admissions in flight
            "spare.REHEARSE_EVERY_S": rehearse_every_s,  # an idle spare that rehearses again this often
            "request.READ_TIMEOUT_S": read_timeout_s,
        }
        lines = [f"{name} = {value!r}" for name, value in patches.items() if value is not None]
        if lines:  # the version before the imports: the agent's modules copy it when imported
            code = "\n".join(["import sys, numa_pin", *[line for line in lines if line.startswith("numa_pin.")],
                              "from numa_pin.agent import request, server, spare",
                              *[line for line in lines if not line.startswith("numa_pin.")],
                              "from numa_pin.cli.main import main; sys.exit(main(sys.argv[1:]))"])
            cmd = [sys.executable, "-c", code, *args]
        else:
            cmd = [NUMA_PIN, *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMA_PIN_")}
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            wait_for(self._listening, lambda: f"numa-pin serve to listen: {self.err.read_text()}")
        except BaseException:
            self.proc.kill()
            raise

    def _listening(self) -> bool:
        assert self.proc.poll() is None, f"numa-pin serve exited: {self.err.read_text()}"
        return "listening on" in self.err.read_text()

    def records(self, outcome: str | None = None) -> list[dict]:
        if not self.log.exists():
            return []
        recs = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [r for r in recs if outcome is None or r.get("outcome") == outcome]

    def children(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children()

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        return self.proc.wait(timeout=WAIT_S)


@pytest.fixture
def node(tmp_path, tmp_path_factory):
    return Node(tmp_path / "node", tmp_path_factory.getbasetemp() / "machines")


@pytest.fixture
def twin(tmp_path, tmp_path_factory):
    """A second node identical to ``node``: the in-process oracle runs there."""
    return Node(tmp_path / "twin", tmp_path_factory.getbasetemp() / "machines")


@pytest.fixture
def served(tmp_path):
    agent = Served(tmp_path / "agent")
    yield agent
    agent.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def shared_agent(tmp_path_factory):
    """One server for the tests that do not stop it (every request names its own config)."""
    agent = Served(tmp_path_factory.mktemp("shared-agent"))
    yield agent
    assert agent.stop() == 0
    assert not agent.sock.exists()


# ---- same answers as in-process --------------------------------------------------------------


SAME_CASES = [
    ({"numa-pin.io/cpus": "2"}, "flag", 0),
    ({"numa-pin.io/cpus": "4", "numa-pin.io/memory": "1Gi"}, "flag", 0),
    ({}, "flag", 0),
    ({"numa-pin.io/cpus": "2"}, "env", 0),
    ({"numa-pin.io/cpus": "2"}, "relative", 0),
    ({"numa-pin.io/cpus": "20"}, "flag", 1),
    ({"numa-pin.io/cpus": "lots"}, "flag", 1),
]
SAME_IDS = ["cpus-2", "cpus-and-memory", "shared", "config-from-env", "relative-config-path", "no-fit", "malformed"]


@pytest.mark.parametrize("annotations, how, want_rc", SAME_CASES, ids=SAME_IDS)
def test_agent_gives_the_in_process_result(shared_agent, node, twin, annotations, how, want_rc):
    def hook(n: Node, sock: Path | None) -> tuple[int, str]:
        state = n.state_json(1, annotations)
        if how == "env":
            return run_hook(n, state, sock=sock, argv=["prestart"], NUMA_PIN_CONFIG=str(n.config))
        if how == "relative":  # runtimes start hooks in the bundle; the agent must resolve from there
            return run_hook(n, state, sock=sock, argv=["--config", "config.yaml", "prestart"], cwd=n.root)
        return run_hook(n, state, sock=sock)

    before = len(shared_agent.records("served"))
    rc, err = hook(node, shared_agent.sock)
    want = hook(twin, None)
    assert (rc, err) == want
    assert rc == want_rc
    if rc:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("numa-pin: "), err
        assert json.loads(Path(reason_path(str(node.state), "c1")).read_text())["line"] == lines[0]
    else:
        assert err == ""
    assert node.grants() == twin.grants()
    assert node.cpus_of(1) == twin.cpus_of(1)
    served = shared_agent.records("served")[before:]
    assert [r["rc"] for r in served] == [want_rc], (
        f"the agent must run the hook exactly once; its refusals: {shared_agent.records('fallback')}")
    assert served[0]["new_modules"] == [], "preload.PRELOAD misses modules the hook path imports"


def _proposed(cid: str, annotations: dict[str, str]) -> dict:
    """A config as podman proposes it to its precreate hooks (cgroupfs driver, no pid yet)."""
    return {"ociVersion": "1.0.2-dev", "process": {"args": ["sh"], "env": ["PATH=/usr/bin"]},
            "annotations": {"io.container.manager": "libpod", **annotations},
            "linux": {"cgroupsPath": f"/libpod_parent/libpod-{cid}", "resources": {"pids": {"limit": 2048}}}}


@pytest.mark.parametrize("annotations, want_rc", [({"numa-pin.io/cpus": "2"}, 0), ({}, 0),
                                                  ({"numa-pin.io/cpus": "64"}, 1)],
                         ids=["exclusive", "asks-nothing", "no-fit"])
def test_precreate_is_served_by_the_agent(shared_agent, node, twin, annotations, want_rc):
    """podman's precreate stage goes to the warm agent too: the config it prints, its stderr and
    the ledger are those of the in-process hook on an identical node."""
    cid = "f" * 64

    def hook(n: Node, sock: Path | None) -> tuple[int, bytes, str]:
        proc = subprocess.run([HOOK, "--config", str(n.config), "precreate"],
                              input=json.dumps(_proposed(cid, annotations)).encode(), capture_output=True,
                              env=hook_env(n, sock), timeout=120)
        return proc.returncode, proc.stdout, proc.stderr.decode()

    def grants(n: Node) -> dict[str, dict]:
        return {k: {f: v for f, v in g.items() if f != "pending_since"} for k, g in n.grants().items()}

    before = len(shared_agent.records("served"))
    got, want = hook(node, shared_agent.sock), hook(twin, None)
    assert got == want and got[0] == want_rc, (got, want)
    assert grants(node) == grants(twin)
    if want_rc == 0:
        spec = json.loads(got[1])
        held = node.grants().get(cid)
        cpus = spec["linux"]["resources"].get("cpu", {}).get("cpus")
        assert (parse_list(cpus) if cpus else frozenset()) == (held["cpus"] and parse_list(held["cpus"]) if held
                                                               else frozenset())
    served = shared_agent.records("served")[before:]
    assert [r["rc"] for r in served] == [want_rc], f"the agent must serve precreate: {shared_agent.records()}"


def test_release_through_the_agent_matches(shared_agent, node, twin):
    for n, sock in ((node, shared_agent.sock), (twin, None)):
        state = n.state_json(2, {"numa-pin.io/cpus": "2"})
        assert run_hook(n, state, sock=sock) == (0, "")
        assert "c2" in n.grants()
        assert run_hook(n, state, "poststop", sock=sock) == (0, "")
        assert n.grants() == {}
    assert node.cpus_of(2) == twin.cpus_of(2)


def test_oversized_state_is_reported_like_in_process(shared_agent, node, twin):
    """The hook reads one byte past the OCI state limit, so the agent sees the same verdict."""
    big = b" " * MAX_DOCUMENT_BYTES + b"{}"
    got = run_hook(node, big, sock=shared_agent.sock)
    assert got == run_hook(twin, big, sock=None)
    assert got[0] == 1 and "larger than" in got[1]
    assert protocol.MAX_STDIN_BYTES == MAX_DOCUMENT_BYTES + 1


def test_hook_client_path_imports_only_cheap_modules(shared_agent, node):
    """A hook served by the agent never loads the expensive pure-Python modules."""
    state = node.state_json(3, {"numa-pin.io/cpus": "2"})
    code = (
        "import io, sys\nfrom numa_pin.entry import hook as main\n"
        f"sys.stdin = io.TextIOWrapper(io.BytesIO({state!r}))\n"
        f"rc = main.main(['--config', {str(node.config)!r}, 'prestart'])\n"
        "print(rc); print(' '.join(sorted(sys.modules)))\n"
    )
    # as the installed launcher runs it: without site, its directories on the path
    without_site = set(_sys_path("-S"))
    site_dirs = [d for d in _sys_path() if d not in without_site]
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env=hook_env(node, shared_agent.sock, PYTHONPATH=":".join(site_dirs)), timeout=120)
    rc, modules = out.stdout.splitlines()[:2]
    assert rc == "0", out.stderr
    loaded = set(modules.split())
    assert not loaded & {"socket", "json", "re", "enum", "base64", "struct", "typing", "dataclasses", "selectors",
                         "os", "collections.abc"}
    assert "numa_pin.service.node" not in loaded, "the admission ran in-process, not in the agent"
    assert len(node.granted("c3")) == 2


def _sys_path(*flags: str) -> list[str]:
    out = subprocess.run([sys.executable, *flags, "-E", "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                         capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def _function_level_imports() -> dict[str, set[str]]:
    """Module name -> hook-path modules that import it inside a function (read from the source)."""
    import ast

    import numa_pin

    src = Path(numa_pin.__file__).parent
    skip = ("numa_pin.cli", "numa_pin.testing", "numa_pin.agent", "numa_pin.api")
    found: dict[str, set[str]] = {}
    for f in sorted(src.rglob("*.py")):
        mod = ".".join(f.relative_to(src.parent).with_suffix("").parts)
        if mod.startswith(skip):
            continue
        for fn in ast.walk(ast.parse(f.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name, set()).add(mod)
    return found


def test_preload_covers_every_function_level_import():
    """An independent check of preload.PRELOAD: every lazy import in the hook path's source is
    loaded by preload(), except the documented NOT_PRELOADED ones."""
    code = "import sys\nfrom numa_pin.agent import preload\npreload.preload()\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    loaded = set(out.stdout.split())
    lazy = _function_level_imports()
    assert "numa_pin.enforcer.gpu" in lazy and "numa_pin.resources.nvidia" in lazy  # the scan finds what it should
    missing = {name: sorted(users) for name, users in lazy.items()
               if name not in loaded and name not in preload.NOT_PRELOADED}
    assert missing == {}
    assert not set(preload.NOT_PRELOADED) & loaded


# ---- fallbacks -------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_hook_runs_in_process_after_the_server_is_gone(tmp_path, node, signum):
    agent = Served(tmp_path / "agent")
    assert run_hook(node, node.state_json(0, {"numa-pin.io/cpus": "2"}), sock=agent.sock) == (0, "")
    assert len(agent.records("served")) == 1
    agent.stop(signum)
    assert agent.sock.exists() == (signum == signal.SIGKILL)  # SIGTERM removes it; SIGKILL leaves it stale
    assert run_hook(node, node.state_json(1, {"numa-pin.io/cpus": "2"}), sock=agent.sock) == (0, "")
    assert set(node.grants()) == {"c0", "c1"}
    assert len(agent.records("served")) == 1
    assert node.cpus_of(1) == node.granted("c1")


def _stale_socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays; nothing listens


@pytest.mark.parametrize(
    "make",
    [lambda p: None, _stale_socket, lambda p: p.write_text("x"), lambda p: p.mkdir()],
    ids=["missing", "stale-socket", "regular-file", "directory"],
)
def test_hook_runs_in_process_without_a_server(node, twin, make):
    sock = node.root / "agent.sock"
    make(sock)
    state = node.state_json(4, {"numa-pin.io/cpus": "2"})
    assert run_hook(node, state, sock=sock) == (0, "")
    assert run_hook(twin, twin.state_json(4, {"numa-pin.io/cpus": "2"}), sock=None) == (0, "")
    assert node.grants() == twin.grants()


def test_version_mismatch_falls_back(tmp_path, node):
    agent = Served(tmp_path / "agent", version="0.0.0-old")
    try:
        assert run_hook(node, node.state_json(0, {"numa-pin.io/cpus": "2"}), sock=agent.sock) == (0, "")
        assert agent.records("served") == []
        (refused,) = agent.records("fallback")
        assert "0.0.0-old" in refused["reason"] and "restart" in refused["reason"]
        assert node.cpus_of(0) == node.granted("c0") and len(node.cpus_of(0)) == 2
    finally:
        assert agent.stop() == 0


class DyingAgent:
    """A fake agent that runs the hook it is sent (in-process, to completion) and then dies
    without replying: the worst moment for the hook's fallback."""

    def __init__(self, path: Path, node: Node) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(1)
        self.sock.settimeout(WAIT_S)
        self.node = node
        self.result: tuple[int, str] | None = None
        self.grants_after: dict | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.settimeout(WAIT_S)
            conn.sendall(protocol.ACCEPTED)
            req = request.decode_request(request.recv_frame(conn, protocol.MAX_REQUEST_BYTES))
            self.result = run_hook(self.node, req.stdin, argv=list(req.argv))
            self.grants_after = self.node.grants()
        self.sock.close()


@pytest.mark.parametrize("stage", ["prestart", "poststop"], ids=["admit", "release"])
def test_server_dying_after_the_work_is_safe(node, stage):
    """Admission and release are idempotent, so running again in-process changes nothing."""
    state = node.state_json(5, {"numa-pin.io/cpus": "4"})
    if stage == "poststop":
        assert run_hook(node, state) == (0, "")
    dying = DyingAgent(node.root / "dying.sock", node)
    assert run_hook(node, state, stage, sock=node.root / "dying.sock") == (0, "")
    dying.thread.join(WAIT_S)
    assert dying.result == (0, "")
    assert node.grants() == dying.grants_after
    if stage == "prestart":
        assert len(node.granted("c5")) == 4 and node.cpus_of(5) == node.granted("c5")
        assert list(node.grants()) == ["c5"]
    else:
        assert node.grants() == {}


# ---- concurrency and children ----------------------------------------------------------------


def test_concurrent_hooks_get_distinct_cpus_and_leave_no_zombies(served, node):
    count = 8
    procs = [
        subprocess.Popen([HOOK, "--config", str(node.config), "prestart"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=hook_env(node, served.sock))
        for _ in range(count)
    ]
    for i, p in enumerate(procs):
        p.stdin.write(node.state_json(i, {"numa-pin.io/cpus": "2"}))
        p.stdin.close()
    results = [(p.wait(timeout=120), p.stderr.read().decode()) for p in procs]
    assert results == [(0, "")] * count
    assert len(served.records("served")) == count
    cpus = [node.granted(f"c{i}") for i in range(count)]
    assert all(len(c) == 2 for c in cpus)
    assert len(frozenset().union(*cpus)) == 2 * count, f"overlapping grants: {cpus}"
    assert [node.cpus_of(i) for i in range(count)] == cpus
    per_node = node.node_cpus()
    assert len(per_node) == 2
    for c in cpus:  # single-numa-node: each grant within one NUMA node
        assert sum(1 for n in per_node if c & n) == 1, (c, per_node)
    # every child exits after its reply and is reaped: no zombies; what is left is one spare
    # child waiting for the next hook (it served none of these)
    served_pids = {r["pid"] for r in served.records("served")}
    wait_for(lambda: len(served.children()) <= 1 and not {c.pid for c in served.children()} & served_pids,
             "the server to reap its children")
    assert all(c.status() != psutil.STATUS_ZOMBIE for c in served.children())
    assert served.stop() == 0
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(served.sock) in " ".join(p.info["cmdline"] or [])]


def test_stopping_lets_admissions_in_flight_finish(served, node):
    """SIGTERM to the server and its child (what systemd sends a unit's cgroup) during an
    admission: the socket goes at once, the admission completes and is answered, then the
    server exits 0."""
    node.state.mkdir(parents=True, exist_ok=True)
    lock = os.open(node.state / "ledger.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the admission waits here, inside the child
    try:
        hook = subprocess.Popen([HOOK, "--config", str(node.config), "prestart"], stdin=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=hook_env(node, served.sock))
        hook.stdin.write(node.state_json(0, {"numa-pin.io/cpus": "2"}))
        hook.stdin.close()
        wait_for(lambda: _waiting_on_the_lock(node, served), "the admission to wait for the ledger lock")
        children = served.children()  # the child admitting, and a spare waiting for the next hook
        served.proc.send_signal(signal.SIGTERM)
        for child in children:
            child.send_signal(signal.SIGTERM)
        wait_for(lambda: not served.sock.exists(), "the socket to go")
        with pytest.raises(subprocess.TimeoutExpired):  # a server that does not drain exits here
            served.proc.wait(timeout=0.5)
        admitting = _waiting_on_the_lock(node, served)
        assert admitting and admitting.is_running() and admitting.status() != psutil.STATUS_ZOMBIE
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)
    assert (hook.wait(timeout=120), hook.stderr.read()) == (0, b"")
    assert served.proc.wait(timeout=WAIT_S) == 0
    assert [r["rc"] for r in served.records("served")] == [0]
    assert len(node.granted("c0")) == 2


def _waiting_on_the_lock(node: Node, served: Served) -> psutil.Process | None:
    """The server's child that has the ledger lock file open (the one admitting), if any."""
    lock = str(node.state / "ledger.lock")
    for child in served.children():
        try:
            if any(f.path == lock for f in child.open_files()):
                return child
        except psutil.Error:
            continue
    return None


def test_a_server_at_its_limit_sends_hooks_back(tmp_path, node):
    agent = Served(tmp_path / "agent", max_children=0)
    try:
        assert run_hook(node, node.state_json(0, {"numa-pin.io/cpus": "2"}), sock=agent.sock) == (0, "")
        assert agent.records("served") == []
        (refused,) = agent.records("fallback")
        assert "in flight" in refused["reason"]
        assert len(node.granted("c0")) == 2
        assert not agent.children(), "the parent refused without forking"
    finally:
        assert agent.stop() == 0


# ---- server start-up -------------------------------------------------------------------------


def test_serve_refuses_a_socket_in_use(shared_agent):
    out = subprocess.run([NUMA_PIN, "serve", "--socket", str(shared_agent.sock)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 4
    assert out.stderr.strip().startswith("numa-pin: AgentError: ") and "\n" not in out.stderr.strip()
    assert shared_agent.proc.poll() is None and shared_agent.sock.exists()


def _answering(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(1)
    return s


@pytest.mark.parametrize(
    "prepare, error",
    [
        (lambda p: None, None),
        (_stale_socket, None),
        (lambda p: p.write_text("keep me") and None, "not a socket"),
        (_answering, "another server answers"),
        (lambda p: os.chmod(p.parent, 0o777), "writable by others"),
    ],
    ids=["fresh", "stale-socket-replaced", "regular-file", "server-answers", "unsafe-directory"],
)
def test_open_socket(tmp_path, prepare, error):
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    path = run / "agent.sock"
    keep = prepare(path)
    if error is not None:
        with pytest.raises(NumaPinError, match=error):
            server.open_socket(str(path))
        if keep is not None:
            keep.close()
        return
    lock_fd, listener = server.open_socket(str(path))
    try:
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
        with pytest.raises(NumaPinError, match="another numa-pin serve is running"):
            server.open_socket(str(path))
    finally:
        listener.close()
        os.close(lock_fd)


def test_open_socket_creates_a_private_directory(tmp_path):
    path = tmp_path / "new" / "agent.sock"
    lock_fd, listener = server.open_socket(str(path))
    listener.close()
    os.close(lock_fd)
    assert oct(os.stat(path.parent).st_mode & 0o777) == "0o700"


# ---- pure pieces -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uid, server_uid, allowed",
    [(0, 0, True), (1000, 0, False), (1000, 1000, True), (0, 1000, True), (1001, 1000, False), (65534, 0, False)],
    ids=["root-root", "user-to-root-server", "same-user", "root-to-user-server", "other-user", "nobody"],
)
def test_peer_allowed(uid, server_uid, allowed):
    assert protocol.peer_allowed(uid, server_uid) is allowed


def _ns_tree(root: Path, mine: dict[str, str], theirs: dict[str, str] | None) -> None:
    for pid, links in (("self", mine), ("77", theirs)):
        if links is None:
            continue
        d = root / pid / "ns"
        d.mkdir(parents=True)
        for name, target in links.items():
            os.symlink(target, d / name)


SAME_NS = {"pid": "pid:[1]", "mnt": "mnt:[2]", "net": "net:[3]", "cgroup": "cgroup:[4]"}


@pytest.mark.parametrize(
    "mine, theirs, want",
    [
        (SAME_NS, SAME_NS, None),
        (SAME_NS, {**SAME_NS, "pid": "pid:[9]"}, "pid"),
        (SAME_NS, {**SAME_NS, "mnt": "mnt:[9]"}, "mnt"),
        (SAME_NS, {k: v for k, v in SAME_NS.items() if k != "net"}, "net"),
        (SAME_NS, None, "pid"),
        ({k: v for k, v in SAME_NS.items() if k != "cgroup"}, {**SAME_NS, "cgroup": "cgroup:[9]"}, None),
    ],
    ids=["same", "other-pid-ns", "other-mount-ns", "peer-link-missing", "peer-gone", "kernel-without-cgroup-ns"],
)
def test_namespace_mismatch(tmp_path, mine, theirs, want):
    _ns_tree(tmp_path, mine, theirs)
    assert client.namespace_mismatch(77, str(tmp_path)) == want


def test_namespace_mismatch_of_this_process_is_none():
    assert client.namespace_mismatch(os.getpid()) is None
    assert client.namespace_mismatch(0) is not None  # pid 0: a peer outside our pid namespace


def _request(**override) -> bytes:
    doc = {"v": protocol.PROTOCOL, "version": "0.1.0", "argv": ["prestart"], "stdin": "e30=",
           "env": {"NUMA_PIN_DEBUG": "1"}, "cwd": "/"}
    doc.update(override)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "body, error",
    [
        (_request(), None),
        (b"{", "not JSON"),
        (b"[]", "not a JSON object"),
        (_request(v="1"), "'v'"),
        (_request(argv=["a", 1]), "'argv'"),
        (_request(stdin="!!"), "not base64"),
        (_request(env={"PATH": "/bin"}), "'env'"),
        (_request(env={"NUMA_PIN_CONFIG": 1}), "'env'"),
        (_request(cwd="relative"), "'cwd'"),
        (_request(version=None), "'version'"),
        (b"[" * 200000, "nested more than"),
        (_request(argv=[[["prestart"]]] * 2, env={"A": [[[[[[[[[]]]]]]]]]}), "nested more than"),
    ],
    ids=["good", "truncated", "array", "protocol-string", "argv-int", "bad-base64", "env-not-passed",
         "env-not-string", "cwd-relative", "no-version", "deep-beyond-the-decoder", "deep"],
)
def test_decode_request(body, error):
    if error is None:
        req = request.decode_request(body)
        assert (req.argv, req.stdin, dict(req.env), req.cwd) == (("prestart",), b"{}", {"NUMA_PIN_DEBUG": "1"}, "/")
    else:
        with pytest.raises(ValueError, match=error):
            request.decode_request(body)


@pytest.mark.parametrize(
    "revision, version, want",
    [(protocol.PROTOCOL, "0.1.0", None), (protocol.PROTOCOL + 1, "0.1.0", "protocol"),
     (protocol.PROTOCOL, "0.2.0", "restart")],
    ids=["match", "protocol-mismatch", "version-mismatch"],
)
def test_refusal(revision, version, want):
    req = request.Request(revision, version, (), b"", {}, "/")
    reason = request.refusal(req, server_version="0.1.0")
    assert reason is None if want is None else want in reason


def test_client_request_round_trips_through_the_server_decoder(tmp_path):
    env = {"NUMA_PIN_CONFIG": "/etc/x é.yaml", "NUMA_PIN_DEBUG": "1", "PATH": "/bin", "HOME": "/root"}
    argv = ["--config", "/odd \udc80 name", "prestart"]
    body = protocol.encode_request(argv, b"\x00\xff{}", env, str(tmp_path))
    req = request.decode_request(body)
    assert list(req.argv) == argv and req.stdin == b"\x00\xff{}" and req.cwd == str(tmp_path)
    assert dict(req.env) == {"NUMA_PIN_CONFIG": "/etc/x é.yaml", "NUMA_PIN_DEBUG": "1"}
    assert req.version == protocol.__version__ and req.protocol == protocol.PROTOCOL


def test_changed_sources(tmp_path):
    files = [tmp_path / n for n in ("a.py", "b.py", "c.py")]
    for f in files:
        f.write_text("x = 1\n")
    stamps = {str(f): os.stat(f).st_mtime_ns for f in files}
    assert preload.changed_sources(stamps) == []
    os.utime(files[1], ns=(1, 1))
    files[2].unlink()
    assert preload.changed_sources(stamps) == [str(files[1]), str(files[2])]


def test_run_request_changes_no_process_global(tmp_path, monkeypatch):
    """The child runs the request's hook with the request's variables and directory, given to
    numa_pin.hook.invoke explicitly: the process's environment, stderr and cwd stay as they are."""
    monkeypatch.chdir("/")
    monkeypatch.setenv("NUMA_PIN_CONFIG", "/from/server")
    (tmp_path / "rel.yaml").write_text("policy: strict\n")  # a config error names the file it read
    req = request.Request(protocol.PROTOCOL, protocol.__version__, ("--config", "rel.yaml", "prestart"),
                           b'{"id": "x", "bundle": "b", "pid": 1}', {"NUMA_PIN_CACHE_DIR": "cache"}, str(tmp_path))
    saved_err, environ = sys.stderr, dict(os.environ)
    rc, err, _ = request.run_request(req)
    assert rc == 3 and str(tmp_path / "rel.yaml") in err  # resolved against the request's cwd
    assert os.getcwd() == "/" and dict(os.environ) == environ and sys.stderr is saved_err
    assert request.run_request(replace(req, argv=("poststart",))) == (0, "", b"")
    with pytest.raises(OSError):
        request.run_request(replace(req, cwd=str(tmp_path / "gone")))


def test_run_request_reports_usage_and_tracebacks(tmp_path, monkeypatch):
    usage = request.Request(protocol.PROTOCOL, protocol.__version__, ("--help",), b"", {}, str(tmp_path))
    rc, err, _ = request.run_request(usage)
    assert rc == 1 and err.startswith("usage: numa-pin-hook")
    monkeypatch.setattr("numa_pin.hook.invoke.run", lambda request, on_line=None, warm_state=None: 1 / 0)  # re-raised
    rc, err, _ = request.run_request(usage)
    assert rc == 1 and "Traceback" in err and "ZeroDivisionError" in err


def test_the_agent_passes_every_variable_the_hook_reads():
    from numa_pin.hook import invoke

    assert protocol.PASSED_ENV == invoke.HOOK_ENV


# ---- the client against fake servers ---------------------------------------------------------


def _reply(doc) -> bytes:
    return protocol.frame(json.dumps(doc).encode())


def _silent_until_hung_up(conn: socket.socket) -> None:
    """Say nothing more until the hook gives up and closes its end (a stopped child, a frozen
    cgroup): the fake's silence lasts exactly as long as the hook waits, not a guessed time."""
    assert conn.recv(1) == b"", "the hook sent more than its request"


FAKE_BEHAVIOURS = {
    "reply": lambda conn: conn.sendall(_reply({"rc": 3, "stderr": "numa-pin: from the agent\n"})),
    "keepalives-then-reply": lambda conn: [conn.sendall(protocol.KEEPALIVE) for _ in range(3)]
    and conn.sendall(_reply({"rc": 3, "stderr": "numa-pin: from the agent\n"})),
    "fallback-reply": lambda conn: conn.sendall(_reply({"fallback": "busy"})),
    "close-after-request": lambda conn: None,
    "garbage-reply": lambda conn: conn.sendall(protocol.frame(b"not json")),
    "trailing-garbage": lambda conn: conn.sendall(protocol.frame(b'{"rc": 0} x')),
    "huge-length": lambda conn: conn.sendall(b"\xff\xff\xff\xff"),
    "short-body": lambda conn: conn.sendall(b"\x00\x00\x00\x64" + b"{}"),
    "rc-not-int": lambda conn: conn.sendall(_reply({"rc": "0", "stderr": ""})),
    "rc-bool": lambda conn: conn.sendall(_reply({"rc": True, "stderr": ""})),
    # a child that accepted, read the request and then stopped (SIGSTOP, a frozen cgroup)
    "silent-after-request": _silent_until_hung_up,
    "keepalives-then-silent": lambda conn: [conn.sendall(protocol.KEEPALIVE) for _ in range(3)]
    and _silent_until_hung_up(conn),
}
#: what the fake does before the request: accept and say so (as the agent does), refuse with a
#: frame, accept and say nothing, or never accept (a stopped agent's listen backlog)
BEFORE_REQUEST = ("accepted", "refusal-frame", "silent-accept", "never-accept", "close-at-once")
#: the fakes the hook must give up on after ``STALL_S`` of silence: the tests shorten the stall
#: (the hook's patience is what they check, not its length), the others keep the real one
SILENT = ("silent-after-request", "keepalives-then-silent", "silent-accept", "never-accept")


@pytest.mark.parametrize(
    "behaviour, want",
    [("reply", 3), ("keepalives-then-reply", 3)]
    + [(b, None) for b in FAKE_BEHAVIOURS if not b.endswith("reply") or b == "fallback-reply"]
    + [(b, None) for b in BEFORE_REQUEST[1:]],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_try_agent_against_fake_servers(tmp_path, capsys, monkeypatch, behaviour, want):
    if behaviour in SILENT:
        monkeypatch.setattr(client, "STALL_S", 0.2)
    path = tmp_path / "fake.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(WAIT_S)
    got: list[bytes] = []

    def serve_once():
        if behaviour == "never-accept":
            return
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(WAIT_S)
            if behaviour == "close-at-once":
                return
            if behaviour == "refusal-frame":
                conn.sendall(_reply({"fallback": "busy"}))
                return
            if behaviour == "silent-accept":
                _silent_until_hung_up(conn)
                return
            conn.sendall(protocol.ACCEPTED)
            got.append(request.recv_frame(conn, protocol.MAX_REQUEST_BYTES))
            FAKE_BEHAVIOURS[behaviour](conn)

    t = threading.Thread(target=serve_once, daemon=True)
    t.start()
    rc = client.try_agent(["--config", "/c.yaml", "prestart"], b'{"id": "x"}', {"NUMA_PIN_DEBUG": "1"}, str(path))
    t.join(WAIT_S)
    listener.close()
    assert not t.is_alive(), "the fake server is still waiting for the hook to hang up"
    assert rc == want
    err = capsys.readouterr().err
    assert err == ("numa-pin: from the agent\n" if want == 3 else "")
    if behaviour in FAKE_BEHAVIOURS:
        req = request.decode_request(got[0])
        assert req.argv == ("--config", "/c.yaml", "prestart") and req.stdin == b'{"id": "x"}'
    else:  # a hook sends its request only to an agent that said it accepted the connection
        assert got == []


def test_try_agent_refuses_an_oversized_request_without_connecting(tmp_path):
    path = tmp_path / "fake.sock"
    listener = _answering(path)
    listener.settimeout(0.2)
    try:
        assert client.try_agent(["prestart"], b"x" * protocol.MAX_REQUEST_BYTES, {}, str(path)) is None
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


@pytest.mark.parametrize(
    "flag, env, want",
    [
        (None, {}, protocol.DEFAULT_SOCKET),
        (None, {protocol.SOCKET_ENV: "/e.sock"}, "/e.sock"),
        ("/f.sock", {protocol.SOCKET_ENV: "/e.sock"}, "/f.sock"),
        (None, {protocol.SOCKET_ENV: ""}, protocol.DEFAULT_SOCKET),
    ],
    ids=["default", "env", "flag-beats-env", "empty-env"],
)
def test_socket_path(flag, env, want):
    assert protocol.socket_path(env, flag) == want



def test_a_fifo_config_leaves_no_child_stuck(served, node, tmp_path):
    """Before: the agent's child blocked opening the FIFO forever and counted against MAX_CHILDREN."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    rc, err = run_hook(node, node.state_json(1), sock=served.sock, argv=["--config", str(fifo), "prestart"])
    assert rc != 0 and "a FIFO, not a regular file" in err and len(err.splitlines()) == 1, err
    assert [r["rc"] for r in served.records("served")] == [rc]  # the agent's child ran it and answered
    (first,) = served.records("served")
    wait_for(lambda: first["pid"] not in {c.pid for c in served.children()}, "the agent's child to exit")
    # the spares forked next rehearse with that FIFO config: they must not hang on it either
    for _ in range(5):
        assert run_hook(node, node.state_json(2), "poststop", sock=served.sock) == (0, "")
        if served.records("served")[-1]["by"] == "rehearsed":
            break
    assert served.records("served")[-1]["by"] == "rehearsed"


@pytest.mark.parametrize("cid, annotations, want_rc", [
    # a control character in the id: the OCI state is refused before anything is read (exit 1)
    ("c\nnuma-pin: admitted forged: cpus 0-3", {"numa-pin.io/cpus": "20"}, 1),
    ("c\x1b[2J\x07", {"numa-pin.io/cpus": "lots\x1b[31m"}, 1),
    ("deep", {"numa-pin.io/cpus": "1"}, 1),
], ids=["newline-in-id", "escapes-in-id-and-value", "deep-config-json"])
def test_hostile_input_through_the_agent_matches_in_process(shared_agent, node, twin, cid, annotations, want_rc):
    """Same one escaped line, same exit code, through the agent's child and in-process."""
    def hook(n: Node, sock: Path | None) -> tuple[int, str]:
        state = n.oci_state(cid, n.pid(4), annotations)
        if cid == "deep":
            bundle = json.loads(state)["bundle"]
            Path(bundle, "config.json").write_text('{"annotations": ' + "[" * 100_000 + "]" * 100_000 + "}")
        return run_hook(n, state, sock=sock)

    got = hook(node, shared_agent.sock)
    want = hook(twin, None)
    assert got == (want[0], want[1].replace(str(twin.root), str(node.root)))  # the twin's paths differ
    rc, err = got
    assert rc == want_rc and len(err.splitlines()) == 1 and err.startswith("numa-pin: "), err
    assert "\x1b" not in err and "internal error" not in err


# ---- an agent started on demand --------------------------------------------------------------


def _agents_on(sock: Path) -> list[psutil.Process]:
    """Live ``numa-pin serve`` servers started for ``sock`` (found by their command line; the
    children they fork for admissions share it and are left out)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "ppid"]):
        cmd = proc.info["cmdline"] or []
        if "serve" in cmd and str(sock) in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    pids = {p.pid for p in found}
    return [p for p in found if p.info["ppid"] not in pids]


def _answers(node: Node, sock: Path) -> bool:
    """Whether an agent on ``sock`` runs a hook (a release of a container with no grant)."""
    rc, _ = client.ask_agent(["--config", str(node.config), "poststop"], node.state_json(7), hook_env(node, sock),
                             str(sock))
    return rc == 0


@pytest.fixture
def on_demand(node):
    """The agent socket of ``node``; any agent started there is killed afterwards."""
    sock = node.root / "run" / "agent.sock"
    yield sock
    for proc in _agents_on(sock):
        proc.kill()


def test_a_hook_that_finds_no_agent_starts_one_for_the_next(node, twin, on_demand):
    """The first hook admits in-process (same result as the in-process oracle) and leaves an
    agent that serves the next one. run_hook captures stdout and stderr, so it returns only once
    every holder of those pipes closed them: the agent kept neither (a runtime would hang)."""
    state = node.state_json(0, {"numa-pin.io/cpus": "2"})
    assert run_hook(node, state, sock=on_demand, NUMA_PIN_AGENT_AUTOSTART="1") == (0, "")
    assert run_hook(twin, twin.state_json(0, {"numa-pin.io/cpus": "2"}), sock=None) == (0, "")
    assert node.grants() == twin.grants()
    wait_for(lambda: _answers(node, on_demand), "the agent started by the hook to answer")
    (agent,) = _agents_on(on_demand)
    assert os.getsid(agent.pid) == agent.pid  # a session of its own: the runtime's signals miss it
    assert agent.cwd() == "/"  # keeps no bundle directory busy
    assert {os.readlink(f"/proc/{agent.pid}/fd/{fd}") for fd in (0, 1, 2)} == {os.devnull}
    assert "--idle-exit" in agent.cmdline() and "-I" in agent.cmdline()
    assert run_hook(node, node.state_json(1, {"numa-pin.io/cpus": "2"}), sock=on_demand,
                    NUMA_PIN_AGENT_AUTOSTART="1") == (0, "")
    assert run_hook(twin, twin.state_json(1, {"numa-pin.io/cpus": "2"}), sock=None) == (0, "")
    assert node.grants() == twin.grants()
    assert [p.pid for p in _agents_on(on_demand)] == [agent.pid]  # served, not started again


@pytest.mark.parametrize(
    "extra",
    [{"NUMA_PIN_AGENT_AUTOSTART": "0"}, {"NUMA_PIN_NO_AGENT": "1"}],
    ids=["autostart-off", "no-agent"],
)
def test_no_agent_is_started_when_turned_off(node, on_demand, extra):
    assert run_hook(node, node.state_json(0, {"numa-pin.io/cpus": "2"}), sock=on_demand, **extra) == (0, "")
    time.sleep(0.5)  # a window for a wrongly started agent to show up: an absence has no event
    assert _agents_on(on_demand) == [] and not on_demand.exists()


def test_two_agents_started_at_once_leave_one(node, on_demand):
    """Past the start stamp's window, two starts race: the first to lock serves, the other exits
    before importing the hook path."""
    env = hook_env(node, on_demand)
    now = time.time()
    first = client.start_agent(env, str(on_demand), now=now)
    second = client.start_agent(env, str(on_demand), now=now + client.RESTART_AFTER_S + 1)
    assert first and second
    exited = wait_for(lambda: [pid for pid in (first, second) if os.waitpid(pid, os.WNOHANG)[0]],
                      "one of two agents to give way")
    assert len(exited) == 1
    wait_for(lambda: _answers(node, on_demand), "the other agent to answer")
    assert [p.pid for p in _agents_on(on_demand)] == [{first, second}.difference(exited).pop()]


def test_the_agent_keeps_no_descriptor_the_hook_inherited(node, on_demand):
    """A runtime may leave more than stdio open to its hook; the agent must hold none of it."""
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        pid = client.start_agent(hook_env(node, on_demand), str(on_demand))
        assert pid
        os.close(w)
        w = -1
        readable, _, _ = select.select([r], [], [], WAIT_S)
        assert readable and os.read(r, 1) == b""  # end of file: no writer is left
        wait_for(lambda: _answers(node, on_demand), "the agent to answer")
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_under_systemd_the_agent_is_a_transient_service(node, on_demand, tmp_path):
    """Where systemd is init, the agent is started through systemd-run (a fake here, which logs
    its arguments and runs the command after ``--``), in a unit named after the socket."""
    run_root, bin_dir = tmp_path / "run", tmp_path / "bin"
    (run_root / "systemd" / "system").mkdir(parents=True)
    bin_dir.mkdir()
    called = tmp_path / "systemd-run.args"
    fake = bin_dir / "systemd-run"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {called}\n'
                    'while [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n')
    fake.chmod(0o755)
    env = {**hook_env(node, on_demand), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    assert client.start_agent(env, str(on_demand), run_root=str(run_root))
    wait_for(lambda: _answers(node, on_demand), "the agent started through systemd-run to answer")
    args = called.read_text().splitlines()
    unit = [a for a in args if a.startswith("--unit=")]
    assert len(unit) == 1 and unit[0].startswith("--unit=numa-pin-agent-")
    assert {"--collect", "--no-block"} <= set(args)
    assert args[args.index("--") + 1:][-4:] == ["--socket", str(on_demand), "--idle-exit", str(client.IDLE_EXIT_S)]
    other = client.service_manager_argv(["x"], str(on_demand) + "2", env, str(run_root))
    assert other is not None and f"--unit={unit[0][7:]}" not in other  # one unit per socket


@pytest.mark.parametrize("systemd, tool", [(False, True), (True, False)], ids=["no-systemd", "no-systemd-run"])
def test_without_systemd_the_agent_is_spawned_directly(tmp_path, systemd, tool):
    run_root, bin_dir = tmp_path / "run", tmp_path / "bin"
    (run_root / ("systemd/system" if systemd else "other")).mkdir(parents=True)
    bin_dir.mkdir()
    if tool:
        (bin_dir / "systemd-run").write_text("#!/bin/sh\n")
        (bin_dir / "systemd-run").chmod(0o755)
    assert client.service_manager_argv(["x"], "/s.sock", {"PATH": str(bin_dir)}, str(run_root)) is None


def test_starts_are_spaced(node, on_demand):
    """One start per RESTART_AFTER_S: an agent that cannot come up is not retried by every hook."""
    env = hook_env(node, on_demand)
    on_demand.parent.mkdir(mode=0o700)
    now = time.time()
    pid = client.start_agent(env, str(on_demand), now=now)
    assert pid
    assert client.start_agent(env, str(on_demand), now=now + 1) is None
    assert (on_demand.parent / "agent.sock.start").stat().st_mode & 0o777 == 0o600
    wait_for(lambda: _answers(node, on_demand), "the agent to answer")


def test_an_idle_agent_exits(node, on_demand):
    pid = client.start_agent(hook_env(node, on_demand), str(on_demand), idle_exit_s=1)
    assert pid
    wait_for(lambda: _answers(node, on_demand), "the agent to answer")
    _, status = wait_for(lambda: (lambda r: r if r[0] else None)(os.waitpid(pid, os.WNOHANG)), "the idle agent to exit")
    assert os.waitstatus_to_exitcode(status) == 0
    assert not on_demand.exists()  # new hooks find nothing and start another


def test_an_on_demand_agent_retires_when_idle_or_upgraded(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("x = 1\n")
    path = str(tmp_path / "run" / "agent.sock")
    lock_fd, listener = server.open_socket(path)
    agent = server.AgentServer(path, lock_fd, listener, stamps={str(source): source.stat().st_mtime_ns},
                               idle_exit_s=60)
    try:
        now = agent.last_active
        assert not agent.retired(now + 1)
        assert agent.retired(now + 61)  # idle: it ran no request for 60 s
        agent.last_active = now + 61  # a request it ran (the sources are as loaded)
        assert not agent.retired(now + 62)
        os.utime(source, ns=(0, 0))  # an upgrade
        assert not agent.retired(now + 62)  # sources are looked at every 5 s
        assert agent.retired(now + 67)
        os.utime(source, ns=(agent.stamps[str(source)], agent.stamps[str(source)]))
        assert not agent.retired(now + 73)
        plain = server.AgentServer(path, os.dup(lock_fd), listener, idle_exit_s=None)
        assert not plain.retired(now + 10**6)  # a served socket or systemd's agent never retires
        os.unlink(path)  # the socket directory was cleaned up (a purge): no hook reaches this agent
        assert agent.retired(now + 79)
    finally:
        agent.close()


@pytest.mark.parametrize("via", ["agent", "in-process"])
@pytest.mark.parametrize("slow_start_s", [0.0, 1.5], ids=["prompt", "starved"])
def test_the_budget_counts_from_the_hooks_own_start(tmp_path, node, via, slow_start_s):
    """On a starved node the hook's own start can eat the runtime's hook timeout: the admission's
    budget (``admission_timeout_s``) counts from the hook process's start, read from the kernel
    (the agent reads its peer's), so the container gets a clear refusal, never a runtime timeout."""
    cfg = node.write_config(policy="single-numa-node", admission_timeout_s=1)
    agent = Served(tmp_path / "agent") if via == "agent" else None
    code = f"import sys, time; time.sleep({slow_start_s}); from numa_pin.entry.hook import main; sys.exit(main())"
    try:
        proc = subprocess.run([sys.executable, "-c", code, "--config", str(cfg), "prestart"],
                              input=node.state_json(0, {"numa-pin.io/cpus": "2"}), capture_output=True,
                              env=hook_env(node, agent.sock if agent else None), timeout=120)
        err = proc.stderr.decode()
        if slow_start_s:
            assert proc.returncode == 1, err
            assert err.startswith("numa-pin: rejected c0: AdmissionTimeout: ") and err.count("\n") == 1, err
            assert "counted from the hook's start" in err
            assert "c0" not in node.grants()
        else:
            assert (proc.returncode, err) == (0, "")
            assert len(node.granted("c0")) == 2
        if agent:
            assert agent.records("served")[-1]["rc"] == proc.returncode, "the agent ran it"
    finally:
        if agent:
            assert agent.stop() == 0


def test_the_last_note_of_a_child_that_exited_unseen_is_what_the_next_spare_rehearses(tmp_path):
    """The parent's select saw the taken spare's first note; the child then wrote its request
    and exited before the parent reaped it (a quick poststop on a loaded node). The spare forked
    next still rehearses that request: forked without it, it would never rehearse at all."""
    path = str(tmp_path / "run" / "agent.sock")
    lock_fd, listener = server.open_socket(path)
    agent = server.AgentServer(path, lock_fd, listener)
    try:
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the taken spare: once the parent has looked, its request's note, and done
            os.read(go_r, 1)
            spare.send_note(agent.spares.notes_w, spare.request_note(["numa-pin-hook"], {}, "/") or b"")
            os._exit(0)
        os.close(go_r)
        leave_r, leave_w = os.pipe()
        agent.spares.forked(pid, leave_w)
        spare.send_note(agent.spares.notes_w, spare.TAKEN)
        agent._collect(notes_ready=True)  # the select's look: TAKEN only
        assert agent.spares.rehearsal is None and pid not in agent.children
        os.write(go_w, b"g")
        os.close(go_w)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # the child wrote and exited since
        agent._collect(notes_ready=False)  # the next wake-up: SIGCHLD only
        assert agent.spares.rehearsal == {"argv": ["numa-pin-hook"], "env": {}, "cwd": "/"}
        assert agent.spares.wait(time.monotonic(), at_limit=False) is None, "a spare is forked at once"
        assert agent.spares.leave_w is None and os.read(leave_r, 8) == b"", "the taken spare's pipe is closed"
        os.close(leave_r)
    finally:
        agent.close()


def test_a_spare_forked_before_any_request_is_sent_away_by_the_first_one(tmp_path):
    """The first spare has nothing to rehearse. When a child forked for the connection (the
    spare was not ready yet) runs the first request, that spare would wait unrehearsed until
    the next hook, and no idle rehearsal would keep the caches fresh: the parent sends it away
    and forks the next one at once, and that one rehearses the request."""
    keeper = spare.SpareKeeper()
    leave_r, leave_w = os.pipe()
    keeper.forked(4242, leave_w)
    assert keeper.bare
    spare.send_note(keeper.notes_w, spare.READY)
    keeper.read(0.0)
    assert os.get_blocking(leave_r) and select.select([leave_r], [], [], 0)[0] == []
    spare.send_note(keeper.notes_w, spare.request_note(["numa-pin-hook"], {}, "/") or b"")
    assert keeper.read(1.0), "a request run: activity"
    assert os.read(leave_r, 8) == b"L\n" and os.read(leave_r, 8) == b"", "sent away, pipe closed"
    keeper.reaped(4242, 2.0)
    assert keeper.rehearsal is not None and keeper.wait(2.0, at_limit=False) is None, "the next spare at once"
    leave_r2, leave_w2 = os.pipe()
    keeper.forked(4343, leave_w2)
    assert not keeper.bare, "it rehearses what the first request asked"
    spare.send_note(keeper.notes_w, spare.request_note(["numa-pin-hook", "--config", "/x"], {}, "/") or b"")
    keeper.read(3.0)
    assert select.select([leave_r2], [], [], 0)[0] == [], "a rehearsed spare stays"
    keeper.reaped(4343, 4.0)  # it died without taking a connection: the next one in a while
    assert keeper.wait(4.0, at_limit=False) == pytest.approx(spare.SPARE_RETRY_S)
    for fd in (leave_r, leave_r2, keeper.notes_r, keeper.notes_w):
        os.close(fd)


def _spare_listener(tmp_path: Path) -> socket.socket:
    """A non-blocking listening socket, as a spare waits on the agent's."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s"))
    listener.listen(1)
    listener.setblocking(False)
    return listener


def test_await_connection_leaves_when_the_parent_sends_the_spare_away(tmp_path):
    listener = _spare_listener(tmp_path)
    stop_r, stop_w = os.pipe()
    leave_r, leave_w = os.pipe()
    try:
        os.write(leave_w, b"L\n")
        assert spare.await_connection(listener, stop_r, every_s=600, on_idle=lambda: None, leave_fd=leave_r) is None
        assert select.select([stop_r], [], [], 0)[0] == [], "the server did not stop"
    finally:
        for fd in (stop_r, stop_w, leave_r, leave_w):
            os.close(fd)
        listener.close()


@pytest.mark.parametrize("change", ["removed", "replaced", "kept"])
def test_systemds_agent_leaves_when_its_socket_file_goes(tmp_path, change):
    """A socket-activated agent (systemd passed the socket; no --idle-exit) whose socket file is
    removed would run beside the agent the next hook starts on that path: it leaves instead."""
    path = str(tmp_path / "agent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    agent = server.AgentServer(path, os.open(os.devnull, os.O_RDONLY), listener, owns_path=False)
    try:
        now = time.monotonic()
        assert not agent.retired(now)
        if change != "kept":
            os.unlink(path)
        if change == "replaced":  # the agent a hook started on demand listens there now
            other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            other.bind(path)
            other.close()
        assert agent.retired(now + 6) == (change != "kept")
        assert os.path.exists(path) == (change != "removed"), "systemd's socket file is never touched"
    finally:
        agent.close()


@pytest.mark.parametrize(
    "mine, pid1, pid2, env, euid, want",
    [
        (SAME_NS, SAME_NS, {}, {}, 0, True),
        (SAME_NS, {**SAME_NS, "mnt": "mnt:[9]"}, {}, {}, 0, False),  # crun inside `unshare -m`
        (SAME_NS, {**SAME_NS, "pid": "pid:[9]"}, {}, {}, 0, False),
        (SAME_NS, {}, SAME_NS, {}, 0, True),  # pid 1 not readable: kthreadd tells
        (SAME_NS, {}, {**SAME_NS, "mnt": "mnt:[9]"}, {}, 0, False),
        (SAME_NS, {}, {}, {}, 0, False),  # nothing to compare with
        (SAME_NS, SAME_NS, {}, {}, 1000, False),  # rootless
        (SAME_NS, SAME_NS, {}, {"NUMA_PIN_AGENT_AUTOSTART": "0"}, 0, False),
        (SAME_NS, SAME_NS, {}, {"NUMA_PIN_NO_AGENT": "1"}, 0, False),
    ],
    ids=["host", "private-mount-ns", "private-pid-ns", "init-hidden-kthreadd-same", "init-hidden-kthreadd-other",
         "nothing-readable", "rootless", "autostart-off", "no-agent"],
)
def test_autostart_allowed(tmp_path, monkeypatch, mine, pid1, pid2, env, euid, want):
    for pid, links in (("self", mine), ("1", pid1), ("2", pid2)):
        (tmp_path / pid / "ns").mkdir(parents=True)
        for name, target in links.items():
            os.symlink(target, tmp_path / pid / "ns" / name)
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    assert client.autostart_allowed(env, str(tmp_path)) is want


def test_serve_idle_exit_must_be_positive(tmp_path):
    proc = subprocess.run([NUMA_PIN, "serve", "--socket", str(tmp_path / "s.sock"), "--idle-exit", "0"],
                          capture_output=True, text=True, timeout=WAIT_S)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--idle-exit" in proc.stderr


# ---- the spare child (numa_pin.agent.spare) ----------------------------------------------------


def _tree(*roots: Path) -> dict[str, bytes]:
    """Every regular file under ``roots`` with its content."""
    return {str(p): p.read_bytes() for root in roots for p in sorted(root.rglob("*")) if p.is_file()}


def test_hooks_are_served_by_rehearsed_spares_with_the_in_process_result(served, node, twin):
    for i in range(4):
        state, twin_state = node.state_json(i, {"numa-pin.io/cpus": "2"}), twin.state_json(i, {"numa-pin.io/cpus": "2"})
        assert run_hook(node, state, sock=served.sock) == run_hook(twin, twin_state, sock=None) == (0, "")
    assert node.grants() == twin.grants()
    assert len(served.records("served")) == 4
    # the first spare had no hook to rehearse; the ones forked after a request rehearse with it

    def rehearsed_one_served() -> bool:
        if "rehearsed" not in [r["by"] for r in served.records("served")]:
            assert run_hook(node, node.state_json(7), "poststop", sock=served.sock) == (0, "")
        return "rehearsed" in [r["by"] for r in served.records("served")]

    wait_for(rehearsed_one_served, "a spare that rehearsed to serve a hook", interval=0.05)


def test_a_rehearsal_changes_nothing_on_the_node(node, monkeypatch):
    assert run_hook(node, node.state_json(0, {"numa-pin.io/cpus": "2"})) == (0, "")  # a grant to keep
    monkeypatch.chdir(node.root)
    before = _tree(node.state, node.cg, node.proc)
    request = {"argv": ["--config", str(node.config), "prestart"], "cwd": str(node.root),
               "env": {"NUMA_PIN_CACHE_DIR": str(node.cache)}}
    kept = WarmState()
    spare.rehearse(request, kept)
    assert kept.refs is not None  # what it checked is kept in the state it was given
    kept.forget()  # and the descriptors it held are closed with it
    assert _tree(node.state, node.cg, node.proc) == before
    assert os.getcwd() == str(node.root)  # resolved against the request's cwd, never changed into


def test_a_spare_killed_while_waiting_is_replaced(served, node):
    (idle,) = wait_for(served.children, "the first spare")
    idle.kill()
    idle.wait(WAIT_S)
    # until the next spare, the parent accepts and forks for each hook
    assert run_hook(node, node.state_json(0, {"numa-pin.io/cpus": "2"}), sock=served.sock) == (0, "")
    assert [r["by"] for r in served.records("served")] == ["fork"]
    forked = served.records("served")[0]["pid"]
    wait_for(lambda: [c for c in served.children() if c.pid not in (idle.pid, forked)], "a new spare")

    def served_by_the_new_spare() -> bool:  # once it has rehearsed (a moment after its fork)
        assert run_hook(node, node.state_json(7), "poststop", sock=served.sock) == (0, "")
        return served.records("served")[-1]["by"] != "fork"

    wait_for(served_by_the_new_spare, "the new spare to serve a hook", interval=0.05)
    assert served.records("served")[-1]["by"] == "rehearsed"
    spares = served.children()
    assert served.stop() == 0
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in spares),
             "the spare to leave with the server")


def test_notes_are_read_as_whole_lines(tmp_path):
    r, w = os.pipe2(os.O_NONBLOCK)
    try:
        spare.send_note(w, spare.READY)
        spare.send_note(w, spare.TAKEN)
        note = spare.request_note(["--config", "/c.yaml"], {"NUMA_PIN_CACHE_DIR": "/x", "HOME": "/root"}, "/b")
        os.write(w, note[:6])  # a note cut short by a read
        lines, rest = spare.read_notes(r, b"")
        assert lines == [spare.READY, spare.TAKEN] and rest == note[:6]
        os.write(w, note[6:] + b"\n")
        lines, rest = spare.read_notes(r, rest)
        assert lines == [note] and rest == b""
        assert spare.parse_request_note(lines[0]) == {"argv": ["--config", "/c.yaml"], "cwd": "/b",
                                                      "env": {"NUMA_PIN_CACHE_DIR": "/x"}}
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("line", [b"R", b"Q ", b"Q {", b"Q []", b'Q {"argv": "x", "env": {}, "cwd": "/"}',
                                  b'Q {"argv": [1], "env": {}, "cwd": "/"}', b'Q {"argv": [], "env": {"a": 1}, "cwd": "/"}',
                                  b'Q {"argv": [], "env": {}}'],
                         ids=["ready", "empty", "cut", "list", "argv-str", "argv-int", "env-int", "no-cwd"])
def test_malformed_request_notes_are_ignored(line):
    assert spare.parse_request_note(line) is None


def test_a_request_too_big_for_one_pipe_write_is_not_noted():
    assert spare.request_note(["--config", "x" * spare.MAX_NOTE_BYTES], {}, "/") is None


def test_an_idle_spare_keeps_the_topology_cache_fresh(tmp_path, node):
    """A hook never waits for a discovery: while no hook comes, the spare rehearses again and
    rediscovers a topology the cache no longer holds (here: removed; in life: older than 30 s)."""
    agent = Served(tmp_path / "agent", rehearse_every_s=0.2)
    try:
        assert run_hook(node, node.state_json(0), "poststop", sock=agent.sock) == (0, "")
        (cached,) = wait_for(lambda: list(node.cache.glob("topology-*.json")), "the topology cache")
        for _ in range(2):  # the second time, the spare's first rehearsal is surely over
            cached.unlink()
            wait_for(cached.exists, "an idle spare to rediscover the topology")
        assert len(agent.records("served")) == 1, "no hook wrote it"
        assert run_hook(node, node.state_json(1, {"numa-pin.io/cpus": "2"}), sock=agent.sock) == (0, "")
        assert agent.records("served")[-1]["by"] == "rehearsed"
    finally:
        assert agent.stop() == 0


def test_await_connection_rehearses_at_once_when_its_preparation_went_stale(tmp_path):
    """An idle spare asks every STALE_CHECK_S whether the ledger it rehearsed on was replaced,
    and rehearses again then, not REHEARSE_EVERY_S later."""
    listener = _spare_listener(tmp_path)
    stop_r, stop_w = os.pipe()
    asked: list[float] = []
    idle: list[float] = []

    def stale() -> bool:
        asked.append(time.monotonic())
        return len(asked) == 3  # replaced between the second look and the third

    def on_idle() -> None:
        idle.append(time.monotonic())
        os.close(stop_w)

    try:
        started = time.monotonic()
        assert spare.await_connection(listener, stop_r, every_s=600, on_idle=on_idle, stale=stale) is None
        assert len(asked) == 3 and len(idle) == 1
        assert idle[0] - started < 60  # not the 600 s of an idle rehearsal
    finally:
        listener.close()
        os.close(stop_r)


def test_a_ledger_watch_sees_every_commit_by_anyone_else(tmp_path):
    ledger = Ledger(tmp_path / "state")
    watch = spare.LedgerWatch(ledger)  # no ledger yet
    assert not watch.changed()
    with ledger.transaction() as txn:
        txn.put(Grant("c1", "pod-1", "c1", "exclusive", pid=1, start_time=1.0, cgroup="/ctr/c1",
                      cpus=frozenset({1}), mems=frozenset({0}), policy="restricted", created=1.0))
    assert watch.changed()
    keeper = server.spare.SpareKeeper()
    try:
        assert not keeper.stale()  # nothing rehearsed: nothing to go stale
        keeper.watch = spare.LedgerWatch(ledger)
        assert not keeper.stale()
        os.replace(_copy(ledger.path), ledger.path)  # replaced whole, as every writer does
        assert keeper.stale()
    finally:
        os.close(keeper.notes_r)
        os.close(keeper.notes_w)


def _copy(path: str) -> str:
    copy = path + ".copy"
    shutil.copyfile(path, copy)
    return copy


def test_await_connection_rehearses_while_idle_and_leaves_on_stop(tmp_path):
    listener = _spare_listener(tmp_path)
    stop_r, stop_w = os.pipe()
    idle = []

    def on_idle() -> None:
        idle.append(time.monotonic())
        if len(idle) == 3:
            os.close(stop_w)  # the server stops while the spare waits

    try:
        assert spare.await_connection(listener, stop_r, every_s=0.01, on_idle=on_idle) is None
        assert len(idle) == 3
        client_end = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client_end.connect(str(tmp_path / "s"))
        r2, w2 = os.pipe()
        conn = spare.await_connection(listener, r2, every_s=0.01, on_idle=lambda: None)
        assert conn is not None and conn.getblocking()
        conn.close()
        client_end.close()
        os.close(r2)
        os.close(w2)
    finally:
        listener.close()
        os.close(stop_r)
