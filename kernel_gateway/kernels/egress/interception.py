"""HTTPS opened by the relay, for a session that uses secrets: placeholders become values
only on their way to the secrets' own domains.

After the egress proxy allowed a CONNECT, the relay (`relay.py`) answers the sandbox as the
host it asked for (a certificate of the gateway's CA, `authority.py`), opens its own TLS
connection to the real host through the same tunnel (verified against the system's CAs
and `--egress-ca-file`), and passes HTTP/1.1 requests one at a time:

- a request head holding a placeholder (`kg-secret:NAME`, `${e2b.secrets.NAME}`) of a
  secret whose domains cover the host has it replaced by the value; a placeholder of any
  other secret, or one in the request line (URLs are logged everywhere), is refused with
  403 and nothing reaches the host;
- a secret with a `header` is added as that header to requests to its domains that do not
  carry it already;
- a request that got a value asks for an uncompressed answer, and any value in that
  answer (headers and body) is replaced by as many `*`: an echo does not bring it back
  into the sandbox. Best effort: a value the host sends back transformed (encoded, split
  across a compressed body it sends anyway, hashed) is not recognized.

Not handled: HTTP/2 (the sandbox is offered HTTP/1.1 only), placeholders in bodies (sent
as they are), `Upgrade` (WebSockets: the connection is passed through after the answer).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass

from kernel_gateway.in_proxy.policy import matches
from kernel_gateway.tenants.secrets import Opened

HEAD_LIMIT = 64 * 1024
CHUNK = 64 * 1024
HEAD_SECONDS = 300.0
"""How long a kept-alive connection may wait for its next request."""
PLACEHOLDERS = re.compile(
    rb"kg-secret:([A-Za-z_][A-Za-z0-9_]{0,127})|\$\{e2b\.secrets\.([A-Za-z_][A-Za-z0-9_]{0,127})\}"
)


class Refused(Exception):
    """The request may not go: the reason, for the sandbox and the log."""


@dataclass
class Rewritten:
    head: bytes
    used: list[Opened]
    """The secrets whose values it now carries."""


def covers(secret: Opened, host: str) -> bool:
    return any(matches(pattern, host) for pattern in secret.domains)


def rewrite(head: bytes, host: str, secrets: list[Opened]) -> Rewritten:
    """The request head with placeholders replaced (and headers added) for `host`; Refused
    when it sends a placeholder where it may not go."""
    lines = head[:-4].split(b"\r\n")
    by_name = {s.name: s for s in secrets}
    if PLACEHOLDERS.search(lines[0]):
        raise Refused("a secret's placeholder in the request's URL: secrets go in headers only")
    used: dict[str, Opened] = {}
    out = [lines[0]]
    present: set[bytes] = set()
    for line in lines[1:]:
        name, _, _ = line.partition(b":")
        present.add(name.strip().lower())

        def substitute(match: re.Match[bytes]) -> bytes:
            wanted = (match.group(1) or match.group(2)).decode()
            secret = by_name.get(wanted)
            if secret is None:
                raise Refused(f"the placeholder of {wanted!r}, a secret this session does not have")
            if not covers(secret, host):
                raise Refused(
                    f"the secret {wanted!r} may be sent only to {', '.join(secret.domains)}, "
                    f"not {host}"
                )
            used[wanted] = secret
            return secret.value.encode()

        out.append(PLACEHOLDERS.sub(substitute, line))
    for secret in secrets:
        if secret.header and covers(secret, host) and secret.header.lower().encode() not in present:
            value = secret.format.replace("{value}", secret.value)
            out.append(f"{secret.header}: {value}".encode())
            used[secret.name] = secret
    if used:  # an answer we can read, to take the values out of it
        out = [ln for ln in out if not ln.lower().startswith(b"accept-encoding:")]
        out.append(b"Accept-Encoding: identity")
    return Rewritten(b"\r\n".join(out) + b"\r\n\r\n", list(used.values()))


class Redactor:
    """Replaces each value in a stream of bytes by as many `*` (sizes kept), holding back
    the few bytes that could be the start of one split across chunks."""

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


Observer = Callable[[str, str], None]
"""(outcome, reason): a secret used, or refused."""


def _header(lines: list[bytes], name: bytes) -> bytes | None:
    for line in lines[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def _framing(lines: list[bytes]) -> tuple[str, int]:
    """How a message's body ends: ("length", n), ("chunked", 0) or ("close", 0)."""
    encoding = _header(lines, b"transfer-encoding")
    if encoding is not None and encoding.lower().split(b",")[-1].strip() == b"chunked":
        return "chunked", 0
    length = _header(lines, b"content-length")
    if length is not None:
        if not length.isdigit():
            raise Refused("a Content-Length that is not a number")
        return "length", int(length)
    return "close", 0


async def _copy_length(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int, redact: Redactor | None
) -> None:
    while size > 0:
        data = await reader.read(min(CHUNK, size))
        if not data:
            raise ConnectionError("the body ended early")
        size -= len(data)
        writer.write(redact.feed(data) if redact is not None else data)
        await writer.drain()
    if redact is not None:
        writer.write(redact.flush())


async def _copy_chunked(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, redact: Redactor | None
) -> None:
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers: dropped
                pass
            if redact is not None:
                held = redact.flush()
                if held:
                    writer.write(b"%x\r\n%s\r\n" % (len(held), held))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        if redact is not None:
            data = redact.feed(data)
        if data:
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()


async def _copy_to_close(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, redact: Redactor | None
) -> None:
    while data := await reader.read(CHUNK):
        writer.write(redact.feed(data) if redact is not None else data)
        await writer.drain()
    if redact is not None:
        writer.write(redact.flush())
    await writer.drain()


async def _copy_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    framing: tuple[str, int],
    redact: Redactor | None = None,
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
) -> None:
    """Requests from the sandbox to `host`, one at a time, until either side closes."""
    (c_reader, c_writer), (u_reader, u_writer) = client, upstream
    while True:
        try:
            head = await asyncio.wait_for(c_reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
        except (asyncio.IncompleteReadError, TimeoutError):
            return
        lines = head[:-4].split(b"\r\n")
        if head.count(b"\n") != head.count(b"\r\n") or len(lines[0].split(b" ")) != 3:
            c_writer.write(refusal(400, "Bad Request", "not an HTTP/1.1 request"))
            return
        try:
            current = secrets()
            rewritten = rewrite(head, host, current)
            request_framing = _framing(lines)
        except Refused as exc:
            observe("refused", f"{host}: {exc}")
            c_writer.write(refusal(403, "Forbidden by secrets policy", str(exc)))
            await c_writer.drain()
            return
        for secret in rewritten.used:
            observe("used", f"{secret.name} to {host}")
        method = lines[0].split(b" ")[0].upper()
        if request_framing[0] == "close":
            request_framing = ("length", 0)  # a request without a length has no body
        u_writer.write(rewritten.head)
        body = asyncio.ensure_future(_copy_body(c_reader, u_writer, request_framing))
        redact = Redactor([s.value for s in rewritten.used]) if rewritten.used else None
        try:
            while True:  # interim answers (100 Continue) go to the sandbox as they come
                answer = await u_reader.readuntil(b"\r\n\r\n")
                status = answer.split(b" ", 2)[1] if answer.count(b" ") else b""
                if not (status.startswith(b"1") and status != b"101"):
                    break
                c_writer.write(answer)
            a_lines = answer[:-4].split(b"\r\n")
            c_writer.write(redact.feed(answer) + redact.flush() if redact is not None else answer)
            await c_writer.drain()
            if status == b"101":  # an upgrade: from here on, bytes both ways
                await asyncio.gather(_pipe(c_reader, u_writer), _pipe(u_reader, c_writer))
                return
            if method == b"HEAD" or status in (b"204", b"304"):
                framing: tuple[str, int] = ("length", 0)
            else:
                framing = _framing(a_lines)
            await _copy_body(u_reader, c_writer, framing, redact)
            await body
        finally:
            if not body.done():
                body.cancel()
        closing = (_header(lines, b"connection") or b"").lower() == b"close" or (
            _header(a_lines, b"connection") or b""
        ).lower() == b"close"
        if closing or framing[0] == "close":
            return


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
