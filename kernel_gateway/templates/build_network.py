"""A template build's way to the network: through the egress proxy, to the operator's
`--build-egress-allow`, or nowhere.

A build's RUN containers have no network (`network_mode: none`), like kernels. With
`--build-egress-allow` set, a build gets what a session with a network policy gets: an
entry in the proxy's policy (its own user and secret, the operator's patterns), a relay
that speaks for it alone, and in each RUN step the forwarder on the container's
`127.0.0.1:3128` (`in_kernel/egress_forward.py`) with the proxy variables pointing at it.
The forwarder and the relay's socket are in a folder of the gateway's bound read-only at
`/conn` (a folder every kernel image has, so nothing of it is committed); the variables
are exported by the step's shell, not set on the container (a container's settings are
committed with it). So `pip install`, `apt-get` (it reads `http_proxy`), `curl` and `git`
reach the allowed hosts, and nothing else leaves the container.

Each connection is logged in the build's log when it is refused or fails, naming the host
and the reason, so a step that fails on the network says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shlex
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kernel_gateway.kernels.backends.base import in_kernel_source
from kernel_gateway.kernels.egress.forwarder import PORT, proxy_environment
from kernel_gateway.kernels.egress.relay import Decision, Relay

if TYPE_CHECKING:  # the proxy's module loads the Docker SDK
    from kernel_gateway.kernels.egress.proxy import EgressProxy

logger = logging.getLogger(__name__)

INSIDE = "/conn"
"""Where a RUN container sees the folder (every kernel image has `/conn`, empty)."""
FORWARDER = "egress_forward.py"
SOCKET = "egress.sock"
READY = "/dev/shm/.kg-egress-ready"
"""The forwarder's ready file: in the container's `/dev/shm`, a tmpfs never committed."""
READY_TRIES = 200
"""Checks, 50 ms apart, for the forwarder to listen before the step's command runs."""


@dataclass(frozen=True)
class BuildEgress:
    """One build's way out, open: the host folder to bind, and how a step uses it."""

    folder: Path
    allow: tuple[str, ...]
    """The domain patterns it reaches (part of a RUN step's cache key)."""

    @property
    def mounts(self) -> dict[str, str]:
        """The folder to bind read-only into each RUN container (host path → inside)."""
        return {str(self.folder): INSIDE}

    def wrap(self, command: str) -> str:
        """`command` (a RUN step's, for `/bin/bash -c`) run with the forwarder up and the
        proxy variables exported; its exit status is the command's."""
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in proxy_environment().items())
        return (
            f"/opt/venv/bin/python {INSIDE}/{FORWARDER} {PORT} {INSIDE}/{SOCKET} {READY}"
            " >/dev/null 2>&1 &\n"
            f"for _ in $(seq {READY_TRIES}); do [ -e {READY} ] && break; sleep 0.05; done\n"
            f"rm -f {READY}\n"
            f"export {exports}\n"
            f"exec /bin/bash -c {shlex.quote(command)}\n"
        )


@contextlib.asynccontextmanager
async def build_egress(
    proxy: EgressProxy,
    allow: list[str],
    build_id: str,
    folder: Path,
    log: Callable[[str], None],
) -> AsyncIterator[BuildEgress]:
    """Build `build_id`'s way out to `allow`, in `folder` (a new folder of the gateway's,
    removed at the end with the policy entry and the relay); `log` takes a line for the
    build's log for each connection refused or failed."""
    user = f"build-{build_id}"
    secret = secrets.token_urlsafe(24)

    def observe(decision: Decision) -> None:
        if decision.outcome == "allowed":
            logger.info("build %s egress allowed %s %s", build_id, decision.method, decision.host)
            return
        reason = f": {decision.reason}" if decision.reason else ""
        log(f"network: {decision.outcome} {decision.method} {decision.host}{reason}")

    await asyncio.to_thread(_prepare, folder)
    relay = Relay(folder / SOCKET, proxy.socket, user, secret, observe, owner="build")
    try:
        await proxy.allow(user, secret, allow)
        await relay.start()
        yield BuildEgress(folder, tuple(allow))
    finally:
        await relay.close()
        await proxy.forget(user)
        await asyncio.to_thread(shutil.rmtree, folder, True)


def _prepare(folder: Path) -> None:
    """The forwarder in `folder`, both readable by a step's user (not writable)."""
    os.chmod(folder, 0o755)
    target = folder / FORWARDER
    target.write_bytes(in_kernel_source(FORWARDER))
    os.chmod(target, 0o644)
