"""Cluster mode: a routing tier in front of one gateway per machine.

    client ─▶ router (any replica) ─▶ the node gateway that holds the session ─▶ kernels

Node gateways are ordinary `kernel-gateway serve` processes, one per machine, each
driving its own Docker engine, started with `--node-name` so that the ids of their
sessions say where they live (`<node>.<hex>`). Routers (`kernel-gateway route`) keep
no state of their own: they find node gateways by DNS (`tasks.<service>` on Docker
Swarm), poll each one's `/health` for its name and free capacity, place new sessions
and stateless requests on the node with the most room, and pass every later request
to the node named in the session id, streams included.

    settings.py   the router's settings, read once
    directory.py  which nodes exist, their addresses, capacity and state (up, unreachable, lost)
    placement.py  which node takes a new session or stateless request
    proxy.py      one request passed to a node and its answer streamed back
    routes.py     the router's endpoints
    app.py        the ASGI app and its lifespan
    metrics.py    the router's Prometheus metrics
"""
