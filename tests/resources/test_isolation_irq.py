"""Knob 2 of issue 24: IRQs off exclusive CPUs (``irq-load-balancing.crio.io``), on a fake ``/proc/irq``.

The oracle for the affinities is the annotation's meaning, computed here from the grant's CPUs
and the kit's sysfs (``thread_siblings_list`` of the first CPU, read from the files, not from
numa-pin's topology): ``disable`` takes every CPU of the grant out of every movable IRQ's
affinity, ``housekeeping`` all but the first core's. Every test fails without the knob: nothing
else writes ``/proc/irq``.
"""

from __future__ import annotations

import errno
import json

import pytest
from isolation_fakes import FakeIrqbalance, affinities, make_irqs

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.cli.main import main as cli_main
from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer import cgroups as cg
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError, RequestError
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import irq as irq_node
from numa_pin.resources.node import journal
from numa_pin.resources.node.base import NodeResource
from numa_pin.resources.node.registry import register, unregister
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

ALL = "0-31"
#: IRQ 7 is bound to CPU 5 alone (a driver's choice): when CPU 5 is banned it goes to every
#: CPU that is not; IRQ 9 to CPUs 0-7
IRQS = {0: ALL, 1: ALL, 4: ALL, 7: "5", 9: "0-7", 24: ALL}
DEFAULT_MASK = "ffffffff"


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    return tmp_path_factory.mktemp("machines")


@pytest.fixture
def node(tmp_path, machines):
    n = FakeNode(tmp_path / "n", "intel-2s-ht", machines=machines)
    make_irqs(n.proc_root, IRQS, DEFAULT_MASK)
    return n


def service(node):
    return NodeService(config_from_dict(node.config_dict()))


def ask(cid, cpus=2, irq="disable", name="irq-load-balancing.crio.io", extra=None):
    ann = {"numa-pin.io/cpus": str(cpus), **({name: irq} if irq else {}), **(extra or {})}
    return request_from_oci(cid, ann)


def siblings(node, cpu):
    path = node.sysfs_root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list"
    return parse_list(path.read_text())


def expected(node, banned):
    """What every IRQ should say once ``banned`` is kept free (the annotation's meaning)."""
    every = frozenset(range(32))
    out = {}
    for irq, cpus in IRQS.items():
        kept = parse_list(cpus) - banned
        out[str(irq)] = format_list(kept or every - banned)
    mask = sum(1 << c for c in every - banned)
    out["default"] = f"{mask:08x}"
    return out


@pytest.mark.parametrize(
    ("mode", "name"),
    [
        pytest.param("disable", "irq-load-balancing.crio.io", id="crio-disable"),
        pytest.param("disable", "numa-pin.io/irq-load-balancing", id="numa-pin-disable"),
        pytest.param("housekeeping", "irq-load-balancing.crio.io", id="crio-housekeeping"),
    ],
)
def test_irqs_leave_the_grant_and_come_back_on_release(node, mode, name):
    before = affinities(node.proc_root)
    svc = service(node)
    grant = svc.admit(ask("c", cpus=4, irq=mode, name=name), node.add_container("c", 41001)).grant
    first_core = siblings(node, min(grant.cpus)) & grant.cpus
    banned = grant.cpus if mode == "disable" else grant.cpus - first_core
    assert banned and (mode == "disable" or first_core), "the grant holds whole cores"
    assert affinities(node.proc_root) == expected(node, banned)
    assert svc.describe_grant(grant)[-1:] == [f"irq={mode}"]
    assert svc.release("c") == grant
    assert affinities(node.proc_root) == before, "every IRQ has its own affinity back"
    assert not (node.state_dir / journal.FILE).exists(), "the journal forgets the baselines"


def test_two_grants_never_fight_over_an_irq(node):
    """A's release takes only A's CPUs back: B's stay banned (the union is recomputed)."""
    svc = service(node)
    a = svc.admit(ask("a", cpus=2), node.add_container("a", 41001)).grant
    b = svc.admit(ask("b", cpus=2), node.add_container("b", 41002)).grant
    assert affinities(node.proc_root) == expected(node, a.cpus | b.cpus)
    svc.release("a")
    assert affinities(node.proc_root) == expected(node, b.cpus)
    svc.release("b")
    assert affinities(node.proc_root) == expected(node, frozenset())


def test_a_container_that_asks_nothing_moves_no_irq(node):
    before = affinities(node.proc_root)
    service(node).admit(ask("c", cpus=2, irq=None), node.add_container("c", 41001))
    assert affinities(node.proc_root) == before
    assert not (node.state_dir / journal.FILE).exists()


def test_a_shared_container_that_asks_is_refused_with_one_line(node):
    with pytest.raises(RequestError, match="irq-load-balancing.crio.io") as err:
        service(node).admit(ask("c", cpus=0), node.add_container("c", 41001))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("refusal", [errno.EIO, errno.EPERM], ids=["linux-6.1-eio", "linux-6.12-eperm"])
def test_irqs_the_kernel_will_not_move_are_listed_not_failures(node, monkeypatch, capsys, refusal):
    write = irq_node._write

    def kernel(path, text):
        if "/irq/4/" in path or "/irq/9/" in path:
            raise OSError(refusal if "/4/" in path else errno.EINVAL, "refused")
        write(path, text)

    monkeypatch.setattr(irq_node, "_write", kernel)
    svc = service(node)
    grant = svc.admit(ask("c", cpus=2), node.add_container("c", 41001)).grant
    now = affinities(node.proc_root)
    assert now["4"] == ALL and now["9"] == "0-7", "left as they were"
    assert now["0"] == expected(node, grant.cpus)["0"]
    assert sorted(irq_node.unmovable(svc)) == ["4", "9"]
    assert svc.describe(svc.ledger.read())["irq"]["unmovable"] == ["4", "9"]
    assert cli_main(["explain", "c", "--json", "--config", str(node.write_config())]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["irq"] == "disable"
    assert shown["irq_unmovable"] == {"4": "refused", "9": "refused"}, "explain lists them, with the kernel's word"


class Jam(NodeResource):
    """Fails after the IRQ knob, noting what the IRQs said when it ran."""

    name = "example.com/jam"
    seen: dict[str, str] | None = None

    def enforce(self, node, admission, decided):
        self.seen = affinities(node.fake.proc_root)
        raise EnforcementError("the jam refuses")


def test_a_later_failure_rolls_the_irqs_back(node, monkeypatch):
    before = affinities(node.proc_root)
    monkeypatch.setattr(NodeService, "fake", node, raising=False)
    jam = Jam()
    register(jam)
    try:
        with pytest.raises(EnforcementError, match="the jam refuses"):
            service(node).admit(ask("c"), node.add_container("c", 41001))
    finally:
        unregister(jam)
    assert jam.seen is not None and jam.seen != before, "the IRQs had moved when the later step failed"
    assert affinities(node.proc_root) == before
    assert not (node.state_dir / journal.FILE).exists(), "the journal was rolled back too"


def test_reconcile_reasserts_an_affinity_an_outside_writer_changed(node):
    svc = service(node)
    grant = svc.admit(ask("c"), node.add_container("c", 41001)).grant
    (node.proc_root / "irq" / "1" / "smp_affinity_list").write_text(ALL + "\n")  # irqbalance-like drift
    assert svc.reconcile() == ([], ["c"])
    assert affinities(node.proc_root) == expected(node, grant.cpus)
    assert svc.reconcile() == ([], []), "nothing drifted the second time"


def test_reconcile_puts_the_baselines_back_after_a_crash(node):
    """A hook that died between its IRQ writes and its commit: the journal has the baselines,
    the ledger no grant that asks; reconcile restores every IRQ and forgets the journal."""
    before = affinities(node.proc_root)
    svc = service(node)
    req = ask("c")
    decision = svc.plan(req)
    from numa_pin.resources.base import grant_from

    grant = grant_from(req, decision, pid=None, start_time=None, cgroup=None, kind=None, created=0.0)
    irq_node.apply(svc, svc.ledger.read().with_grant(grant), UndoLog())  # written, never committed
    assert affinities(node.proc_root) != before
    svc.reconcile()
    assert affinities(node.proc_root) == before
    assert not (node.state_dir / journal.FILE).exists()


def test_a_journal_of_an_earlier_boot_is_not_restored(node):
    boot = node.proc_root / "sys" / "kernel" / "random"
    boot.mkdir(parents=True)
    (boot / "boot_id").write_text("this-boot\n")
    svc = service(node)
    node.state_dir.mkdir(parents=True, exist_ok=True)
    (node.state_dir / journal.FILE).write_text(json.dumps({"boot_id": "another-boot", "irq": {"base": {"0": "3"}}}))
    (node.state_dir / journal.FILE).chmod(0o600)
    before = affinities(node.proc_root)
    svc.reconcile()
    assert affinities(node.proc_root) == before


# ---- irqbalance ---------------------------------------------------------------------------
@pytest.fixture
def irqbalance_factory(node):
    made = []

    def make(**kw):
        fake = FakeIrqbalance(node.proc_root, 777, **kw)
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.stop()


def test_irqbalance_is_told_through_its_socket_and_handed_back(node, irqbalance_factory):
    balancer = irqbalance_factory(banned=frozenset({0}))
    svc = service(node)
    grant = svc.admit(ask("c"), node.add_container("c", 41001)).grant
    assert balancer.settings() == [f"settings cpus {format_list(grant.cpus | {0})}"], "its own ban kept"
    svc.release("c")
    assert balancer.settings()[-1] == "settings cpus NULL", "back to its own rules"
    assert balancer.refused == 0, "numa-pin sent root's credentials"


def test_irqbalance_whose_environment_bans_the_cpus_needs_nothing(node, irqbalance_factory):
    balancer = irqbalance_factory(env={"IRQBALANCE_BANNED_CPULIST": "1-31"}, socket_=False)
    svc = service(node)
    grant = svc.admit(ask("c"), node.add_container("c", 41001)).grant
    assert affinities(node.proc_root) == expected(node, grant.cpus)
    assert balancer.commands == []


def test_irqbalance_that_cannot_be_told_rejects_before_any_write(node, irqbalance_factory, monkeypatch):
    irqbalance_factory(env={"IRQBALANCE_BANNED_CPULIST": "31"}, socket_=False)
    before = affinities(node.proc_root)
    svc = service(node)
    pid = node.add_container("c", 41001)
    cpuset = node.cpuset("c")
    writes = []
    monkeypatch.setattr(cg, "write_cgroup_file", lambda path, text: writes.append(path))
    with pytest.raises(EnforcementError, match="irqbalance \\(pid 777\\) runs") as err:
        svc.admit(ask("c"), pid)
    assert writes == [], "refused before the CPU resource wrote the cpuset"
    assert "\n" not in str(err.value)
    assert affinities(node.proc_root) == before
    assert node.cpuset("c") == cpuset, "the CPU resource's write was rolled back too"
    assert svc.ledger.read().grants == {}
