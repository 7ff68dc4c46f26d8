"""A session's network policy: the domains it may reach, and its way to the egress proxy.

`"network": "none"` (the default) needs nothing: the kernel has no network at all. A
session allowed some domains gets, in each of its kernels (the first and every one that
replaces it): a forwarder on the sandbox's `127.0.0.1:3128` (`in_kernel/egress_forward.py`),
a relay at its other end that speaks for this session alone (`kernels/egress/relay.py`),
the proxy variables in the kernel's environment (`HTTP_PROXY`, `HTTPS_PROXY`, their
lower-case twins, `NO_PROXY`; Java's proxy properties), and an entry in the proxy's policy:
its id, a secret only the relay knows, its patterns.

A session that uses secrets (`use_secrets`) also gets, in each kernel, a placeholder per
secret in its environment (`NAME=kg-secret:NAME`) and the gateway CA's certificate as the
trust of its TLS clients (`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, `CURL_CA_BUNDLE`,
`NODE_EXTRA_CA_CERTS`, `GIT_SSL_CAINFO`, `PIP_CERT`, in `/conn/egress/`, a folder the
kernel cannot write); its relay opens its HTTPS to put the values in (`interception.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_gateway import logs
from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.egress.forwarder import PORT, proxy_environment
from kernel_gateway.kernels.egress.interception import Rule
from kernel_gateway.kernels.egress.relay import Decision, Interception, Relay
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.languages import ENV_LANGUAGES, PYTHON, env_code
from kernel_gateway.metrics import Metrics
from kernel_gateway.tenants.secrets import PLACEHOLDER, Opened

if TYPE_CHECKING:  # the proxy's module loads the Docker SDK: only when egress is on
    from kernel_gateway.kernels.egress.proxy import EgressProxy

logger = logging.getLogger(__name__)

SETUP_SECONDS = 30.0

NETWORK_LANGUAGES = ENV_LANGUAGES | {"java"}
"""The languages whose kernels can be pointed at the proxy (`proxy_setup_code`)."""
PIP_OFFLINE = ("PIP_NO_INDEX", "PIP_RETRIES", "PIP_TIMEOUT")
"""What keeps pip from looking at indexes in a kernel without network: unset with a proxy."""
JAVA_PROPERTIES = {
    "http.proxyHost": "127.0.0.1",
    "http.proxyPort": str(PORT),
    "https.proxyHost": "127.0.0.1",
    "https.proxyPort": str(PORT),
    "http.nonProxyHosts": "localhost|127.0.0.1",
}
"""Java reads its proxy from system properties (a running JVM's environment is fixed)."""


def proxy_setup_code(language: str) -> str:
    """Silent code that points `language`'s kernel (and what it starts) at the proxy."""
    if language == "java":
        return "\n".join(
            f"System.setProperty({json.dumps(k)}, {json.dumps(v)});"
            for k, v in JAVA_PROPERTIES.items()
        )
    if language not in ENV_LANGUAGES:
        raise KernelUnavailable(f"network policies are not supported for {language}")
    env: dict[str, str | None] = dict(proxy_environment())
    if language == PYTHON:  # pip looks at indexes again (offline, it looks at none)
        env.update(dict.fromkeys(PIP_OFFLINE))
    return env_code(language, env)


CA_FILE = "/conn/egress/ca.pem"
"""Where a kernel finds the gateway CA's certificate (its relay's folder, read-only to it)."""
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
)


def trust_environment() -> dict[str, str]:
    """The variables that point a sandbox's TLS clients at the gateway's CA."""
    return dict.fromkeys(CA_VARIABLES, CA_FILE)


def secrets_setup_code(language: str, names: tuple[str, ...], placeholder: str) -> str:
    """Silent code that gives `language`'s kernel the placeholders and the gateway's CA."""
    if language not in ENV_LANGUAGES:
        raise KernelUnavailable(f"secrets are not supported for {language} kernels")
    env: dict[str, str | None] = dict.fromkeys(CA_VARIABLES, CA_FILE)
    env.update({name: placeholder.format(name=name) for name in names})
    return env_code(language, env)


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
        self.secret_names: tuple[str, ...] = ()
        """The secrets its code may use (their values go only where each belongs)."""
        self.placeholder = PLACEHOLDER
        """How its environment spells a secret (E2B's sandboxes: `${{e2b.secrets.{name}}}`)."""
        self.rules: tuple[Rule, ...] = ()
        """E2B's per-host header rules (their placeholders may go to their hosts)."""
        self._owner: str | None = None
        self._before = 0
        """Bytes its closed relays passed (its earlier kernels')."""

    @property
    def transferred(self) -> int:
        """Bytes its kernels sent and received through the proxy since it was opened."""
        return self._before + (self._relay.transferred if self._relay is not None else 0)

    def to_json(self) -> dict[str, Any]:
        return {"allow": self.allow}

    def _interception(self) -> Interception | None:
        proxy = self._proxy
        store, authority = proxy.secrets, proxy.authority
        if not self.secret_names or store is None or authority is None:
            return None
        names, owner, rules = self.secret_names, self._owner, self.rules
        granted: dict[str, tuple[str, ...]] = {}
        for rule in rules:
            for name in rule.names():
                granted[name] = (*granted.get(name, ()), rule.pattern)

        def opened() -> list[Opened]:
            """The secrets now; one without domains of its own (E2B's) may go where a rule
            sends it (a rule never widens a secret that names its domains)."""
            found = store.opened(names, owner)
            return [
                replace(o, domains=granted.get(o.name, ())) if not o.domains else o for o in found
            ]

        return Interception(authority, proxy.upstream_tls, opened, rules)

    def keep_secrets(
        self, names: list[str], owner: str | None, placeholder: str, rules: tuple[Rule, ...] = ()
    ) -> None:
        """An adopted session's secrets (its kernel already has their placeholders)."""
        self.secret_names, self._owner, self.placeholder = tuple(names), owner, placeholder
        self.rules = rules

    async def use_secrets(
        self,
        names: list[str],
        owner: str | None,
        kernel: Kernel | None,
        placeholder: str,
        rules: tuple[Rule, ...] = (),
    ) -> None:
        """From now on its code may use these secrets of `owner`'s (`kernel`: the one it has
        now, given the placeholders and the CA at once)."""
        self.keep_secrets(names, owner, placeholder, rules)
        if self._relay is not None:
            self._relay.intercept = self._interception()
        if kernel is not None:
            await self._configure_secrets(kernel)

    async def _configure_secrets(self, kernel: Kernel) -> None:
        if not self.secret_names or self._relay is None or self._proxy.authority is None:
            return
        pem = self._proxy.authority.certificate_pem
        ca = self._relay.listen.parent / "ca.pem"
        await asyncio.to_thread(_write_readable, ca, pem)
        names = (  # E2B's sandboxes get no variables: their rules send the values
            tuple(n for n in self.secret_names if n.isidentifier())
            if self.placeholder == PLACEHOLDER
            else ()
        )
        code = secrets_setup_code(kernel.language, names, self.placeholder)
        if not await kernel.run_silent(code, SETUP_SECONDS):
            raise KernelUnavailable("the kernel did not take its secrets' placeholders")

    async def open(self) -> None:
        """Enter the session in the proxy's policy."""
        await self._proxy.allow(self.session_id, self._secret, self.allow)

    async def change(self, allow: list[str]) -> None:
        """From now on the session may reach `allow` instead (none: nothing); its way out
        stays. A new connection is judged by the new list (one the old list allowed, to a
        host it no longer does, for up to the proxy's `DECISION_SECONDS` more)."""
        self.allow = list(allow)
        await self._proxy.allow(self.session_id, self._secret, self.allow)

    async def attach(self, kernel: Kernel, *, configure: bool = True) -> None:
        """Give `kernel` its way out (its previous kernel's relay, if any, is closed);
        `configure`: also point the kernel's environment at the proxy (an adopted kernel's
        already is, and may be busy with a cell)."""
        await self._close_relay()
        listen = await kernel.process.start_egress_forwarder(PORT)
        relay = Relay(
            listen,
            self._proxy.socket,
            self.session_id,
            self._secret,
            self._observe,
            intercept=self._interception(),
        )
        await relay.start()
        self._relay = relay
        if not configure:
            return
        if not await kernel.run_silent(proxy_setup_code(kernel.language), SETUP_SECONDS):
            raise KernelUnavailable("the kernel did not take its proxy settings")
        await self._configure_secrets(kernel)

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
            self._before += relay.transferred
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


def _write_readable(path: Path, data: bytes) -> None:
    """`data` at `path`, readable by the kernel's user, written whole or not at all."""
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(temporary, path)
