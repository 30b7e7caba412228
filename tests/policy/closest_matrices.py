"""Real-world NUMA distance matrices (SLITs) for the prefer-closest tests (imported, not collected).

Each function returns the matrix as a tuple of rows (row = from, column = to) over nodes
``0..N-1``. The shapes follow what firmware of such machines reports: hierarchies of node,
socket and board; Sub-NUMA Clustering; AMD NPS4 (asymmetric, from the machine kit); 8-socket
glueless designs; 16- and 32-node glued designs whose chassis talk through node controllers;
and the kit's 64-node machine. :data:`MATRICES` maps a name to a matrix; :func:`perturbed` and
:func:`relabeled` derive variants that break twin structure or node order.
"""

from __future__ import annotations

import random

from numa_pin.testing.shapes import AMD_NPS4_DISTANCES, big_64node

Matrix = tuple[tuple[int, ...], ...]


def hierarchical(boards: int, sockets: int, nodes: int, levels: tuple[int, int, int, int]) -> Matrix:
    """``boards`` x ``sockets`` x ``nodes``: local, same socket, same board, other board."""
    local, socket, board, remote = levels
    n = boards * sockets * nodes
    per_board = sockets * nodes

    def d(a: int, b: int) -> int:
        if a == b:
            return local
        if a // nodes == b // nodes:
            return socket
        if a // per_board == b // per_board:
            return board
        return remote

    return tuple(tuple(d(a, b) for b in range(n)) for a in range(n))


def snc4_two_sockets() -> Matrix:
    """Two sockets, SNC4: the four clusters of a socket sit on a 2x2 mesh (11 to a neighbour,
    12 diagonally), 21 across sockets."""

    def d(a: int, b: int) -> int:
        if a == b:
            return 10
        if a // 4 != b // 4:
            return 21
        (ra, ca), (rb, cb) = divmod(a % 4, 2), divmod(b % 4, 2)
        return 11 if abs(ra - rb) + abs(ca - cb) == 1 else 12

    return tuple(tuple(d(a, b) for b in range(8)) for a in range(8))


def glueless_8_socket(nodes_per_socket: int = 1) -> Matrix:
    """Eight sockets wired glueless as a cube: 16 to a socket one link away, 22 two links away,
    28 three away; with ``nodes_per_socket`` 2 (SNC2) the two nodes of a socket are 11 apart."""
    n = 8 * nodes_per_socket

    def d(a: int, b: int) -> int:
        if a == b:
            return 10
        sa, sb = a // nodes_per_socket, b // nodes_per_socket
        if sa == sb:
            return 11
        return 10 + 6 * (sa ^ sb).bit_count()

    return tuple(tuple(d(a, b) for b in range(n)) for a in range(n))


def glued(chassis: int, sockets: int = 4, nodes_per_socket: int = 1) -> Matrix:
    """Glued design: chassis of ``sockets`` fully connected sockets (21), chassis on a ring of
    node controllers (31 to a neighbouring chassis, 41 further away); SNC2 inside a socket
    when ``nodes_per_socket`` is 2 (11)."""
    per_chassis = sockets * nodes_per_socket
    n = chassis * per_chassis

    def d(a: int, b: int) -> int:
        if a == b:
            return 10
        if a // nodes_per_socket == b // nodes_per_socket:
            return 11
        ca, cb = a // per_chassis, b // per_chassis
        if ca == cb:
            return 21
        hops = min((ca - cb) % chassis, (cb - ca) % chassis)
        return 31 if hops == 1 else 41

    return tuple(tuple(d(a, b) for b in range(n)) for a in range(n))


def kit_64() -> Matrix:
    return big_64node().distance_matrix()


#: name -> matrix; up to 8 nodes first (brute force through the reference), then larger ones
SMALL: dict[str, Matrix] = {
    "snc2-2s": hierarchical(1, 2, 2, (10, 11, 21, 21)),
    "node-socket-board": hierarchical(2, 2, 2, (10, 12, 20, 30)),
    "board-6": hierarchical(2, 3, 1, (10, 10, 16, 32)),
    "snc4-2s": snc4_two_sockets(),
    "amd-nps4": tuple(tuple(row) for row in AMD_NPS4_DISTANCES),
    "glueless-8s": glueless_8_socket(),
    "glued-8": glued(2),
}
LARGE: dict[str, Matrix] = {
    "node-socket-board-12": hierarchical(2, 2, 3, (10, 12, 20, 30)),
    "glueless-8s-snc2": glueless_8_socket(2),
    "glued-16": glued(4),
    "glued-32-snc2": glued(4, 4, 2),
    "glued-32": glued(8),
    "kit-64": kit_64(),
}
MATRICES = {**SMALL, **LARGE}


def perturbed(matrix: Matrix, seed: int) -> Matrix:
    """One off-diagonal entry nudged up by one: breaks the twin structure around it."""
    rng = random.Random(seed)
    n = len(matrix)
    if n < 2:
        return matrix
    a, b = rng.sample(range(n), 2)
    rows = [list(row) for row in matrix]
    rows[a][b] += 1
    return tuple(tuple(row) for row in rows)


def relabeled(matrix: Matrix, seed: int) -> Matrix:
    """The same machine with its nodes numbered in a random order."""
    rng = random.Random(seed)
    n = len(matrix)
    order = list(range(n))
    rng.shuffle(order)
    return tuple(tuple(matrix[order[a]][order[b]] for b in range(n)) for a in range(n))
