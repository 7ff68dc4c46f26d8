"""Bearer tokens: every route but /health needs one; wrong and missing look the same."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.backends import settings_for
from tests.support.server import ServerFactory, ServerThread

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("local", token=TOKEN, pool_size=0)


@pytest.fixture
def anon(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/sessions"),
        ("GET", "/sessions"),
        ("GET", "/sessions/x"),
        ("DELETE", "/sessions/x"),
        ("POST", "/sessions/x/execute"),
        ("POST", "/sessions/x/interrupt"),
        ("POST", "/sessions/x/restart"),
        ("GET", "/no/such/route"),
        ("GET", "/api/kernels"),
        ("POST", "/api/kernels"),
        ("POST", "/mcp"),
    ],
)
@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer wrong",
        "Bearer " + TOKEN[:-1],
        "Basic " + TOKEN,
        TOKEN,
        "Bearer",
        "token wrong",
        "token",
    ],
)
def test_requests_without_the_token_get_401(
    anon: httpx.Client, method: str, path: str, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    response = anon.request(method, path, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {
        "error": {"type": "unauthorized", "message": "missing or invalid token"}
    }


def test_health_is_public(anon: httpx.Client) -> None:
    assert anon.get("/health").json()["status"] == "ok"


def test_the_right_token_works(server: ServerThread, tmp_path: Path) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, timeout=60, headers=headers) as c:
        sid = c.post("/sessions").json()["id"]
        body = c.post(
            f"/sessions/{sid}/execute",
            json={"code": "print(2)"},
            headers={"Accept": "application/json"},
        ).json()
        assert body["stdout"] == "2\n"
        assert c.delete(f"/sessions/{sid}").status_code == 204
    # Jupyter clients send the same token as `Authorization: token …`.
    jupyter = {"Authorization": f"token {TOKEN}"}
    assert httpx.get(f"{server.url}/api/kernels", headers=jupyter).status_code == 200


# -- without a token: only loopback Host names are answered (DNS rebinding) -----------------


@pytest.fixture(scope="module")
def tokenless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    settings = settings_for("local", tmp_path_factory.mktemp("open"), pool_size=0)
    with ServerThread(settings) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        yield c


REBINDING_HOSTS = [
    "127.0.0.1.attacker.example",
    "127.0.0.1.attacker.example:8888",
    "127.attacker.example",
    "localhost.attacker.example",
    "attacker.example",
    "attacker.example:8888",
    "evil.localhost",
    "localhost@attacker.example",
    "127.1",  # legacy IPv4 spellings: browsers never send them (they canonicalise)
    "0x7f.0.0.1",
    "2130706433",
    "0177.0.0.1",
    "128.0.0.1",
    "0.0.0.0",
    "::1",  # an IPv6 literal must be bracketed in Host
    "[::2]",
    "[::1",
    "[fe80::1%25eth0]",
    "[::1]x",
    "localhost:http",
    "localhost:88:88",
    "",
]
LOOPBACK_HOSTS = [
    "localhost",
    "LocalHost:8888",
    "localhost.",
    "localhost.:8888",
    "127.0.0.1",
    "127.0.0.1:8888",
    "127.0.0.1.",
    "127.255.1.2:80",
    "[::1]",
    "[::1]:8888",
    "[0:0:0:0:0:0:0:1]:8888",
    "[::ffff:127.0.0.1]:8888",
]


@pytest.mark.parametrize("host", REBINDING_HOSTS)
def test_a_tokenless_gateway_refuses_other_host_names(tokenless: httpx.Client, host: str) -> None:
    response = tokenless.post("/sessions", headers={"Host": host})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "bad_request"
    assert "not a loopback name" in response.json()["error"]["message"]


@pytest.mark.parametrize("host", LOOPBACK_HOSTS)
def test_a_tokenless_gateway_answers_loopback_names(tokenless: httpx.Client, host: str) -> None:
    response = tokenless.get("/sessions", headers={"Host": host})
    assert response.status_code == 200, response.text


def test_a_tokenless_gateway_refuses_a_request_without_host(tokenless: httpx.Client) -> None:
    host, port = str(tokenless.base_url.host), tokenless.base_url.port
    assert port is not None
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(b"POST /sessions HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
        reply = b"".join(iter(lambda: sock.recv(65536), b""))
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    assert b"not a loopback name" in reply


def test_a_tokenless_gateway_creates_sessions_for_localhost(tokenless: httpx.Client) -> None:
    response = tokenless.post("/sessions", headers={"Host": "localhost:8888"})
    assert response.status_code == 201, response.text
    assert tokenless.delete(f"/sessions/{response.json()['id']}").status_code == 204


# -- WebSocket handshakes: the same Host rules, and no other origin ---------------------------


def _handshake(client: httpx.Client, headers: dict[str, str]) -> int:
    """The status a WebSocket handshake to an unknown kernel's channels gets."""
    import asyncio

    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    url = str(client.base_url).replace("http", "ws", 1) + "/api/kernels/nope/channels"

    async def attempt() -> int:
        try:
            async with connect(url, additional_headers=headers, open_timeout=30):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    return asyncio.run(attempt())


def test_websocket_handshakes_follow_the_host_and_origin_rules(tokenless: httpx.Client) -> None:
    own = f"http://{tokenless.base_url.host}:{tokenless.base_url.port}"
    assert _handshake(tokenless, {}) == 404  # allowed through: the kernel does not exist
    assert _handshake(tokenless, {"Origin": own}) == 404
    assert _handshake(tokenless, {"Origin": "http://attacker.example"}) == 403
    assert _handshake(tokenless, {"Origin": "null"}) == 403
    # A rebinding Host (sent by hand: WebSocket clients always write their own Host).
    host, port = str(tokenless.base_url.host), tokenless.base_url.port
    assert port is not None
    request = (
        "GET /api/kernels/nope/channels HTTP/1.1\r\nHost: attacker.example\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(request.encode())
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 400 "), reply
