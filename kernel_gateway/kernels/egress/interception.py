"""HTTPS opened by the relay, for a session that uses secrets: placeholders become values
only on their way to the secrets' own domains.

After the egress proxy allowed a CONNECT, the relay (`relay.py`) answers the sandbox as the
host it asked for (a certificate of the gateway's CA, `authority.py`), opens its own TLS
connection to the real host through the same tunnel (verified against the system's CAs
and `--egress-ca-file`), and passes HTTP/1.1 requests one at a time:

- every head is parsed strictly (`parse_head`): no folded lines, no bare CR or LF, no NUL,
  no space before a colon, one `Host` (the CONNECT's host), at most one `Content-Length`
  or one `Transfer-Encoding: chunked`, never both. Anything else closes the connection:
  two parsers that could read one message two ways are how requests get smuggled;
- a placeholder (`kg-secret:NAME`, `${e2b.secrets.NAME}`) of a secret whose domains cover
  the host becomes the value; a placeholder of any other secret, or one in the request
  line (URLs are logged everywhere) or in `Host`, is refused with 403 and nothing reaches
  the host;
- a secret with a `header`, and E2B's per-host rules (`Rule`), add headers to requests to
  their hosts;
- a request that carries a value asks for an uncompressed, whole answer (`Accept-Encoding:
  identity`, no `Range`, no `Upgrade`); an answer that is compressed anyway is refused;
- every answer on the connection, interim ones too, has every value of the session's
  secrets for this host replaced by as many `*` (sizes kept): an echo does not bring a
  value back into the sandbox. Best effort: a value sent back transformed (encoded,
  hashed) is not recognized.

Not handled: HTTP/2 (the sandbox is offered HTTP/1.1 only), placeholders in bodies (sent
as they are), WebSocket messages after an upgrade of a request that carried no value.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass

from kernel_gateway.in_proxy.policy import matches, protected
from kernel_gateway.tenants.secrets import Opened

HEAD_LIMIT = 64 * 1024
CHUNK = 64 * 1024
HEAD_SECONDS = 300.0
"""How long a kept-alive connection may wait for its next request."""
ANSWER_SECONDS = 300.0
"""How long an upstream may take to start answering, or to send the next piece."""
PLACEHOLDERS = re.compile(
    rb"kg-secret:([A-Za-z0-9_][A-Za-z0-9_-]{0,127})"
    rb"|\$\{e2b\.secrets\.([A-Za-z0-9_][A-Za-z0-9_-]{0,127})\}"
)
TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""A method (RFC 9110's token)."""
FIELD_NAME = re.compile(rb"[!#$%&'*+.^`|~0-9A-Za-z-]+")
"""A header's name: a token without `_` (some servers read `_` as `-`)."""
VISIBLE = re.compile(rb"[\x21-\x7e]+")


CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})(?:;[^\r\n]*)?")
STRIPPED_WITH_A_VALUE = (b"accept-encoding", b"range", b"if-range", b"upgrade", b"te")
"""Headers a request that carries a value loses: its answer must come whole and readable."""


@dataclass(frozen=True)
class Rule:
    """E2B's per-host transform: these headers set (replacing any of the same name) on every
    request to a host `pattern` matches; their values may hold secrets' placeholders, which
    may then go to those hosts."""

    pattern: str
    headers: tuple[tuple[str, str], ...]

    def names(self) -> set[str]:
        """The secrets its headers name."""
        return {
            (m.group(1) or m.group(2)).decode()
            for _, value in self.headers
            for m in PLACEHOLDERS.finditer(value.encode())
        }


class Refused(Exception):
    """The request may not go: the reason, for the sandbox and the log."""


class Malformed(Exception):
    """A head that could be read two ways: the connection is closed."""


@dataclass
class Head:
    """One message head, parsed strictly: its first line and its fields, in order."""

    start: bytes
    fields: list[tuple[bytes, bytes]]

    def get(self, name: bytes) -> list[bytes]:
        return [value for key, value in self.fields if key.lower() == name]

    def one(self, name: bytes) -> bytes | None:
        found = self.get(name)
        if len(found) > 1:
            raise Malformed(f"{name.decode()} twice")
        return found[0] if found else None

    def without(self, *names: bytes) -> list[tuple[bytes, bytes]]:
        return [(k, v) for k, v in self.fields if k.lower() not in names]

    def encode(self, fields: list[tuple[bytes, bytes]] | None = None) -> bytes:
        lines = [
            self.start,
            *(k + b": " + v for k, v in (self.fields if fields is None else fields)),
        ]
        return b"\r\n".join(lines) + b"\r\n\r\n"


def parse_head(raw: bytes) -> Head:
    """A head as `readuntil(b"\\r\\n\\r\\n")` gives it; Malformed for anything two parsers
    could read differently."""
    if (
        b"\0" in raw
        or raw.count(b"\r") != raw.count(b"\r\n")
        or raw.count(b"\n") != raw.count(b"\r\n")
    ):
        raise Malformed("a bare CR or LF, or a NUL")
    lines = raw[:-4].split(b"\r\n")
    fields = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise Malformed("a folded line")
        name, colon, value = line.partition(b":")
        if not colon or not FIELD_NAME.fullmatch(name):
            raise Malformed("a field without a valid name")
        fields.append((name, value.strip(b" \t")))
    return Head(lines[0], fields)


def framing(head: Head) -> tuple[str, int]:
    """How a message's body ends: ("length", n), ("chunked", 0) or ("close", 0)."""
    encoding = head.one(b"transfer-encoding")
    length = head.one(b"content-length")
    if encoding is not None:
        if length is not None:
            raise Malformed("both Transfer-Encoding and Content-Length")
        if encoding.lower() != b"chunked":
            raise Malformed("a Transfer-Encoding other than chunked")
        return "chunked", 0
    if length is not None:
        if not length.isdigit() or len(length) > 15:
            raise Malformed("a Content-Length that is not a number")
        return "length", int(length)
    return "close", 0


@dataclass
class Rewritten:
    head: bytes
    used: list[Opened]
    """The secrets whose values it now carries."""
    sensitive: bool = False
    """A value may come back in its answer (the host is one a secret may go to): the answer
    must be whole and plain, never an upgrade."""


def covers(secret: Opened, host: str) -> bool:
    return any(matches(pattern, host) for pattern in secret.domains)


def _authority_is(value: bytes, host: str) -> bool:
    text = value.decode("latin-1").lower().removesuffix(":443")
    return text.removesuffix(".") == host.lower().removesuffix(".")


def rewrite(
    head: Head, host: str, secrets: list[Opened], rules: tuple[Rule, ...] = ()
) -> Rewritten:
    """The request head with placeholders replaced (and headers added, by the secrets' own
    `header` and by `rules`) for `host`; Refused when it sends a placeholder where it may
    not go, or names another host than the tunnel's."""
    parts = head.start.split(b" ")
    if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise Malformed("not an HTTP/1.x request line")
    if not TOKEN.fullmatch(parts[0]) or not VISIBLE.fullmatch(parts[1]):
        raise Malformed("a method or a target that is not plain")
    target = parts[1]
    if PLACEHOLDERS.search(head.start):
        raise Refused("a secret's placeholder in the request's URL: secrets go in headers only")
    if target.lower().startswith((b"http://", b"https://")):
        authority = target.split(b"/", 3)[2]
        if not _authority_is(authority, host):
            raise Refused(f"a request for another host than {host} in its tunnel")
    elif not target.startswith(b"/") and target != b"*":
        raise Malformed("a request target that is not a path")
    named = head.one(b"host")
    if named is None or not _authority_is(named, host):
        raise Refused(f"a Host other than {host} (the host this connection was opened for)")
    by_name = {s.name: s for s in secrets}
    used: dict[str, Opened] = {}

    def substitute(match: re.Match[bytes]) -> bytes:
        wanted = (match.group(1) or match.group(2)).decode()
        secret = by_name.get(wanted)
        if secret is None:
            raise Refused(f"the placeholder of {wanted!r}, a secret this session does not have")
        if not covers(secret, host):
            where = ", ".join(secret.domains) or "no domain"
            raise Refused(f"the secret {wanted!r} may be sent only to {where}, not {host}")
        used[wanted] = secret
        return secret.value.encode()

    fields = [(k, PLACEHOLDERS.sub(substitute, v)) for k, v in head.fields]
    for rule in rules:
        if not matches(rule.pattern, host):
            continue
        for name, template in rule.headers:
            if protected(name):
                raise Refused(f"a rule may not set {name}")
            key = name.lower().encode()
            fields = [(k, v) for k, v in fields if k.lower() != key]
            fields.append((name.encode(), PLACEHOLDERS.sub(substitute, template.encode())))
    present = {k.lower() for k, _ in fields}
    for secret in secrets:
        if secret.header and protected(secret.header):
            raise Refused(f"the secret {secret.name!r} may not set {secret.header}")
        if secret.header and covers(secret, host) and secret.header.lower().encode() not in present:
            value = secret.format.replace("{value}", secret.value)
            fields.append((secret.header.encode(), value.encode()))
            used[secret.name] = secret
    sensitive = bool(used) or any(covers(s, host) for s in secrets)
    if sensitive:  # an answer whole and readable, to take any value out of it
        fields = [(k, v) for k, v in fields if k.lower() not in STRIPPED_WITH_A_VALUE]
        fields.append((b"Accept-Encoding", b"identity"))
    return Rewritten(head.encode(fields), list(used.values()), sensitive)


class Redactor:
    """Replaces each value in a stream of bytes by as many `*` (sizes kept), holding back
    the few bytes that could be the start of one split across pieces."""

    def __init__(self, values: list[str]) -> None:
        self._values = sorted({v.encode() for v in values if v}, key=len, reverse=True)
        self._keep = max((len(v) for v in self._values), default=1) - 1
        self._held = b""
        self.found = 0

    def feed(self, data: bytes) -> bytes:
        data = self._held + data
        for value in self._values:
            if value in data:
                self.found += data.count(value)
                data = data.replace(value, b"*" * len(value))
        if self._keep <= 0:
            self._held = b""
            return data
        self._held = data[-self._keep :]
        return data[: -self._keep]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def whole(self, data: bytes) -> bytes:
        """`data` masked as one piece (a head), nothing held back."""
        return self.feed(data) + self.flush()


Observer = Callable[[str, str], None]
"""(outcome, reason): a secret used, or refused."""


async def _read(reader: asyncio.StreamReader, size: int) -> bytes:
    data = await asyncio.wait_for(reader.read(size), ANSWER_SECONDS)
    if not data:
        raise ConnectionError("the body ended early")
    return data


async def _copy_length(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int, redact: Redactor
) -> None:
    while size > 0:
        data = await _read(reader, min(CHUNK, size))
        size -= len(data)
        writer.write(redact.feed(data))
        await writer.drain()
    writer.write(redact.flush())


async def _copy_chunked(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, redact: Redactor
) -> None:
    """A chunked body, its chunks passed on in pieces of at most `CHUNK` bytes (as chunks
    of their own: a chunk's size is no promise of memory the relay keeps)."""
    while True:
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), ANSWER_SECONDS)
        found = CHUNK_SIZE.fullmatch(line[:-2])
        if found is None:
            raise Malformed("a chunk size that is not hex")
        size = int(found.group(1), 16)
        if size == 0:
            while (await asyncio.wait_for(reader.readuntil(b"\r\n"), ANSWER_SECONDS)) != b"\r\n":
                pass  # trailers: dropped
            held = redact.flush()
            if held:
                writer.write(b"%x\r\n%s\r\n" % (len(held), held))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return
        while size > 0:
            data = await _read(reader, min(CHUNK, size))
            size -= len(data)
            data = redact.feed(data)
            if data:
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
        if await asyncio.wait_for(reader.readexactly(2), ANSWER_SECONDS) != b"\r\n":
            raise Malformed("a chunk that does not end with CRLF")


async def _copy_to_close(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, redact: Redactor
) -> None:
    while data := await asyncio.wait_for(reader.read(CHUNK), ANSWER_SECONDS):
        writer.write(redact.feed(data))
        await writer.drain()
    writer.write(redact.flush())
    await writer.drain()


async def _copy_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    framing: tuple[str, int],
    redact: Redactor,
) -> None:
    kind, size = framing
    if kind == "length":
        await _copy_length(reader, writer, size, redact)
    elif kind == "chunked":
        await _copy_chunked(reader, writer, redact)
    else:
        await _copy_to_close(reader, writer, redact)


def refusal(code: int, reason: str, text: str) -> bytes:
    body = f"kernel-gateway egress: {text}\n".encode()
    return (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


async def exchange(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    host: str,
    secrets: Callable[[], list[Opened]],
    observe: Observer,
    rules: tuple[Rule, ...] = (),
) -> None:
    """Requests from the sandbox to `host`, one at a time, until either side closes (or a
    message could be read two ways)."""
    (c_reader, c_writer), (u_reader, u_writer) = client, upstream
    while True:
        try:
            raw = await asyncio.wait_for(c_reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
        except (asyncio.IncompleteReadError, TimeoutError):
            return
        current = secrets()
        # Every answer on this connection is masked with every value that may come here.
        redact = Redactor([s.value for s in current if covers(s, host)])
        try:
            head = parse_head(raw)
            rewritten = rewrite(head, host, current, rules)
            request_framing = framing(head)
        except (Refused, Malformed) as exc:
            observe("refused", f"{host}: {exc}")
            c_writer.write(refusal(403, "Forbidden by secrets policy", str(exc)))
            await c_writer.drain()
            return
        for secret in rewritten.used:
            observe("used", f"{secret.name} to {host}")
        method = head.start.split(b" ")[0]
        if request_framing[0] == "close":
            request_framing = ("length", 0)  # a request without a length has no body
        u_writer.write(rewritten.head)
        body = asyncio.ensure_future(_copy_body(c_reader, u_writer, request_framing, Redactor([])))
        try:
            while True:  # interim answers (100 Continue) go to the sandbox as they come
                raw_answer = await asyncio.wait_for(u_reader.readuntil(b"\r\n\r\n"), ANSWER_SECONDS)
                answer = parse_head(raw_answer)
                status = (answer.start.split(b" ", 2) + [b""])[1]
                if not (status.startswith(b"1") and status != b"101"):
                    break
                c_writer.write(redact.whole(raw_answer))
            encoding = answer.one(b"content-encoding")
            if rewritten.sensitive and encoding not in (None, b"identity"):
                observe("refused", f"{host}: a compressed answer to a request with a secret")
                c_writer.write(
                    refusal(502, "Bad Gateway", f"{host} compressed an answer it was asked not to")
                )
                return
            if status == b"101" and (rewritten.sensitive or not head.get(b"upgrade")):
                raise Malformed("an upgrade that was not asked for, or to a secret's host")
            c_writer.write(redact.whole(raw_answer))
            await c_writer.drain()
            if status == b"101":  # an upgrade asked for, to a host no secret goes to
                await asyncio.gather(_pipe(c_reader, u_writer), _pipe(u_reader, c_writer, redact))
                return
            if method == b"HEAD" or status in (b"204", b"304"):
                answer_framing: tuple[str, int] = ("length", 0)
            else:
                answer_framing = framing(answer)
            await _copy_body(u_reader, c_writer, answer_framing, redact)
            await body
        except Malformed:
            return  # the upstream's answer could be read two ways: the connection ends
        finally:
            if not body.done():
                body.cancel()
        closing = _closes(head) or _closes(answer)
        if closing or answer_framing[0] == "close" or not head.start.endswith(b"HTTP/1.1"):
            return


def _closes(head: Head) -> bool:
    """Whether a message's `Connection` fields (any number, comma-separated) say `close`."""
    tokens = {t.strip().lower() for v in head.get(b"connection") for t in v.split(b",")}
    return b"close" in tokens


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, redact: Redactor | None = None
) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(redact.feed(data) if redact is not None else data)
            await writer.drain()
        if redact is not None:
            writer.write(redact.flush())
    except (ConnectionError, OSError):
        pass
