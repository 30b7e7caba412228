"""Split one grant's CPUs into N balanced shares, the way ``hwloc-distrib`` does (pure).

``numa-pin run --ranks N`` starts N processes inside one aligned grant and binds each to a
share. The shares follow hwloc's ``hwloc_distrib()``: walk the machine's tree from the top
(package, die, NUMA node, L3, cluster, core, thread), restricted to the granted CPUs; at each
level give every child a number of shares proportional to how many granted CPUs it holds,
rounding so the running total is the ceiling of the exact proportion; a child that gets one
share (or is a single CPU) takes all its CPUs for it; a child that gets none merges its CPUs
into the previous share, so no granted CPU is left out. Levels with one child change nothing,
so the result only depends on where the tree really branches.

The tree is built from each CPU's keys, coarsest first: a level is the partition of the CPUs by
one key (socket, die, NUMA node, L3 id, cluster, core), ordered by how large its groups are
(hwloc nests objects by their CPU sets, the larger outside); children are ordered by their
lowest CPU number, as hwloc orders them by their first CPU. A core is its thread siblings, as
hwloc's Core objects are (not ``core_id``, which some kernels give each thread of an AMD
compute unit). Above the nodes sit the groups hwloc makes from the SLIT
(``hwloc__groups_by_distances``, exact distances): nodes joined by the smallest distance
between two different nodes, transitively, form a group (a node joined to none stays alone);
unless that puts every node in one group, the groups' average distances are grouped again,
each round one more level. A matrix of two nodes or fewer, asymmetric, or with a distance to
another node not larger than to itself gives no groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from numa_pin.topology.model import Cpu, Topology

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    Key = Callable[[Cpu], object]

_KEYS: tuple[Key, ...] = (
    lambda c: c.socket,
    lambda c: (c.socket, c.die),
    lambda c: c.numa,
    lambda c: (c.socket, c.l3),
    lambda c: (c.socket, c.die, c.cluster),
    lambda c: c.siblings,
)


def _levels(topology: Topology, cpus: Sequence[Cpu]) -> list[Key]:
    """The keys that split ``cpus``, from the coarsest partition (fewest groups) to the finest."""
    keys = [_group_key(groups) for groups in distance_groups(topology)] + list(_KEYS)
    counted = []
    for index, key in enumerate(keys):
        groups = len({key(c) for c in cpus})
        counted.append((groups, index, key))
    counted.sort(key=lambda t: (t[0], t[1]))
    return [key for _, _, key in counted]


def _group_key(groups: dict[int, int]) -> Key:
    """A CPU's group at one distance level: its node's group, else its node alone."""
    return lambda c: ("group", groups[c.numa]) if c.numa in groups else ("node", c.numa)


def distance_groups(topology: Topology) -> list[dict[int, int]]:
    """hwloc's groups of NUMA nodes by SLIT distance, innermost level first: each level maps a
    grouped node to its group's number (a node in no group of that level is left out)."""
    members: list[list[int]] = [[n] for n in topology.node_ids]
    values = [[topology.distance(a, b) for b in topology.node_ids] for a in topology.node_ids]
    if not _groupable(values):
        return []
    out: list[dict[int, int]] = []
    while len(members) > 2:
        ids = _min_distance_groups(values)
        count = max(ids, default=0)
        if not count or (count == 1 and all(ids)):
            break
        joined = [[i for i, g in enumerate(ids) if g == k] for k in range(1, count + 1)]
        out.append({n: k for k, objs in enumerate(joined) for i in objs for n in members[i]})
        values = [[sum(values[i][j] for i in a for j in b) // (len(a) * len(b)) for b in joined] for a in joined]
        members = [[n for i in objs for n in members[i]] for objs in joined]
    return out


def _groupable(values: list[list[int]]) -> bool:
    """hwloc's check of the first matrix: symmetric, and each node nearer to itself than to any other."""
    size = len(values)
    return all(values[i][j] == values[j][i] and values[i][j] > values[i][i]
               for i in range(size) for j in range(i + 1, size))


def _min_distance_groups(values: list[list[int]]) -> list[int]:
    """Group ids (1, 2, ...; 0: alone) of the objects joined, transitively, by the smallest
    distance between two different objects."""
    size = len(values)
    least = min((values[i][j] for i in range(size) for j in range(size) if i != j), default=None)
    ids = [0] * size
    if least is None:
        return ids
    next_id = 1
    for start in range(size):
        if ids[start]:
            continue
        ids[start], todo, found = next_id, [start], 1
        while todo:
            j = todo.pop()
            for k in range(size):
                if not ids[k] and values[j][k] == least:
                    ids[k] = next_id
                    todo.append(k)
                    found += 1
        if found == 1:
            ids[start] = 0
        else:
            next_id += 1
    return ids


def _children(cpus: Sequence[Cpu], levels: Sequence[Key]) -> tuple[list[list[Cpu]], Sequence[Key]]:
    """The first level that splits ``cpus`` into several groups (each sorted by CPU id), and the
    levels left below it; a single CPU (or CPUs no key tells apart) has no children."""
    for depth, key in enumerate(levels):
        groups: dict[object, list[Cpu]] = {}
        for cpu in cpus:
            groups.setdefault(key(cpu), []).append(cpu)
        if len(groups) > 1:
            return sorted(groups.values(), key=lambda g: min(c.id for c in g)), levels[depth + 1:]
    if len(cpus) > 1:  # threads of one core: each its own child (hwloc's PUs)
        return [[c] for c in sorted(cpus, key=lambda c: c.id)], ()
    return [], ()


def _distrib(roots: Sequence[Sequence[Cpu]], n: int, levels: Sequence[Key], out: list[set[int]]) -> None:
    total = sum(len(r) for r in roots)
    given_weight = 0
    for root in roots:
        weight = len(root)
        chunk = ((given_weight + weight) * n + total - 1) // total - (given_weight * n + total - 1) // total
        ids = {c.id for c in root}
        children, below = _children(root, levels)
        if not children or chunk <= 1:
            if chunk:
                out.extend(set(ids) for _ in range(chunk))
            else:  # no share of its own: join the previous one (the first root always gets one)
                out[-1] |= ids
        else:
            _distrib(children, chunk, below, out)
        given_weight += weight


def distribute(topology: Topology, cpus: frozenset[int], n: int) -> list[frozenset[int]]:
    """``n`` shares of ``cpus`` (online CPUs of ``topology``), in order, as ``hwloc-distrib n``
    restricted to ``cpus`` prints them. More shares than CPUs means shares repeat CPUs.

    Raises:
        ValueError: ``n`` is not positive, or ``cpus`` is empty or names a CPU the topology lacks.
    """
    if n < 1:
        raise ValueError(f"the number of shares must be positive, got {n}")
    missing = sorted(c for c in cpus if c not in topology.cpus)
    if missing:
        raise ValueError(f"CPUs {missing} are not online")
    if not cpus:
        raise ValueError("no CPUs to share")
    chosen = [topology.cpus[c] for c in sorted(cpus)]
    out: list[set[int]] = []
    _distrib([chosen], n, _levels(topology, chosen), out)
    return [frozenset(s) for s in out]


__all__ = ["distance_groups", "distribute"]
