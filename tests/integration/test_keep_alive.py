"""Idle keep-alive connections: the gateway keeps one open for `--keep-alive-timeout`
seconds, longer than clients keep theirs pooled, so a client's next request never meets a
connection the gateway is closing that instant (uvicorn's own default, 5 s, raced E2B's
SDK, whose pool keeps a connection 90 s: a request after a 5 s pause was lost)."""

from __future__ import annotations

import socket
import time

from tests.support.server import ServerFactory

REQUEST = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"


def _answer(conn: socket.socket) -> bytes:
    """One response's head (and whatever of its body came with it): b"" once closed."""
    conn.sendall(REQUEST)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    time.sleep(0.2)  # the rest of a small body
    conn.setblocking(False)
    try:
        while conn.recv(65536):
            pass
    except BlockingIOError:
        pass
    conn.setblocking(True)
    return data


def test_an_idle_connection_outlives_a_pause_longer_than_uvicorns_default(
    servers: ServerFactory,
) -> None:
    server = servers("local")
    assert server.settings.keep_alive_timeout == 120.0  # the default
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        assert _answer(conn).startswith(b"HTTP/1.1 200")
        time.sleep(6)  # past uvicorn's 5 s
        assert _answer(conn).startswith(b"HTTP/1.1 200")


def test_the_setting_closes_idle_connections_when_it_says(servers: ServerFactory) -> None:
    server = servers("local", keep_alive_timeout=1)
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        assert _answer(conn).startswith(b"HTTP/1.1 200")
        time.sleep(2.5)
        conn.settimeout(5)
        assert conn.recv(1) == b""  # closed by the gateway
