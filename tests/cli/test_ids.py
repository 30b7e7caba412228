"""Container ids on the command line: unique prefixes as git and podman take them, short ids in
``status`` that ``explain`` and ``release`` accept, ``explain --last``, a release of nothing fails."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.cli.common import resolve_id, short_ids
from numa_pin.cli.main import main as cli_main
from numa_pin.errors import RequestError
from numa_pin.ledger.model import Grant
from numa_pin.ledger.store import Ledger
from numa_pin.reporting.report import reason_path, write_reason
from numa_pin.testing.node import FakeNode

A = "a3f1c2" + "0" * 58  # 64-character runtime ids
B = A[:13] + "9" * 51  # shares 13 characters with A
C = "7b00d1" + "2" * 58


@pytest.mark.parametrize(
    "query, expected",
    [(A, A), (A[:14], A), ("7", C), ("job", "job"), ("job-", "job-2"), ("zz", None)],
    ids=["exact", "unique-prefix-of-14", "one-char", "exact-beats-prefix", "prefix-of-longer", "none"],
)
def test_resolve_id(query, expected):
    assert resolve_id(query, {A, B, C, "job", "job-2"}) == expected


def test_ambiguous_prefix_lists_the_candidates():
    with pytest.raises(RequestError) as err:
        resolve_id("a3f1c", {A, B, C})
    assert str(err.value) == f"ID: 'a3f1c' is a prefix of 2 ids: {A}, {B}; give more of the id"


def test_empty_id_names_nothing():
    with pytest.raises(RequestError, match="an empty id names nothing"):
        resolve_id("", {A})


@given(st.sets(st.text(alphabet="ab0-", min_size=1, max_size=20), min_size=1, max_size=12))
def test_short_ids_resolve_back(ids):
    short = short_ids(ids)
    for cid, s in short.items():
        assert cid.startswith(s) and len(s) >= min(12, len(cid))
        assert resolve_id(s, ids) == cid


@pytest.fixture
def node(tmp_path):
    fake = FakeNode(tmp_path, "laptop", parent="")
    config = fake.write_config(tmp_path / "config.yaml", settled=False, policy="restricted")
    with Ledger(str(fake.state_dir)).transaction() as txn:
        for n, cid in enumerate((A, B)):  # each grant's cgroup exists, so garbage collection keeps it
            fake.add_container(cid, 900 + n)
            txn.state = txn.state.with_grant(Grant(cid, cid, cid, "shared", cgroup="/" + cid))
    write_reason(str(fake.state_dir), C, f"numa-pin: rejected {C}: TopologyAffinityError: older")
    os.utime(reason_path(str(fake.state_dir), C), (time.time() - 60,) * 2)
    write_reason(str(fake.state_dir), "d4" * 32, f"numa-pin: rejected {'d4' * 32}: AllocationError: newest")
    return str(config), fake.state_dir


def test_status_prints_ids_explain_accepts(node, capsys):
    config, _ = node
    assert cli_main(["status", "--config", config]) == 0
    out = capsys.readouterr().out
    assert f"  {A[:14]} shared" in out and f"  {B[:14]} shared" in out, out  # 12 or 13 characters are ambiguous
    assert cli_main(["explain", A[:14], "--config", config]) == 0
    assert f'"container_id": "{A}"' in capsys.readouterr().out


def test_explain_by_prefix_and_last(node, capsys):
    config, _ = node
    assert cli_main(["explain", "7b0", "--config", config]) == 0
    assert capsys.readouterr().out == f"numa-pin: rejected {C}: TopologyAffinityError: older\n"
    assert cli_main(["explain", "--last", "--config", config]) == 0
    assert capsys.readouterr().out.endswith("AllocationError: newest\n")
    assert cli_main(["explain", "a3f1c", "--config", config]) == 2
    assert "is a prefix of 2 ids" in capsys.readouterr().err


def test_release_by_truncated_id_and_of_nothing(node, capsys):
    config, state_dir = node
    shutil.rmtree(Path(state_dir).parent / "cgroup" / "cpuset" / A)  # A stopped (a live one needs --force)
    assert cli_main(["release", A[:24], "--config", config]) == 0
    assert capsys.readouterr().out == f"{A}: released\n"
    assert cli_main(["release", A[:24], "--config", config]) == 1
    assert f"no grant matches '{A[:24]}'" in capsys.readouterr().err
    assert set(Ledger(str(state_dir)).read().grants) == {B}


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--cpus", "abc"],
         "numa-pin: RequestError: --cpus: 'abc' is not a valid quantity (a whole number, e.g. 2, 16)"),
        (["--memory", "1Gb"], "numa-pin: RequestError: --memory: '1Gb' is not a valid quantity (e.g. 512Mi, 2Gi"),
        (["--hugepages-2Mi", "3Mi"], "numa-pin: RequestError: --hugepages-2Mi: '3Mi' is not a whole number of 2Mi"),
        (["--devices", "gpu"], "numa-pin: RequestError: --devices: expected resource=count, got 'gpu'"),
    ],
    ids=["cpus", "memory", "hugepages", "devices"],
)
def test_flag_errors_name_the_flag(flags, line, capsys):
    assert cli_main(["plan", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and "numa-pin.io/" not in err, err
