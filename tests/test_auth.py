"""Bearer tokens: every route but /health needs one; wrong and missing look the same."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import settings_for
from .helpers import ServerThread

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    settings = settings_for("local", tmp_path_factory.mktemp("auth"), token=TOKEN, pool_size=0)
    with ServerThread(settings) as s:
        yield s


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
    ],
)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", "Bearer " + TOKEN[:-1], "Basic " + TOKEN, TOKEN, "Bearer"],
)
def test_requests_without_the_token_get_401(
    anon: httpx.Client, method: str, path: str, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    response = anon.request(method, path, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {
        "error": {"type": "unauthorized", "message": "missing or invalid bearer token"}
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
