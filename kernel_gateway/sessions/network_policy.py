"""Which domains a session may reach: the allowlist it asks for, checked against the
operator's `--egress-allow`, and its network given to it (or restored after a restart).

The way out itself (its relay, the proxy's policy, each kernel's settings) is
`SessionNetwork`'s (`network.py`); here is only what a session is allowed, and when it
gets it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kernel_gateway.errors import (
    BadRequest,
    InvalidRequest,
    KernelUnavailable,
    NetworkNotAllowed,
    SecretNotFound,
    SecretsNotConfigured,
)
from kernel_gateway.in_proxy.policy import BadPattern, normalize, outside
from kernel_gateway.kernels.egress.interception import Rule
from kernel_gateway.kernels.languages import ENV_LANGUAGES
from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.network import NETWORK_LANGUAGES, SessionNetwork
from kernel_gateway.sessions.persistence import SessionRecord
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.tenants.secrets import SecretStore

if TYPE_CHECKING:  # the proxy's module loads the Docker SDK: only when egress is on
    from kernel_gateway.kernels.egress.proxy import EgressProxy

logger = logging.getLogger(__name__)


def allowlist(
    asked: list[str] | str | None, settings: Settings, egress: EgressProxy | None
) -> list[str]:
    """The allowlist a new session gets: `asked` (patterns, or "none") checked against
    `--egress-allow`, or `--egress-default` when it asks nothing."""
    wide: list[str] = []
    if asked is None:
        patterns = list(settings.egress_default_list)
    elif asked == "none":
        return []
    elif isinstance(asked, str):
        raise InvalidRequest('\'network\' is "none" or {"allow": [domain patterns]}')
    else:
        patterns = []
        for raw in asked:
            try:
                patterns.append(normalize(raw))
            except BadPattern as exc:
                # Beyond the ceiling whatever it is: refused as not allowed (403), with why
                # it could not be a pattern anyway; within it (a malformed spelling of an
                # allowed name), a bad request.
                if outside(settings.egress_ceiling, [raw.strip().lower()]):
                    wide.append(f"{raw!r} ({exc})")
                else:
                    raise InvalidRequest(f"'network.allow': {exc}") from None
        patterns = list(dict.fromkeys(patterns))
    ceiling = settings.egress_ceiling
    wide += outside(ceiling, patterns)
    if wide:
        allowed = ", ".join(ceiling) if ceiling else "no domains at all"
        raise NetworkNotAllowed(
            f"the network policy asks for {', '.join(wide)}, which this gateway does not "
            f"allow (its --egress-allow: {allowed})"
        )
    if patterns and egress is None:
        raise KernelUnavailable("this gateway has no egress proxy running")
    return patterns


def check_language(language: str, allow: list[str]) -> None:
    """A network policy only for the languages whose kernels can be pointed at the proxy."""
    if allow and language not in NETWORK_LANGUAGES:
        raise BadRequest(
            f"network policies are not supported for {language} kernels (only for "
            f"{', '.join(sorted(NETWORK_LANGUAGES))})"
        )


async def give(session: Session, allow: list[str], egress: EgressProxy, metrics: Metrics) -> None:
    """`session` may reach `allow`: its way out, now and for each later kernel."""
    network = SessionNetwork(session.id, allow, egress, metrics)
    await network.open()
    kernel = session.slot.kernel
    try:
        if kernel is not None:
            await network.attach(kernel)
    except BaseException:
        await network.close()
        raise
    session.use_network(network)


async def change(
    session: Session,
    asked: list[str] | str | None,
    settings: Settings,
    egress: EgressProxy | None,
    metrics: Metrics,
) -> None:
    """A running session's allowlist replaced by `asked` (checked as a new session's:
    `--egress-allow`, or `--egress-default` when it asks nothing). A session that had no
    network gets its way out now; one that had one keeps it, with the new list (empty:
    nothing). Recorded for a successor gateway."""
    allow = allowlist(asked, settings, egress)
    check_language(session.language, allow)
    network = session.network
    if network is not None:
        await network.change(allow)
    elif allow:
        assert egress is not None  # `allowlist` refuses a list without a proxy
        if session.hibernated:
            await session.resume()
        await give(session, allow, egress, metrics)
    session.persist()
    logger.info("session %s may now reach %s", session.id, ", ".join(allow) or "nothing")


async def restore(
    session: Session,
    record: SessionRecord,
    settings: Settings,
    egress: EgressProxy | None,
    metrics: Metrics,
) -> None:
    """An adopted session's policy, within today's `--egress-allow` (narrowed if the
    operator narrowed it). It fails closed: whatever goes wrong, the kernel has no
    network of its own, and the record keeps the policy for the next gateway."""
    allow = record.network
    kept = [p for p in allow if not outside(settings.egress_ceiling, [p])]
    if kept != allow:
        logger.warning(
            "session %s: %s no longer within --egress-allow; not restored",
            session.id,
            ", ".join(p for p in allow if p not in kept),
        )
    if not kept:
        return
    if egress is None:
        logger.error("session %s may reach %s, but no egress proxy runs", session.id, kept)
        return
    network = SessionNetwork(session.id, kept, egress, metrics)
    rules = tuple(Rule(p, tuple(h.items())) for p, h in record.secret_rules)
    network.keep_secrets(record.secrets, session.owner, record.placeholder, rules)
    session.use_network(network)  # kept in the record even if what follows fails
    kernel = session.slot.kernel
    try:
        await network.open()
        if kernel is not None:  # its environment already points at the proxy
            await network.attach(kernel, configure=False)
    except Exception as exc:
        logger.error("session %s: its network was not restored: %s", session.id, exc)


async def use_secrets(
    session: Session,
    names: list[str],
    store: SecretStore,
    placeholder: str,
    rules: tuple[Rule, ...] = (),
) -> None:
    """`session`'s code may use these secrets of its owner's from now on: each must exist,
    and its domains be within the session's network allowlist (403 otherwise: a secret
    whose domains the session cannot reach would be refused at every request anyway)."""
    names = list(dict.fromkeys([*names, *(n for r in rules for n in sorted(r.names()))]))
    if not names:
        return
    if not store.enabled:
        raise SecretsNotConfigured(
            "this gateway keeps no secrets: start it with --secrets-key-file (and "
            "--egress-allow: secrets are sent through the egress proxy)"
        )
    network = session.network
    owned = store.names_of(session.owner)
    missing = [n for n in names if n not in owned]
    if missing:
        raise SecretNotFound(f"'secrets': no secret {', '.join(map(repr, missing))} (GET /secrets)")
    allow = network.allow if network is not None else []
    for rule in rules:
        if outside(allow, [rule.pattern]):
            raise NetworkNotAllowed(
                f"a rule for {rule.pattern}, which this session's network policy does not "
                f"allow ({', '.join(allow) or 'no network'}): add it to 'allowOut'"
            )
    for opened in store.opened(tuple(names), session.owner):
        wide = outside(allow, list(opened.domains))
        if wide:
            raise NetworkNotAllowed(
                f"the secret {opened.name!r} is for {', '.join(wide)}, which this session's "
                f"network policy does not allow ({', '.join(allow) or 'no network'}): ask "
                "for them in 'network'"
            )
    if session.language not in ENV_LANGUAGES:
        raise BadRequest(f"secrets are not supported for {session.language} kernels")
    if network is None:
        raise NetworkNotAllowed("a session with secrets needs a network policy (their domains)")
    await network.use_secrets(names, session.owner, session.slot.kernel, placeholder, rules)
    session.persist()
