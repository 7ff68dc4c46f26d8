"""The relay between one session's kernel and the egress proxy.

The kernel's forwarder (`in_kernel/egress_forward.py`) connects to a Unix socket in the
kernel's own folder; the relay listens there, for that session only. Each connection
carries one request (squid closes client connections after one): the relay reads its
head, removes any `Proxy-Authorization` the kernel sent and adds the session's own (so a
kernel never holds credentials, and no kernel can speak for another: the socket it can
reach says which session it is), passes it to squid, and reads squid's answer head to
learn the decision (squid marks its own answers with `X-Squid-Error`). A refusal's status
line gets the reason, where clients that print no body (a failed CONNECT) print it. Then
bytes flow both ways untouched.

Not a proxy: no HTTP semantics beyond one request head and one response head per
connection; squid decides everything. Except for a session that uses secrets
(`Interception`): its CONNECTs, once squid allowed them, are opened here and their
requests passed one at a time (`interception.py`), and a plain-HTTP request carrying a
secret's placeholder is refused (secrets travel over TLS only).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from kernel_gateway.kernels.egress import interception
from kernel_gateway.kernels.egress.authority import Authority
from kernel_gateway.tenants.secrets import Opened

logger = logging.getLogger(__name__)

HEAD_LIMIT = 64 * 1024
MAX_CONNECTIONS = 32
"""Connections one session may have open through the proxy at once (the proxy's own
processes and the gateway's descriptors are shared by every session)."""
REQUEST_HEAD_SECONDS = 30.0
CHUNK = 64 * 1024
REFUSALS = {
    "ERR_KG_POLICY": "is not in this {owner}'s network allowlist",
    "ERR_KG_PRIVATE": "resolves to a private, loopback or link-local address",
    "ERR_KG_LITERAL": "is an IP address: only allowlisted domain names",
    "ERR_KG_PORT": "only ports 80 and 443",
    "ERR_ACCESS_DENIED": "refused by the egress proxy",
    "ERR_CACHE_ACCESS_DENIED": "refused by the egress proxy",
}
"""squid's refusals (a decision), by the error it names; any other error it names is a
failure to reach an allowed host (DNS, connect, timeout)."""


@dataclass(frozen=True)
class Decision:
    """What became of one connection: `allowed`, `refused` or `failed`, and why."""

    session_id: str
    host: str
    method: str
    outcome: str
    reason: str | None = None


Observer = Callable[[Decision], None]


@dataclass(frozen=True)
class Interception:
    """What a relay needs to open a session's HTTPS and put its secrets in: the CA it shows
    the sandbox, how it verifies the real hosts, the session's secrets as they are now."""

    authority: Authority
    upstream_tls: ssl.SSLContext
    secrets: Callable[[], list[Opened]]
    rules: tuple[interception.Rule, ...] = ()


class Relay:
    """Listens at `listen` for one session's kernel; hands each connection to the proxy
    at `upstream` as `user` (with `secret`)."""

    def __init__(
        self,
        listen: Path,
        upstream: Path,
        user: str,
        secret: str,
        observe: Observer,
        owner: str = "session",
        intercept: Interception | None = None,
    ) -> None:
        self.listen = listen
        self.intercept = intercept
        """Set for a session that uses secrets (it may change: a session's secrets can)."""
        self.transferred = 0
        """Bytes passed each way since it started (requests, answers, TLS: all of it)."""
        self.owner = owner
        """Whose allowlist a refusal names: a session's, or a template build's."""
        self._upstream = upstream
        self._user = user
        token = base64.b64encode(f"{user}:{secret}".encode()).decode()
        self._authorization = f"Proxy-Authorization: Basic {token}".encode()
        self._observe = observe
        self._server: asyncio.AbstractServer | None = None
        self._folder: int | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        # A descriptor of the socket's folder of the relay's own: it removes its socket
        # there at the end, even after whoever gave `listen` has closed theirs.
        self._folder = os.open(self.listen.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.listen.name, dir_fd=self._folder)  # left by a gateway before this one
        self._server = await asyncio.start_unix_server(
            self._accept, path=f"/proc/self/fd/{self._folder}/{self.listen.name}", limit=HEAD_LIMIT
        )
        if os.geteuid() == 0:  # kernels run as another user; the folder is the gateway's own
            os.chmod(self.listen.name, 0o666, dir_fd=self._folder)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._folder is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.listen.name, dir_fd=self._folder)
            os.close(self._folder)
            self._folder = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= MAX_CONNECTIONS:  # one session cannot starve the others
            self._decided("?", "?", "refused", f"more than {MAX_CONNECTIONS} connections at once")
            writer.write(_answer(429, "Too Many Requests", "too many connections at once"))
            with contextlib.suppress(OSError):
                writer.close()
            return
        self._connections.add(task)
        try:
            await self._relay(reader, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._connections.discard(task)
            with contextlib.suppress(OSError):
                writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_HEAD_SECONDS)
        except (asyncio.LimitOverrunError, TimeoutError, asyncio.IncompleteReadError):
            writer.write(_answer(400, "Bad Request", "the request head is missing or too large"))
            return
        method, host = _target(head)
        if head.count(b"\n") != head.count(b"\r\n") or head.count(b"\r") != head.count(b"\r\n"):
            method = ""  # a bare CR or LF: parsers disagree on where a header starts
        if not method:
            writer.write(_answer(400, "Bad Request", "not an HTTP request to a proxy"))
            return
        intercept = self.intercept
        opened = intercept.secrets() if intercept is not None else []
        if opened and method != "CONNECT" and interception.PLACEHOLDERS.search(head):
            reason = "secrets are sent over HTTPS only"
            self._decided(method, host, "refused", reason)
            writer.write(_answer(403, "Forbidden by secrets policy", reason))
            return
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(
                str(self._upstream), limit=HEAD_LIMIT
            )
        except OSError:
            self._decided(method, host, "failed", "the egress proxy is not running")
            writer.write(_answer(502, "Bad Gateway", "the gateway's egress proxy is not running"))
            return
        try:
            up_writer.write(self._with_credentials(head))
            if opened and intercept is not None and method == "CONNECT":
                await self._intercepted(host, (reader, writer), (up_reader, up_writer), intercept)
                return
            outgoing = asyncio.ensure_future(_pump(reader, up_writer, self))  # a body, or TLS
            try:
                answer = await up_reader.readuntil(b"\r\n\r\n")
            except (asyncio.LimitOverrunError, asyncio.IncompleteReadError):
                self._decided(method, host, "failed", "no answer from the egress proxy")
                writer.write(_answer(502, "Bad Gateway", "the egress proxy gave no answer"))
                outgoing.cancel()
                return
            self.transferred += len(head) + len(answer)  # as the kernel and squid sent them
            writer.write(self._decide(method, host, answer))
            await writer.drain()
            await asyncio.gather(outgoing, _pump(up_reader, writer, self))
        finally:
            with contextlib.suppress(OSError):
                up_writer.close()

    async def _intercepted(
        self,
        host: str,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        intercept: Interception,
    ) -> None:
        """A CONNECT of a session with secrets: squid's decision, then TLS to the sandbox as
        `host` and TLS of our own to the real `host`, and the requests in between."""
        (reader, writer), (up_reader, up_writer) = client, upstream
        try:
            answer = await up_reader.readuntil(b"\r\n\r\n")
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            self._decided("CONNECT", host, "failed", "no answer from the egress proxy")
            writer.write(_answer(502, "Bad Gateway", "the egress proxy gave no answer"))
            return
        decided = self._decide("CONNECT", host, answer)
        if b" 200 " not in decided.split(b"\r\n", 1)[0] + b" ":
            writer.write(decided)
            return  # refused or failed: the sandbox has squid's answer
        # The certificate first: once the sandbox has the 200 its ClientHello may come at
        # any moment, and from then on nothing may read the connection but TLS.
        context = await asyncio.to_thread(intercept.authority.server_context, host)
        writer.write(decided)
        await writer.start_tls(context)
        try:
            await up_writer.start_tls(intercept.upstream_tls, server_hostname=host)
        except (ssl.SSLError, ssl.CertificateError, OSError) as exc:
            reason = f"TLS to {host} failed: {getattr(exc, 'verify_message', None) or exc}"
            self._decided("CONNECT", host, "failed", reason)
            with contextlib.suppress(asyncio.IncompleteReadError, TimeoutError, OSError):
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.write(interception.refusal(502, "Bad Gateway", reason))
            await writer.drain()
            return

        def observe(outcome: str, reason: str) -> None:
            self._decided("SECRET", host, "refused" if outcome == "refused" else "allowed", reason)

        try:
            await interception.exchange(
                (reader, writer),
                (up_reader, up_writer),
                host,
                intercept.secrets,
                observe,
                intercept.rules,
            )
        except (ConnectionError, OSError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError):
            pass  # either side went away
        except Exception as exc:  # never a traceback: its text could hold what went by
            logger.warning(
                "the egress relay's opened connection to %s failed (%s)", host, type(exc).__name__
            )

    def _with_credentials(self, head: bytes) -> bytes:
        lines = head[:-4].split(b"\r\n")
        kept = [ln for ln in lines if not ln.lower().startswith(b"proxy-authorization:")]
        return b"\r\n".join([*kept, self._authorization]) + b"\r\n\r\n"

    def _decide(self, method: str, host: str, answer: bytes) -> bytes:
        """Log and count squid's decision; the answer head, with the reason in its status
        line when squid refused."""
        lines = answer[:-4].split(b"\r\n")
        status = lines[0].split(b" ", 2)
        code = status[1].decode("latin-1") if len(status) > 1 else "?"
        error = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"x-squid-error":
                error = value.strip().split(b" ")[0].decode("latin-1")
        if error is None:
            self._decided(method, host, "allowed")
            return answer
        if error in REFUSALS:
            refusal = REFUSALS[error].format(owner=self.owner)
            reason = f"{host} {refusal}" if error != "ERR_KG_PORT" else refusal
            self._decided(method, host, "refused", reason)
            status_line = f"HTTP/1.1 {code} Forbidden by network policy: {reason}"
            return b"\r\n".join([status_line.encode("latin-1", "replace"), *lines[1:]]) + (
                b"\r\n\r\n"
            )
        self._decided(method, host, "failed", error)
        return answer

    def _decided(self, method: str, host: str, outcome: str, reason: str | None = None) -> None:
        try:
            self._observe(Decision(self._user, host, method, outcome, reason))
        except Exception:
            logger.exception("recording an egress decision failed")


def _target(head: bytes) -> tuple[str, str]:
    """The request's method and the host it asks for ("" and "" when it is not one)."""
    first = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = first.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return "", ""
    method, target = parts[0], parts[1]
    if method == "CONNECT":
        host = target.rsplit(":", 1)[0] if not target.startswith("[") else target
        return method, host.strip("[]").lower()
    split = urlsplit(target)
    if split.scheme in ("http", "https") and split.hostname:
        return method, split.hostname.lower()
    return "", ""


def _answer(code: int, reason: str, text: str) -> bytes:
    body = f"kernel-gateway egress: {text}\n".encode()
    return (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, relay: Relay | None = None
) -> None:
    try:
        while data := await reader.read(CHUNK):
            if relay is not None:
                relay.transferred += len(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
