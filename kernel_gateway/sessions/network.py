"""A session's network policy: the domains it may reach, and its way to the egress proxy.

`"network": "none"` (the default) needs nothing: the kernel has no network at all. A
session allowed some domains gets, in each of its kernels (the first and every one that
replaces it): a forwarder on the sandbox's `127.0.0.1:3128` (`in_kernel/egress_forward.py`),
a relay at its other end that speaks for this session alone (`kernels/egress/relay.py`),
the proxy variables in the kernel's environment (`HTTP_PROXY`, `HTTPS_PROXY`, their
lower-case twins, `NO_PROXY`; Java's proxy properties), and an entry in the proxy's policy:
its id, a secret only the relay knows, its patterns.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import TYPE_CHECKING, Any

from kernel_gateway import logs
from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.egress.relay import Decision, Relay
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.metrics import Metrics

if TYPE_CHECKING:  # the proxy's module loads the Docker SDK: only when egress is on
    from kernel_gateway.kernels.egress.proxy import EgressProxy

logger = logging.getLogger(__name__)

PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PORT}"
NO_PROXY = "localhost,127.0.0.1,::1"
SETUP_SECONDS = 30.0


def proxy_environment() -> dict[str, str]:
    return {
        "HTTP_PROXY": PROXY_URL,
        "HTTPS_PROXY": PROXY_URL,
        "http_proxy": PROXY_URL,
        "https_proxy": PROXY_URL,
        "NO_PROXY": NO_PROXY,
        "no_proxy": NO_PROXY,
    }


NETWORK_LANGUAGES = frozenset({"python", "r", "javascript", "typescript", "bash", "java"})
"""The languages whose kernels can be pointed at the proxy (`proxy_setup_code`)."""


def proxy_setup_code(language: str) -> str:
    """Silent code that points `language`'s kernel (and what it starts) at the proxy."""
    env = proxy_environment()
    if language == "python":  # pip looks at indexes again (offline, it looks at none)
        return (
            f"import os as __kg_os\n__kg_os.environ.update({env!r})\n"
            "for __kg_k in ('PIP_NO_INDEX', 'PIP_RETRIES', 'PIP_TIMEOUT'):\n"
            "    __kg_os.environ.pop(__kg_k, None)\n"
            "del __kg_os, __kg_k"
        )
    if language == "r":
        return "Sys.setenv(" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + ")"
    if language in ("javascript", "typescript"):
        return "\n".join(f"Deno.env.set({json.dumps(k)}, {json.dumps(v)});" for k, v in env.items())
    if language == "bash":
        return "\n".join(f"export {k}={v}" for k, v in env.items())
    if language == "java":
        properties = {
            "http.proxyHost": "127.0.0.1",
            "http.proxyPort": str(PORT),
            "https.proxyHost": "127.0.0.1",
            "https.proxyPort": str(PORT),
            "http.nonProxyHosts": "localhost|127.0.0.1",
        }
        return "\n".join(
            f"System.setProperty({json.dumps(k)}, {json.dumps(v)});" for k, v in properties.items()
        )
    raise KernelUnavailable(f"network policies are not supported for {language}")


class SessionNetwork:
    """One session's allowlist and its way out, for each kernel the session has."""

    def __init__(
        self, session_id: str, allow: list[str], proxy: EgressProxy, metrics: Metrics
    ) -> None:
        self.session_id = session_id
        self.allow = list(allow)
        self._proxy = proxy
        self._metrics = metrics
        self._secret = secrets.token_urlsafe(24)
        self._relay: Relay | None = None

    def to_json(self) -> dict[str, Any]:
        return {"allow": self.allow}

    async def open(self) -> None:
        """Enter the session in the proxy's policy."""
        await self._proxy.allow(self.session_id, self._secret, self.allow)

    async def attach(self, kernel: Kernel, *, configure: bool = True) -> None:
        """Give `kernel` its way out (its previous kernel's relay, if any, is closed);
        `configure`: also point the kernel's environment at the proxy (an adopted kernel's
        already is, and may be busy with a cell)."""
        await self._close_relay()
        listen = await kernel.process.start_egress_forwarder(PORT)
        relay = Relay(listen, self._proxy.socket, self.session_id, self._secret, self._observe)
        await relay.start()
        self._relay = relay
        if not configure:
            return
        if not await kernel.run_silent(proxy_setup_code(kernel.language), SETUP_SECONDS):
            raise KernelUnavailable("the kernel did not take its proxy settings")

    async def close(self) -> None:
        await self._close_relay()
        await self._proxy.forget(self.session_id)

    async def suspend(self) -> None:
        """The gateway stops and a successor takes the session: only the relay goes (the
        successor listens on the same socket, for the forwarder still running)."""
        await self._close_relay()

    async def _close_relay(self) -> None:
        relay, self._relay = self._relay, None
        if relay is not None:
            await relay.close()

    def _observe(self, decision: Decision) -> None:
        self._metrics.egress_request(decision.outcome)
        level = logging.INFO if decision.outcome == "allowed" else logging.WARNING
        logs.bind(session_id=self.session_id)
        logger.log(
            level,
            "egress %s %s %s%s",
            decision.outcome,
            decision.method,
            decision.host,
            f": {decision.reason}" if decision.reason else "",
            extra={
                "fields": {
                    "egress": decision.outcome,
                    "host": decision.host,
                    "method": decision.method,
                    "reason": decision.reason,
                }
            },
        )
