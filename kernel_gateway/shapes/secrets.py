"""The secrets' shapes: what a client sends to make or change one, and what it is shown
(never the value)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from kernel_gateway.in_proxy.policy import PROTECTED_FIELDS, BadPattern, normalize, protected
from kernel_gateway.shapes.meta import closed
from kernel_gateway.shapes.requests import RequestModel, valid_unicode

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
HEADER_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^`|~-]{1,128}$"
MAX_VALUE = 16 * 1024
MAX_DOMAINS = 32


RESERVED = frozenset(
    {
        "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy",
        "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO", "PIP_CERT", "PATH", "HOME", "PYTHONPATH", "LD_PRELOAD",
    }
)  # fmt: skip
"""Names a secret may not take: its placeholder variable would replace the gateway's."""


def _not_reserved(value: str) -> str:
    if value in RESERVED:
        raise PydanticCustomError("reserved", "is a variable the gateway sets itself")
    if value.startswith("sec_"):
        raise PydanticCustomError("reserved", "sec_ starts secrets' ids, not their names")
    return value


def _settable(value: str) -> str:
    if protected(value):
        raise PydanticCustomError("protected", "decides how a request goes: it cannot be set")
    return value


def _header_safe(value: str) -> str:
    """A value that goes into an HTTP header: no CR, LF or NUL (they would end the header and
    start another one the sandbox chose)."""
    valid_unicode(value)
    if any(c in value for c in "\r\n\0"):
        raise PydanticCustomError("header_safe", "may not hold CR, LF or NUL")
    return value


def _format(value: str) -> str:
    _header_safe(value)
    if "{value}" not in value:
        raise PydanticCustomError("format", "must hold {value}, where the secret goes")
    return value


def _domains(value: list[str]) -> list[str]:
    try:
        return list(dict.fromkeys(normalize(d) for d in value))
    except BadPattern as exc:
        raise PydanticCustomError("domain", "{reason}", {"reason": str(exc)}) from None


_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
_LAST = r"[a-zA-Z](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
DOMAIN_PATTERN = rf"^(?:\*\.(?:{_LABEL}\.)+{_LAST}|(?:{_LABEL}\.)*{_LAST})$"
"""A domain name, or `*.` and a name of two labels or more (the last one not a number)."""
Name = Annotated[
    str,
    Field(
        pattern=NAME_PATTERN,
        description="An environment variable's name.",
        json_schema_extra={"not": {"anyOf": [{"enum": sorted(RESERVED)}, {"pattern": "^sec_"}]}},
    ),
    AfterValidator(_not_reserved),
]
Value = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_VALUE,
        pattern=r"^[^\r\n\x00]+$",
        description="The secret itself: never shown. No CR, LF or NUL.",
    ),
    AfterValidator(_header_safe),
]
Domains = Annotated[
    list[Annotated[str, Field(max_length=253, pattern=DOMAIN_PATTERN)]],
    Field(
        min_length=1,
        max_length=MAX_DOMAINS,
        description="Where its value may be sent: domain patterns as the network policy's "
        "(`api.github.com`, `*.example.org`).",
    ),
    AfterValidator(_domains),
]


def _any_case(word: str) -> str:
    """A regular expression for `word` in any case (JSON Schema's patterns have no flags)."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in word)


_PROTECTED_PATTERN = (
    "^(?:" + "|".join(_any_case(w) for w in sorted(PROTECTED_FIELDS)) + ")$|^" + _any_case("proxy-")
)
Header = Annotated[
    str,
    Field(
        pattern=HEADER_PATTERN,
        description="A header the egress proxy adds to every request to its domains that "
        "lacks it (`Authorization`); not one that decides how a request goes (`Host`, "
        "`Content-Length`, `Transfer-Encoding`, `Connection`, `Keep-Alive`, `TE`, `Trailer`, "
        "`Upgrade`, `Expect`, `Proxy-*`).",
        json_schema_extra={"not": {"type": "string", "pattern": _PROTECTED_PATTERN}},
    ),
    AfterValidator(_settable),
]
Format = Annotated[
    str,
    Field(
        max_length=256,
        pattern=r"^[^\r\n\x00]*\{value\}[^\r\n\x00]*$",
        description="The header's value, `{value}` for the secret.",
    ),
    AfterValidator(_format),
]


class NewSecret(RequestModel):
    """A secret: its value goes only to its domains, in requests from sessions that name it."""

    name: Name
    value: Value
    domains: Domains
    header: Header | None = None
    format: Format = "{value}"


class SecretChange(RequestModel):
    """A new value (a rotation), and/or new domains, header or format."""

    value: Value | None = None
    domains: Domains | None = None
    header: Header | None = None
    format: Format | None = None


@closed
class SecretInfo(TypedDict):
    id: str
    name: str
    domains: list[str]
    header: str | None
    format: str
    version: int
    """1, then one more at each change: a rotation reaches the next request."""
    placeholder: str
    """What a session's environment holds for it (`kg-secret:NAME`)."""
    created_at: float
    updated_at: float
    owner: str | None
    """The id of the API key that made it (null: the admin)."""


@closed
class SecretList(TypedDict):
    secrets: list[SecretInfo]
