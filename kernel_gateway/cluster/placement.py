"""Which node takes new work: the order in which nodes are tried.

Sessions go to the node with the most free session slots (its last `/health` count
plus what this router placed there since), so a burst spreads over the cluster even
between polls. Stateless requests go to the node with the smallest share of its
`--max-stateless` in use by this router. Ties are broken at random so that several
routers do not all pick the same node. A node that refuses (full, draining) or cannot
be reached is skipped and the next one tried; only when every node refuses is the
client told the cluster is full.
"""

from __future__ import annotations

import random

from kernel_gateway.cluster.directory import Node


def for_session(nodes: list[Node], rng: random.Random | None = None) -> list[Node]:
    """Up nodes, the one with the most free slots first. Nodes that look full come
    last, not never: counts are as of the last poll, and a node itself says 429."""
    rng = rng or random.Random()
    up = [n for n in nodes if n.state == "up"]
    rng.shuffle(up)
    return sorted(up, key=lambda n: -n.free_sessions)


def for_stateless(nodes: list[Node], rng: random.Random | None = None) -> list[Node]:
    """Up nodes, the least busy first (this router's running share of each one's limit)."""
    rng = rng or random.Random()
    up = [n for n in nodes if n.state == "up" and n.max_stateless > 0]
    rng.shuffle(up)
    return sorted(up, key=lambda n: n.stateless / n.max_stateless)
