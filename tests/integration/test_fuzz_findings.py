"""What fuzzing the gateway against its OpenAPI document found, each pinned after its fix.

Every case here was a request Schemathesis (or writing the document) turned up
that got a 500, an undocumented status, or an answer the document contradicts.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kernel_gateway.kernels import storage
from kernel_gateway.shapes.paths import MAX_NAME_BYTES
from tests.support.api import execute
from tests.support.server import ServerFactory, ServerThread


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("local", preload="")


@pytest.fixture
def api(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture
def sid(api: httpx.Client) -> Iterator[str]:
    session_id = api.post("/sessions").json()["id"]
    yield session_id
    api.delete(f"/sessions/{session_id}")


def stateless(api: httpx.Client, files: list[dict[str, str]]) -> httpx.Response:
    body = {"code": "1", "files": files}
    return api.post("/execute", json=body, headers={"Accept": "application/json"})


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/sessions", "GET, HEAD, POST"),
        ("/sessions/x", "DELETE, GET, HEAD"),
        ("/sessions/x/files/a/b", "DELETE, GET, HEAD, PUT"),
        ("/sessions/x/execute", "POST"),
    ],
)
def test_405_names_every_method_the_path_takes(api: httpx.Client, path: str, allowed: str) -> None:
    """Starlette's 405 named only the first route's methods (`Allow: POST` on /sessions)."""
    response = api.request("PATCH", path)
    assert response.status_code == 405
    assert response.headers["allow"] == allowed
    assert response.json()["error"]["type"] == "method_not_allowed"


def test_a_malformed_last_event_id_is_refused_even_beside_after(
    api: httpx.Client, sid: str
) -> None:
    execute(api, sid, "1")
    url = f"/sessions/{sid}/executions/1/events"
    response = api.get(url, params={"after": "0"}, headers={"Last-Event-ID": "s9o"})
    assert response.status_code == 422
    assert "Last-Event-ID" in response.json()["error"]["message"]
    assert api.get(url, params={"after": "0"}, headers={"Last-Event-ID": "7"}).status_code == 200


@pytest.mark.parametrize("after", ["\u0661\u0662", "\uff11", "1" * 19, "-1", "1.0"])
def test_only_ascii_event_ids_are_event_ids(api: httpx.Client, sid: str, after: str) -> None:
    """`str.isdecimal` took Arabic-Indic and full-width digits, which int() then read."""
    execute(api, sid, "1")
    response = api.get(f"/sessions/{sid}/executions/1/events", params={"after": after})
    assert response.status_code == 422


@pytest.mark.parametrize("execution_id", ["\u0661", "1" * 5000, "0", "99"])
def test_an_odd_execution_id_is_not_found_never_a_500(
    api: httpx.Client, sid: str, execution_id: str
) -> None:
    """5000 digits made int() raise (Python's digit limit): a 500."""
    execute(api, sid, "1")
    response = api.get(f"/sessions/{sid}/executions/{execution_id}/events")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "execution_not_found"


def test_a_lone_surrogate_in_a_stateless_file_path_is_invalid(api: httpx.Client) -> None:
    """It reached os.open, which cannot encode it: a 500."""
    response = api.post(
        "/execute",
        content=b'{"code": "1", "files": [{"path": "\\ud800", "data": ""}]}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 422
    assert "Unicode" in response.json()["error"]["message"]


def test_stateless_files_that_clash_are_invalid_not_404(api: httpx.Client) -> None:
    """A file where a later path needs a folder was a 404 "no file", undocumented there."""
    empty = base64.b64encode(b"").decode()
    clash = stateless(api, [{"path": "a", "data": empty}, {"path": "a/b", "data": empty}])
    assert clash.status_code == 422
    assert "files[1]" in clash.json()["error"]["message"]
    folder = stateless(api, [{"path": "a/b", "data": empty}, {"path": "a", "data": empty}])
    assert folder.status_code == 422
    assert stateless(api, [{"path": "./x/./y", "data": empty}]).json()["status"] == "ok"


def test_names_longer_than_the_filesystem_allows_are_refused_clearly(
    api: httpx.Client, sid: str
) -> None:
    longest = "n" * MAX_NAME_BYTES
    assert api.put(f"/sessions/{sid}/files/d/{longest}", content=b"x").status_code == 201
    for name in ("n" * (MAX_NAME_BYTES + 1), "\u00e9" * 128):  # 256 bytes either way
        response = api.put(f"/sessions/{sid}/files/d/{name}", content=b"x")
        assert response.status_code == 400
        assert "255 bytes" in response.json()["error"]["message"]
        assert stateless(api, [{"path": name, "data": ""}]).status_code == 422


def test_a_folder_where_a_file_is_expected_is_a_conflict_or_missing(
    api: httpx.Client, sid: str
) -> None:
    """These were 400 Bad Request, for a request that is well formed."""
    assert api.put(f"/sessions/{sid}/files/dir/f.txt", content=b"x").status_code == 201
    for path in ("dir", "dir/"):
        put = api.put(f"/sessions/{sid}/files/{path}", content=b"y")
        assert put.status_code == 409, put.text
        assert put.json()["error"]["type"] == "conflict"
        assert api.delete(f"/sessions/{sid}/files/{path}").status_code == 409
        assert api.get(f"/sessions/{sid}/files/{path}").status_code == 404
    assert api.get(f"/sessions/{sid}/files/dir/f.txt").content == b"x"


def test_a_loop_device_freed_by_autoclear_during_detach_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fuzzing logged "releasing the storage failed" and left the image: `losetup -d`
    lost a race with autoclear (ENXIO) right after the unmount."""
    root = tmp_path / "w"
    root.mkdir()
    image = storage.image_path(root)
    image.write_bytes(b"disk")
    monkeypatch.setattr(storage, "loop_devices_of", lambda match: ["/dev/loop99"])

    def losetup_fails(*argv: str) -> None:
        raise OSError(6, "losetup: /dev/loop99: detach failed: No such device or address")

    monkeypatch.setattr(storage, "run_command", losetup_fails)
    monkeypatch.setattr(storage, "attached", lambda device, backing=None: False)
    storage.LoopStorage.release(object.__new__(storage.LoopStorage), root)
    assert not image.exists()

    image.write_bytes(b"disk")  # still attached after the failure: a real error, image gone
    monkeypatch.setattr(storage, "attached", lambda device, backing=None: True)
    with pytest.raises(OSError):
        storage.LoopStorage.release(object.__new__(storage.LoopStorage), root)
    assert not image.exists()

    # Freed, then at once taken by another session's disk: attached, but not to ours.
    image.write_bytes(b"disk")
    ours = image.resolve()
    monkeypatch.setattr(storage, "attached", lambda device, backing=None: backing != ours)
    storage.LoopStorage.release(object.__new__(storage.LoopStorage), root)
    assert not image.exists()
