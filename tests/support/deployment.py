"""deploy/stack.yml deployed on a test swarm, and what tests and the bench ask of it.

The stack file is the one users deploy; only its variables change: node-private paths
for the engine socket and the runtime dir (every node of the test swarm shares one
filesystem, so each node's folder is `Swarm.NODE_ROOT` in its own mount namespace),
small limits, and a published port.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .swarm import Node, Swarm

ROOT = Path(__file__).resolve().parents[2]
STACK_FILE = ROOT / "deploy" / "stack.yml"
STACK = "kg"
NODE_SERVICE = f"{STACK}_node"
ROUTER_SERVICE = f"{STACK}_router"
OVERLAY = f"{STACK}_kg"
KERNEL_LABEL = "io.kernel-gateway.managed"


@dataclass
class Deployment:
    swarm: Swarm
    token: str
    port: int

    def url(self, node: Node) -> str:
        """The router published on `node`."""
        return f"http://{node.address}:{self.port}"

    @property
    def urls(self) -> list[str]:
        return [self.url(n) for n in self.swarm.nodes]

    def client(self, node: Node, timeout: float = 60) -> httpx.Client:
        return httpx.Client(
            base_url=self.url(node),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=timeout,
        )

    def health(self, node: Node) -> dict[str, Any]:
        document: dict[str, Any] = httpx.get(self.url(node) + "/health", timeout=5).json()
        return document

    def node_names(self) -> dict[str, str]:
        """Swarm node id (the gateways' --node-name) -> test node name."""
        return {n.node_id: n.name for n in self.swarm.nodes}

    def wait_ready(self, nodes: list[Node] | None = None, timeout: float = 240) -> None:
        """Until the router on each of `nodes` sees every live node gateway up."""
        nodes = nodes or self.swarm.nodes
        expected = {n.node_id for n in nodes}
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                ready = True
                for node in nodes:
                    last = self.health(node)
                    up = {n["name"] for n in last.get("nodes", []) if n["state"] == "up"}
                    ready = ready and expected <= up
            except (httpx.HTTPError, ValueError) as exc:
                ready, last = False, repr(exc)
            if ready:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster did not come up: {last}")
            time.sleep(1)

    def containers(self, node: Node, service: str) -> list[str]:
        """Ids of the running containers of a stack service on one node."""
        out = self.swarm.cli(
            node, "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={service}"
        ).stdout
        return out.split()

    def kernels(self, node: Node) -> list[dict[str, Any]]:
        """`docker inspect` of every kernel container (sessions, pool, fork servers) on a node."""
        ids = stack_kernels(self.swarm, node)
        if not ids:
            return []
        found: list[dict[str, Any]] = json.loads(self.swarm.cli(node, "inspect", *ids).stdout)
        return found


def stack_kernels(swarm: Swarm, node: Node, *, stopped: bool = False) -> list[str]:
    """Ids of the kernel containers (sessions, pools, fork servers) of the stack's node
    gateway on `node` (with `stopped`, those that ended too): their instance locks are in
    its runtime dir. The manager is this machine's engine, where other gateways (other
    tests, run beside these) have kernels too."""
    runtime_dir = f"{swarm.NODE_ROOT}/kernel-gateway/"
    listed = swarm.cli(
        node, "ps", *(["-a"] if stopped else []), "--filter", f"label={KERNEL_LABEL}",
        "--format", '{{.ID}} {{.Label "io.kernel-gateway.lock"}}',
    ).stdout.splitlines()  # fmt: skip
    return [
        line.split(" ", 1)[0] for line in listed if line.partition(" ")[2].startswith(runtime_dir)
    ]


def deploy(
    swarm: Swarm, *, port: int = 18888, max_sessions: int = 3, pool_size: int = 1
) -> Deployment:
    token = secrets.token_hex(16)
    manager = swarm.manager
    subprocess.run(
        ["docker", "-H", manager.docker_host, "secret", "create", "kg_token", "-"],
        input=token,
        text=True,
        check=True,
        capture_output=True,
    )
    runtime_dir = f"{swarm.NODE_ROOT}/kernel-gateway"
    for node in swarm.nodes:
        swarm.node_shell(node, f"mkdir -p {runtime_dir} && chmod 700 {runtime_dir}")
    env = {
        **os.environ,
        "KG_DOCKER_SOCKET": f"{swarm.NODE_ROOT}/docker.sock",
        "KG_RUNTIME_DIR": runtime_dir,
        "KG_MAX_SESSIONS": str(max_sessions),
        "KG_POOL_SIZE": str(pool_size),
        "KG_FORK_SERVERS": "1",
        "KG_DRAIN_TIMEOUT": "5",
        "KG_PORT": str(port),
    }
    subprocess.run(
        ["docker", "-H", manager.docker_host, "stack", "deploy", "-c", str(STACK_FILE), STACK],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    deployment = Deployment(swarm, token, port)
    deployment.wait_ready()
    return deployment


def remove(deployment: Deployment) -> None:
    """The stack, its secret, and the kernels persisted sessions left on every live node."""
    swarm = deployment.swarm
    manager = swarm.manager
    swarm.cli(manager, "stack", "rm", STACK, check=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = swarm.cli(manager, "ps", "-aq", "--filter", "label=com.docker.stack.namespace=kg")
        if not left.stdout.split():
            break
        time.sleep(0.5)
    swarm.cli(manager, "secret", "rm", "kg_token", check=False)
    for node in swarm.nodes:
        try:
            ids = stack_kernels(swarm, node, stopped=True)
        except subprocess.SubprocessError:
            continue  # a node the tests killed
        if ids:
            swarm.cli(node, "rm", "-f", *ids, check=False)
        swarm.node_shell(node, f"rm -rf {swarm.NODE_ROOT}/kernel-gateway", check=False)
    swarm.cli(manager, "network", "rm", OVERLAY, check=False)
