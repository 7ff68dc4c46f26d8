"""Domain patterns, and squid's helper that applies each session's allowlist.

A pattern is a domain name (`data.example.com`: that name only) or a wildcard
(`*.example.org`: any name under example.org, not example.org itself). IP literals are not
patterns: the proxy refuses them whatever a list says.

The same file is squid's helper in the proxy's container (`python3 policy.py MODE FILE`):

    auth   squid's basic authenticator: lines `<session> <secret>`, answers OK or ERR
    allow  squid's external ACL: lines `<session> <host>`, OK when the session's list
           allows the host

FILE is the policy the gateway writes (JSON, replaced atomically, re-read when it
changes): {"sessions": {"<session id>": {"secret_sha256": "<hex>", "allow": [patterns]}}}.
It imports nothing but the standard library: the proxy's image has only Python's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import sys
from typing import Any, TextIO
from urllib.parse import unquote

LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
NAME = re.compile(rf"{LABEL}(?:\.{LABEL})*")
MAX_NAME = 253


class BadPattern(ValueError):
    """Not a domain pattern: the message says why."""


def normalize(pattern: str) -> str:
    """`pattern` in its one spelling (lower case, no trailing dot), or BadPattern."""
    if not isinstance(pattern, str):
        raise BadPattern("a domain pattern must be a string")
    text = pattern.strip().lower().removesuffix(".")
    wildcard = text.startswith("*.")
    name = text[2:] if wildcard else text
    if not name or len(name) > MAX_NAME or not NAME.fullmatch(name):
        raise BadPattern(f"{pattern!r} is not a domain name or '*.' and a domain name")
    if name.replace(".", "").isdigit() or ":" in name:
        raise BadPattern(f"{pattern!r} is an IP address: only domain names can be allowed")
    if wildcard and "." not in name:
        raise BadPattern(f"{pattern!r} would allow a whole top-level domain")
    return ("*." if wildcard else "") + name


PROTECTED_FIELDS = frozenset(
    {
        "host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
        "trailer", "upgrade", "expect",
    }
)  # fmt: skip
"""Request fields no secret and no E2B rule may set: they decide where and how a message
goes (the gateway's egress relay, kernels/egress/interception.py)."""


def protected(name: str) -> bool:
    """Whether a header by this name would change how a request is framed or where it goes
    (`PROTECTED_FIELDS`, and `Proxy-*`)."""
    lowered = name.lower()
    return lowered in PROTECTED_FIELDS or lowered.startswith("proxy-")


def matches(pattern: str, host: str) -> bool:
    """Whether the (normalized) `pattern` allows `host`."""
    host = host.strip().lower().removesuffix(".")
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def covers(ceiling: str, pattern: str) -> bool:
    """Whether the (normalized) `ceiling` pattern allows everything `pattern` allows."""
    if pattern.startswith("*."):
        return ceiling == pattern or (ceiling.startswith("*.") and matches(ceiling, pattern[2:]))
    return matches(ceiling, pattern)


def outside(ceiling: list[str], patterns: list[str]) -> list[str]:
    """The patterns no ceiling pattern covers (what an operator has not allowed)."""
    return [p for p in patterns if not any(covers(c, p) for c in ceiling)]


# -- squid's helper ---------------------------------------------------------------------------


class Policy:
    """The policy file, re-read whenever it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int, int] | None = None
        self._sessions: dict[str, Any] = {}

    def sessions(self) -> dict[str, Any]:
        try:
            info = os.stat(self.path)
        except OSError:
            self._sessions, self._stamp = {}, None
            return self._sessions
        stamp = (info.st_mtime_ns, info.st_ino, info.st_size, info.st_ctime_ns)
        if stamp != self._stamp:
            try:
                with open(self.path, encoding="utf-8") as f:
                    loaded = json.load(f).get("sessions", {})
                self._sessions = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError, AttributeError):
                self._sessions = {}
            self._stamp = stamp
        return self._sessions

    def authenticates(self, session: str, secret: str) -> bool:
        entry = self.sessions().get(session)
        if not isinstance(entry, dict) or not isinstance(entry.get("secret_sha256"), str):
            return False
        digest = hashlib.sha256(secret.encode()).hexdigest()
        return hmac.compare_digest(digest, entry["secret_sha256"])

    def allows(self, session: str, host: str) -> bool:
        entry = self.sessions().get(session)
        allow = entry.get("allow") if isinstance(entry, dict) else None
        return isinstance(allow, list) and any(
            isinstance(p, str) and matches(p, host) for p in allow
        )


def serve(mode: str, policy: Policy, lines: TextIO, out: TextIO) -> None:
    """Answer squid's requests, one line each, until squid closes the pipe."""
    for line in lines:
        words = line.split()
        if len(words) < 2:
            out.write("ERR\n")
        else:
            first, second = unquote(words[0]), unquote(words[1])
            if mode == "auth":
                ok = policy.authenticates(first, second)
            else:
                ok = policy.allows(first, second)
            out.write("OK\n" if ok else "ERR\n")
        out.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("auth", "allow"):
        sys.stderr.write("usage: policy.py auth|allow POLICY_FILE\n")
        return 2
    serve(argv[1], Policy(argv[2]), sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
