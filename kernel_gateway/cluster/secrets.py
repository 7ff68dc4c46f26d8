"""Secrets through the router: kept by every node, each sealing them with its own
`--secrets-key-file` (docs/secrets.md).

A write (a new secret, a rotation, a delete; ours at `/secrets`, E2B's at `/e2b/secrets`)
goes to every node that is up, so a session placed on any node finds the secrets it names;
a node that lacks one (it joined later) is left out of a rotation or a delete, as a
template's node is. A secret's id is the same on every node (made from its owner and
name), so E2B's calls by id reach it everywhere. Reads go to one node: they hold the same
secrets. The answer to a write is the nodes' agreed one, or 502 naming each node's status
when they disagree (`templates.agreed`).
"""

from __future__ import annotations

from starlette.routing import Route

from kernel_gateway.cluster.e2b_templates import to_every_node
from kernel_gateway.cluster.routes import any_node, e2b_answers
from kernel_gateway.cluster.templates import every_node

ROUTES = [
    Route("/secrets", every_node, methods=["POST"]),
    Route("/secrets", any_node, methods=["GET"]),
    Route("/secrets/{name}", to_every_node, methods=["PUT", "DELETE"]),
    Route("/secrets/{name}", any_node, methods=["GET"]),
]
E2B_ROUTES = [
    Route("/e2b/secrets", e2b_answers(every_node), methods=["POST"]),
    Route("/e2b/secrets", e2b_answers(any_node), methods=["GET"]),
    Route("/e2b/secrets/{id}", e2b_answers(to_every_node), methods=["POST", "DELETE"]),
    Route("/e2b/secrets/{id}", e2b_answers(any_node), methods=["GET"]),
]
