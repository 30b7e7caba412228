"""Hostile hook inputs as hypothesis strategies, and one runner that checks every invariant.

Shared by ``test_hook_fuzz.py`` (a few hundred cases in ``make test``) and
``test_hook_stress.py`` (``make stress``: 10,000 cases). The input classes of issue 10:

* ``fifo``: a FIFO where a file is read (the bundle's config.json, ``--config``,
  ``$NUMA_PIN_CONFIG``, the topology cache, the ledger);
* ``deep``: nesting from a few levels to 200,000 in the OCI state, config.json or config YAML;
* ``symlink``: ``ledger.lock``, ``ledger.json``, ``reasons/`` or a cache file planted as a
  symlink to a file or directory outside the roots;
* ``ids``: container ids, annotation and ``PCIDEVICE_*`` values with control characters.

Invariants, for every case: the hook returns within :data:`LIMIT_S`; its exit code is one of
0-4 (never 70, the internal-error code); a failure is exactly one line starting ``numa-pin: ``
with no raw control character; nothing is written outside the node's root; files planted
outside the root are untouched.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import string
import threading
from pathlib import Path

from hypothesis import strategies as st

from numa_pin.entry import hook as hook_main

#: a case that takes longer than this is a hang
LIMIT_S = 30.0

CONTROL = "".join(chr(c) for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, 0x202E])
ID_TEXT = st.text(alphabet=st.sampled_from(string.ascii_letters + string.digits + "-_/." + CONTROL), min_size=1,
                  max_size=40)
DEPTHS = st.one_of(st.integers(1, 70), st.sampled_from([100, 1_000, 5_000, 50_000, 200_000]))

# every class also draws the container id, so hypothesis (which never repeats an input) can
# give each class its share of a long run
FIFO = st.tuples(st.just("fifo"), st.sampled_from(["config.json", "--config", "env", "cache", "ledger.json"]),
                 ID_TEXT)
DEEP = st.tuples(st.just("deep"), st.sampled_from(["state", "config.json", "yaml-flow", "yaml-block"]),
                 st.sampled_from(["list", "object"]), DEPTHS, ID_TEXT)
SYMLINK = st.tuples(st.just("symlink"), st.sampled_from(["ledger.lock", "ledger.json", "reasons", "cache"]),
                    st.sampled_from(["1", "999", "lots"]), ID_TEXT)
IDS = st.tuples(st.just("ids"), ID_TEXT, st.dictionaries(
    st.sampled_from(["numa-pin.io/cpus", "numa-pin.io/pod", "numa-pin.io/memory", "numa-pin.io/policy"]),
    ID_TEXT, max_size=3), st.one_of(st.none(), ID_TEXT))
CASES = st.one_of(FIFO, DEEP, SYMLINK, IDS)


class Hostile:
    """One fake node (``FakeNode``) and a place outside it for planted targets."""

    def __init__(self, node, config: Path, outside: Path) -> None:
        self.node = node
        self.root = Path(node.root)
        self.config = config
        self.outside = outside
        self.bundle = self.root / "bundle"
        self.bundle.mkdir(exist_ok=True)
        outside.mkdir(parents=True, exist_ok=True)
        self.victim = outside / "victim"
        self.victim_dir = outside / "victim-dir"
        self.victim_dir.mkdir(exist_ok=True)

    # ---- setting up one case ---------------------------------------------------------------
    def spec(self, annotations: dict | None = None, env: list[str] | None = None) -> None:
        doc: dict = {"annotations": annotations or {}}
        if env:
            doc["process"] = {"env": env}
        self._put(self.bundle / "config.json", json.dumps(doc))

    def state(self, cid: str = "hz", annotations: dict | None = None) -> bytes:
        doc = {"id": cid, "bundle": str(self.bundle), "pid": 4242, "annotations": annotations or {}}
        return json.dumps(doc).encode()

    @staticmethod
    def _put(path: Path, text: str) -> None:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            path.unlink()
        path.write_text(text)

    def cache_files(self) -> list[Path]:
        cache = Path(self.node.cache_dir)
        return sorted(cache.glob("topology-*.json")) if cache.is_dir() else []

    # ---- running one case ------------------------------------------------------------------
    def run(self, case: tuple, guard_factory, monkeypatch, capsys) -> tuple[int, str]:
        self.victim.write_text("precious\n")
        planted: list[Path] = []
        argv = ["--config", str(self.config), "prestart"]
        kind = case[0]
        stdin = self.state(case[-1] if kind != "ids" else "hz")
        self.spec({"numa-pin.io/cpus": "1"})
        with monkeypatch.context() as m:
            m.setenv("NUMA_PIN_CACHE_DIR", str(self.node.cache_dir))
            m.delenv("NUMA_PIN_DEBUG", raising=False)
            m.delenv("NUMA_PIN_CONFIG", raising=False)
            if kind == "fifo":
                argv, planted = self._fifo(case[1], argv, m)
            elif kind == "deep":
                argv, stdin = self._deep(case[1], case[2], case[3], argv, stdin)
            elif kind == "symlink":
                planted = self._symlink(case[1])
                self.spec({"numa-pin.io/cpus": case[2]})
            else:
                cid, annotations, pcidev = case[1], case[2], case[3]
                env = [f"PCIDEVICE_INTEL_COM_SRIOV={pcidev}"] if pcidev is not None else None
                self.spec(annotations, env)
                stdin = self.state(cid, annotations)
            guard = guard_factory(self.root)
            try:
                with monkeypatch.context() as g:
                    guard.install(g)
                    capsys.readouterr()
                    rc = _within(lambda: hook_main.run(argv, io.BytesIO(stdin)))
                    err = capsys.readouterr().err
                    release = _within(lambda: hook_main.run(["--config", str(self.config), "poststop"],
                                                            io.BytesIO(stdin)))
                    assert_clean(case, release, capsys.readouterr().err)
            finally:
                for path in planted:
                    if path.is_symlink() or path.exists():
                        if path.is_dir() and not path.is_symlink():
                            shutil.rmtree(path)
                        else:
                            path.unlink()
                self.restore_ledger()
        assert not guard.bad, f"{case!r} wrote outside the roots: {guard.bad}"
        assert self.victim.read_text() == "precious\n", case
        assert list(self.victim_dir.iterdir()) == [], case
        if kind == "deep" and case[3] > 64:
            assert rc != 0, case
        return rc, err

    def _fifo(self, where: str, argv: list[str], m) -> tuple[list[str], list[Path]]:
        if where == "config.json":
            path = self.bundle / "config.json"
            path.unlink()
        elif where in ("--config", "env"):
            path = self.root / "fifo-config.yaml"
            if where == "env":
                m.setenv("NUMA_PIN_CONFIG", str(path))
                argv = ["prestart"]
            else:
                argv = ["--config", str(path), "prestart"]
        elif where == "cache":
            files = self.cache_files()
            if not files:
                return argv, []
            path = files[0]
            path.unlink()
        else:
            path = Path(self.node.state_dir) / "ledger.json"
            saved = self.root / "ledger.saved"
            if path.exists():
                os.replace(path, saved)
            os.mkfifo(path)
            return argv, [path]  # the saved ledger is put back by _restore_ledger
        os.mkfifo(path)
        return argv, [path]

    def _deep(self, where: str, shape: str, depth: int, argv: list[str], stdin: bytes) -> tuple[list[str], bytes]:
        if where in ("state", "config.json"):
            opener, closer = ("[", "]") if shape == "list" else ('{"a":', "}")
            deep = opener * depth + "1" + closer * depth
            if where == "state":
                head = json.dumps({"id": "hz", "bundle": str(self.bundle), "pid": 4242})[:-1]
                return argv, f'{head}, "x": {deep}}}'.encode()
            self._put(self.bundle / "config.json", '{"annotations": {}, "x": ' + deep + "}")
            return argv, stdin
        path = self.root / "deep-config.yaml"  # refused either way: too deep, or an unknown key
        if where == "yaml-flow":
            opener, closer = ("[", "]") if shape == "list" else ("{a: ", "}")
            text = "bogus_key: " + opener * depth + "1" + closer * depth + "\n"
        else:
            depth = min(depth, 2_000)  # indentation grows quadratically
            text = "".join(" " * i + ("- " if shape == "list" else f"k{i}:") + "\n" for i in range(depth)) + "v\n"
        path.write_text(text)
        return ["--config", str(path), "prestart"], stdin

    def _symlink(self, which: str) -> list[Path]:
        state = Path(self.node.state_dir)
        state.mkdir(mode=0o700, exist_ok=True)
        if which == "reasons":
            path = state / "reasons"
            if path.exists() and not path.is_symlink():
                shutil.rmtree(path)
            target = self.victim_dir
        elif which == "cache":
            files = self.cache_files()
            if not files:
                return []
            path, target = files[0], self.victim
            path.unlink()
        else:
            path, target = state / which, self.victim
            if which == "ledger.json" and path.exists():
                os.replace(path, self.root / "ledger.saved")
            elif path.exists():
                path.unlink()
        path.symlink_to(target)
        return [path]

    def restore_ledger(self) -> None:
        saved = self.root / "ledger.saved"
        if saved.exists():
            os.replace(saved, Path(self.node.state_dir) / "ledger.json")


def _within(fn, seconds: float = LIMIT_S):
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed back below
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"the hook blocked for more than {seconds}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def assert_clean(case: tuple, rc: int, err: str) -> None:
    """The invariants of one case's report (see the module docstring)."""
    assert rc in (0, 1, 2, 3, 4), (case, rc, err)
    assert "Traceback" not in err and "internal error" not in err, (case, err)
    if rc:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("numa-pin: "), (case, err)
        assert not any(c in CONTROL for c in lines[0]), (case, err)
