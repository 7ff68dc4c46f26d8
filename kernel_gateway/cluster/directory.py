"""Which node gateways exist, where they answer, how full they are, and whether they live.

Every `--poll-interval` the directory resolves each target (`tasks.<service>` gives
one address per running node gateway) and asks every address for `/health`. A node
is known by the name its gateway reports (`--node-name`), never by its address: a
node gateway that restarts (a rolling update) comes back at a new address under the
same name, and its sessions follow it.

A node's state:

    up           its gateway answered the last poll
    unreachable  no answer since `last_seen` (a restart, a network blip, or a death)
    lost         no answer for `--node-lost-after`: presumed dead; its sessions get 410

A lost node that answers again is up again: the directory keeps no verdict longer
than the facts behind it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from kernel_gateway.cluster.settings import NodeTarget, RouterSettings

logger = logging.getLogger("kernel_gateway.cluster")

NodeStateName = Literal["up", "unreachable", "lost"]
# A node lost this long (a machine removed, or one that re-joined under a new id) is
# dropped: its sessions then answer 404 rather than 410.
FORGET_AFTER = 3600.0
NODE_STATES: tuple[NodeStateName, ...] = ("up", "unreachable", "lost")


@dataclass
class Node:
    """What the router knows of one node gateway."""

    name: str
    url: str
    last_seen: float
    health: dict[str, Any] = field(default_factory=dict)
    state: NodeStateName = "up"
    placed: int = 0
    """Sessions this router made (+) and deleted (-) here since the node last reported."""
    placed_before_poll: int = 0
    """`placed` when the current poll round began: what the node's answer accounts for."""
    creating: int = 0
    """Sessions this router has asked the node for and not yet heard back about."""
    stateless: int = 0
    """Stateless requests this router has running here now."""

    def seen(self, url: str, health: dict[str, Any], now: float) -> None:
        if self.state != "up":
            logger.info("node %s answers again at %s", self.name, url)
        self.url, self.health, self.last_seen, self.state = url, health, now, "up"
        # Placements made while the round was under way may be missing from its answer:
        # they stay counted until the next round.
        self.placed -= self.placed_before_poll
        self.placed_before_poll = 0

    def missed(self, now: float, lost_after: float) -> None:
        state: NodeStateName = "lost" if now - self.last_seen >= lost_after else "unreachable"
        if state != self.state:
            logger.warning(
                "node %s (%s): %s, no answer for %.1f s",
                self.name,
                self.url,
                state,
                now - self.last_seen,
            )
        self.state = state

    def _pool(self, key: str) -> int:
        pool = self.health.get("pool")
        value = pool.get(key, 0) if isinstance(pool, dict) else 0
        return value if isinstance(value, int) else 0

    @property
    def sessions(self) -> int:
        return self._pool("sessions") + self.placed + self.creating

    @property
    def max_sessions(self) -> int:
        return self._pool("max_sessions")

    @property
    def free_sessions(self) -> int:
        return max(0, self.max_sessions - self.sessions)

    @property
    def max_stateless(self) -> int:
        return self._pool("max_stateless")

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "state": self.state,
            "last_seen_seconds": round(now - self.last_seen, 3),
            "sessions": self.sessions,
            "max_sessions": self.max_sessions,
            "stateless": self._pool("stateless"),
            "max_stateless": self.max_stateless,
            "warm": self._pool("warm"),
            "backend": self.health.get("backend"),
            "instance": self.health.get("instance"),
        }


class ResolverFailed(Exception):
    """The name could not be looked up now (not: it has no address)."""


async def resolve(target: NodeTarget) -> list[str]:
    """Every address `target.host` has now: none when the name has none (no node gateway
    runs), ResolverFailed when the lookup itself failed (the resolver is down or slow)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return []
        raise ResolverFailed(f"{target.host}: {exc}") from exc
    except OSError as exc:
        raise ResolverFailed(f"{target.host}: {exc}") from exc
    addresses: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        host = str(sockaddr[0])
        url = f"http://[{host}]:{target.port}" if ":" in host else f"http://{host}:{target.port}"
        if url not in addresses:
            addresses.append(url)
    return addresses


class NodeDirectory:
    def __init__(
        self,
        settings: RouterSettings,
        http: httpx.AsyncClient,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._http = http
        self._clock = clock
        self.nodes: dict[str, Node] = {}
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.polls = 0
        self.started_at = clock()
        self._resolved: dict[NodeTarget, list[str]] = {}
        self.unnamed: set[str] = set()
        """Addresses whose gateway reports no node name (started without --node-name)."""

    # -- the poll loop -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="node-directory")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            started = self._clock()
            try:
                await self.poll()
            except Exception:  # never let one bad round stop the directory
                logger.exception("node poll failed")
            await asyncio.sleep(max(0.0, self.settings.poll_interval - (self._clock() - started)))

    async def _addresses(self) -> list[str]:
        """Every target's addresses now (the last ones found for a target whose lookup
        failed: a resolver hiccup must not look like every node dying), and every known
        node's last address (a node is found even while DNS lags behind)."""
        targets = self.settings.node_targets
        found = await asyncio.gather(*(resolve(t) for t in targets), return_exceptions=True)
        urls: list[str] = []
        for target, result in zip(targets, found, strict=True):
            if isinstance(result, ResolverFailed):
                logger.warning(
                    "cannot resolve %s (%s); using its last addresses", target.host, result
                )
                result = self._resolved.get(target, [])
            elif isinstance(result, BaseException):
                raise result
            self._resolved[target] = result
            urls += [u for u in result if u not in urls]
        return urls + [n.url for n in self.nodes.values() if n.url not in urls]

    async def poll(self) -> None:
        """One round: resolve every target, ask every address, update every node."""
        for known in self.nodes.values():
            known.placed_before_poll = known.placed
        urls = await self._addresses()
        answers = await asyncio.gather(*(self._health(url) for url in urls))
        now = self._clock()
        claims: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        unnamed: set[str] = set()
        for url, health in zip(urls, answers, strict=True):
            if health is None:
                continue
            name = health.get("node")
            if isinstance(name, str) and name:
                claims.setdefault(name, []).append((url, health))
            else:
                unnamed.add(url)
        for name, answering in claims.items():
            node = self.nodes.get(name)
            if node is None:
                logger.info("node %s found at %s", name, answering[0][0])
                node = self.nodes[name] = Node(name, answering[0][0], now)
            if len(answering) > 1:
                # Two gateways answer for one node: keep the address already in use.
                logger.warning("node %s answers at %s", name, ", ".join(u for u, _ in answering))
            url, health = next((a for a in answering if a[0] == node.url), answering[0])
            node.seen(url, health, now)
        for name, node in list(self.nodes.items()):
            if name not in claims:
                node.missed(now, self.settings.node_lost_after)
                if now - node.last_seen > FORGET_AFTER:
                    logger.info("node %s forgotten: no answer for %.0f s", name, FORGET_AFTER)
                    del self.nodes[name]
        if unnamed != self.unnamed and unnamed:
            logger.warning(
                "gateways at %s report no node name (start them with --node-name): not used",
                ", ".join(sorted(unnamed)),
            )
        self.unnamed = unnamed
        self.polls += 1
        async with self._changed:
            self._changed.notify_all()

    async def _health(self, url: str) -> dict[str, Any] | None:
        try:
            response = await self._http.get(
                # A dead node must not slow the round that notices it.
                f"{url}/health",
                timeout=min(self.settings.connect_timeout, 2 * self.settings.poll_interval),
            )
            document = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        if response.status_code != 200 or not isinstance(document, dict):
            return None
        return document

    # -- what requests ask ---------------------------------------------------------------------

    def up(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.state == "up"]

    def get(self, name: str) -> Node | None:
        return self.nodes.get(name)

    def young(self) -> bool:
        """Whether this router may not have met every node yet: it started less than
        `--node-lost-after` ago (a node restarting as the router started is not lost)."""
        return self._clock() - self.started_at < self.settings.node_lost_after

    async def next_poll(self, deadline: float) -> bool:
        """Wait for the next poll round to end; False if `deadline` passes first."""
        left = deadline - self._clock()
        if left <= 0:
            return False
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return False
        return True

    async def first_poll(self, wait: float) -> None:
        """Wait (up to `wait` seconds) for one round, so a fresh router knows its nodes."""
        if self.polls == 0:
            await self.next_poll(self._clock() + wait)

    def summary(self) -> dict[str, Any]:
        now = self._clock()
        nodes = sorted(self.nodes.values(), key=lambda n: n.name)
        up = [n for n in nodes if n.state == "up"]
        return {
            "status": "ok" if up and len(up) == len(nodes) else ("degraded" if up else "down"),
            "role": "router",
            "nodes": [n.to_json(now) for n in nodes],
            "capacity": {
                "nodes": len(nodes),
                "nodes_up": len(up),
                "sessions": sum(n.sessions for n in up),
                "max_sessions": sum(n.max_sessions for n in up),
                "max_stateless": sum(n.max_stateless for n in up),
            },
            **({"unnamed_gateways": sorted(self.unnamed)} if self.unnamed else {}),
        }
