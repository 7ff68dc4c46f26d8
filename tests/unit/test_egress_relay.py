"""The relay between a session's kernel and the egress proxy, against a stand-in for
squid on a Unix socket (the real squid is tested in tests/integration/test_egress.py)."""

from __future__ import annotations

import asyncio
import base64
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernel_gateway.kernels.egress.relay import Decision, Relay


class StandIn:
    """Answers each connection with `answer`, then echoes what follows; keeps the heads."""

    def __init__(self, path: Path, answer: bytes) -> None:
        self.path = path
        self.answer = answer
        self.heads: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(self.answer)
        while data := await reader.read(1024):
            writer.write(data.upper())
        writer.close()


STANDINS: list[asyncio.Server] = []


@pytest.fixture
async def folder() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kgrelay-") as name:  # short: socket paths
        yield Path(name)
    while STANDINS:
        server = STANDINS.pop()
        server.close()
        await server.wait_closed()


async def relay_to(folder: Path, answer: bytes) -> tuple[Relay, StandIn, list[Decision]]:
    squid = StandIn(folder / "squid.sock", answer)
    server = await asyncio.start_unix_server(squid.handle, path=str(squid.path))
    STANDINS.append(server)
    decisions: list[Decision] = []
    relay = Relay(folder / "egress.sock", squid.path, "s1", "secret", decisions.append)
    await relay.start()
    return relay, squid, decisions


async def exchange(relay: Relay, request: bytes, then: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(relay.listen))
    writer.write(request + then)
    writer.write_eof()
    answer = await reader.read()
    writer.close()
    return answer


async def test_a_tunnel_goes_through_as_the_session_whatever_the_kernel_claims(
    folder: Path,
) -> None:
    relay, squid, decisions = await relay_to(folder, b"HTTP/1.1 200 Connection established\r\n\r\n")
    answer = await exchange(
        relay,
        b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n"
        b"Proxy-Authorization: Basic c3RvbGVuOnN0b2xlbg==\r\n\r\n",
        b"tls bytes",
    )
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\nTLS BYTES"
    head = squid.heads[0].decode()
    own = base64.b64encode(b"s1:secret").decode()
    assert f"Proxy-Authorization: Basic {own}" in head and "c3RvbGVu" not in head
    assert decisions == [Decision("s1", "allowed.test", "CONNECT", "allowed")]
    await relay.close()
    assert not relay.listen.exists()


async def test_a_refusal_names_its_reason_in_the_status_line(folder: Path) -> None:
    refusal = (
        b"HTTP/1.1 403 Forbidden\r\nX-Squid-Error: ERR_KG_POLICY 0\r\nContent-Length: 0\r\n\r\n"
    )
    relay, _, decisions = await relay_to(folder, refusal)
    answer = await exchange(relay, b"GET http://other.test/x HTTP/1.1\r\nHost: other.test\r\n\r\n")
    status = answer.split(b"\r\n", 1)[0].decode()
    assert status.startswith("HTTP/1.1 403 Forbidden by network policy: other.test is not in")
    assert decisions[0].outcome == "refused" and decisions[0].host == "other.test"
    await relay.close()


async def test_squids_failure_to_reach_an_allowed_host_is_a_failure_not_a_refusal(
    folder: Path,
) -> None:
    failure = b"HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_DNS_FAIL 0\r\n\r\n"
    relay, _, decisions = await relay_to(folder, failure)
    answer = await exchange(relay, b"CONNECT gone.test:443 HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable")
    assert decisions == [Decision("s1", "gone.test", "CONNECT", "failed", "ERR_DNS_FAIL")]
    await relay.close()


async def test_what_is_not_a_proxy_request_never_reaches_the_proxy(folder: Path) -> None:
    relay, squid, decisions = await relay_to(folder, b"HTTP/1.1 200 OK\r\n\r\n")
    for request in (b"hello\r\n\r\n", b"GET /local HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01"):
        answer = await exchange(relay, request)
        assert answer.startswith(b"HTTP/1.1 400 Bad Request"), answer
    assert squid.heads == [] and decisions == []
    await relay.close()


async def test_without_the_proxy_the_kernel_is_told_at_once(folder: Path) -> None:
    decisions: list[Decision] = []
    relay = Relay(folder / "egress.sock", folder / "missing.sock", "s1", "x", decisions.append)
    await relay.start()
    answer = await exchange(relay, b"CONNECT a.test:443 HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 502 Bad Gateway")
    assert decisions[0].outcome == "failed"
    await relay.close()


async def test_a_head_with_a_bare_line_feed_is_refused(folder: Path) -> None:
    """A bare LF could hide a Proxy-Authorization line from the relay and show it to squid."""
    relay, squid, _ = await relay_to(folder, b"HTTP/1.1 200 OK\r\n\r\n")
    smuggled = (
        b"GET http://allowed.test/ HTTP/1.1\r\nX: y\nProxy-Authorization: Basic b3RoZXI6eA==\r\n"
        b"Host: allowed.test\r\n\r\n"
    )
    answer = await exchange(relay, smuggled)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request") and squid.heads == []
    await relay.close()


async def test_one_session_cannot_hold_more_than_its_share_of_connections(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernel_gateway.kernels.egress import relay as relay_module

    monkeypatch.setattr(relay_module, "MAX_CONNECTIONS", 2)
    relay, _, decisions = await relay_to(folder, b"HTTP/1.1 200 OK\r\n\r\n")
    held = [await asyncio.open_unix_connection(str(relay.listen)) for _ in range(2)]
    await asyncio.sleep(0.05)  # both accepted, each waiting for its request head
    reader, writer = await asyncio.open_unix_connection(str(relay.listen))
    assert (await reader.read()).startswith(b"HTTP/1.1 429")
    assert decisions[-1].outcome == "refused"
    writer.close()
    for _, w in held:
        w.close()
    await relay.close()
