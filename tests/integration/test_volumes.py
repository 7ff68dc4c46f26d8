"""Volumes through the API on real Docker kernels: a disk that outlives sessions, mounted by
several at once, capped, seen only where mounted, kept across kernel restarts, forks and
gateway restarts; bad input answered with clear errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kernel_gateway.client import AsyncClient, Client, VolumeInUseError, VolumeNotFoundError
from tests.support.api import execute
from tests.support.backends import require_docker
from tests.support.processes import gateway
from tests.support.server import ServerFactory, ServerThread


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("docker", max_volumes=3, max_sessions=8)


@pytest.fixture
def api(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client
        for session in client.get("/sessions").json()["sessions"]:
            client.delete(f"/sessions/{session['id']}")
        for volume in client.get("/volumes").json()["volumes"]:
            assert client.delete(f"/volumes/{volume['id']}").status_code == 204


def test_a_volume_outlives_sessions_and_is_shared_by_them(api: httpx.Client) -> None:
    made = api.post("/volumes", json={"name": "shared", "size": "64m"})
    assert made.status_code == 201, made.text
    volume = made.json()
    assert volume["name"] == "shared" and volume["size"] == 64 * 2**20 and volume["capped"]
    assert api.put("/volumes/shared/files/in/seed.txt", content=b"from the API").status_code == 201

    writer = api.post("/sessions", json={"volumes": {"shared": "/mnt/data"}}).json()
    assert writer["volumes"] == {"/mnt/data": "shared"}
    code = "print(open('/mnt/data/in/seed.txt').read()); open('/mnt/data/out.txt', 'w').write('42')"
    assert execute(api, writer["id"], code).stdout == "from the API\n"
    # A second session mounts the same volume elsewhere and sees the first one's write.
    reader = api.post("/sessions", json={"volumes": {volume["id"]: "/home/sandbox/cache"}}).json()
    seen = execute(api, reader["id"], "print(open('/home/sandbox/cache/out.txt').read())")
    assert seen.stdout == "42\n"
    # A session without it sees nothing of it.
    other = api.post("/sessions").json()["id"]
    look = (
        "import os, glob\n"
        "roots = ('/mnt', '/srv', '/data', '/workspace', '/home', '/tmp', '/var')\n"
        "found = [p for r in roots for p in glob.glob(r + '/**/out.txt', recursive=True)]\n"
        "print(os.path.exists('/mnt/data'), found)"
    )
    assert execute(api, other, look).stdout == "False []\n"

    listed = api.get("/volumes/shared").json()
    assert listed["mounted_by"] == {writer["id"]: "/mnt/data", reader["id"]: "/home/sandbox/cache"}
    refused = api.delete("/volumes/shared")
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "volume_in_use"

    # A restarted kernel mounts it again.
    assert api.post(f"/sessions/{writer['id']}/restart").status_code == 200
    assert execute(api, writer["id"], "print(open('/mnt/data/out.txt').read())").stdout == "42\n"

    api.delete(f"/sessions/{writer['id']}")
    api.delete(f"/sessions/{reader['id']}")
    entries = api.get("/volumes/shared/entries", params={"depth": 2}).json()["entries"]
    assert {e["path"] for e in entries} == {"in", "in/seed.txt", "out.txt"}
    assert api.get("/volumes/shared/files/out.txt").content == b"42"
    assert api.delete("/volumes/shared/files/in").status_code == 204
    assert api.delete("/volumes/shared").status_code == 204
    assert api.get("/volumes/shared").status_code == 404


def test_a_volume_is_capped_and_a_full_one_harms_no_session(api: httpx.Client) -> None:
    api.post("/volumes", json={"name": "small", "size": 32 * 2**20})
    sid = api.post("/sessions", json={"volumes": {"small": "/data/small"}}).json()["id"]
    code = (
        "try:\n"
        "    open('/data/small/big', 'wb').write(b'0' * 64_000_000)\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
        "open('kept.txt', 'w').write('the session disk is not the volume')\n"
        "print(open('kept.txt').read())\n"
    )
    out = execute(api, sid, code)
    assert out.stdout == "refused 28\nthe session disk is not the volume\n"
    used = api.get("/volumes/small").json()["used"]
    assert used <= 32 * 2**20


def test_forks_and_snapshots_mount_the_volume_itself(api: httpx.Client) -> None:
    api.post("/volumes", json={"name": "common"})
    sid = api.post("/sessions", json={"volumes": {"common": "/mnt/common"}}).json()["id"]
    execute(api, sid, "open('/mnt/common/a.txt', 'w').write('one'); x = 7")
    forks = api.post(f"/sessions/{sid}/fork", json={"count": 1}).json()["forks"]
    fork = forks[0]["session"]
    assert fork["volumes"] == {"/mnt/common": "common"}
    execute(api, fork["id"], "open('/mnt/common/b.txt', 'w').write('two')")
    seen = execute(api, sid, "import os; print(sorted(os.listdir('/mnt/common')), x)")
    assert seen.stdout == "['a.txt', 'b.txt'] 7\n"

    snapshot = api.post(f"/sessions/{sid}/snapshots").json()
    started = api.post(
        "/sessions", json={"snapshot": snapshot["id"], "volumes": {"common": "/srv/c"}}
    ).json()
    out = execute(api, started["id"], "import os; print(sorted(os.listdir('/srv/c')), x)")
    assert out.stdout == "['a.txt', 'b.txt'] 7\n"  # the volume as it is now, not a copy
    api.delete(f"/snapshots/{snapshot['id']}")


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        ({"name": "bad name"}, 422, "invalid_request"),
        ({"name": "x", "size": "lots"}, 422, "invalid_request"),
        ({"name": "x", "size": "1t"}, 403, "forbidden"),
        ({"name": "x", "size": 0}, 422, "invalid_request"),
        ({"name": "x", "extra": 1}, 422, "invalid_request"),
    ],
)
def test_bad_volumes_are_refused(
    api: httpx.Client, body: dict[str, object], status: int, kind: str
) -> None:
    answer = api.post("/volumes", json=body)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["type"] == kind


def test_bad_mounts_and_limits_are_refused(api: httpx.Client) -> None:
    assert api.post("/volumes", json={"name": "one"}).status_code == 201
    taken = api.post("/volumes", json={"name": "one"})
    assert taken.status_code == 409
    for path in ("/usr/lib/x", "/proc/x", "relative", "/tmp", "/workspace", "/opt/venv/x"):
        answer = api.post("/sessions", json={"volumes": {"one": path}})
        assert answer.status_code == 400, (path, answer.text)
    api.post("/volumes", json={"name": "two"})
    overlap = api.post("/sessions", json={"volumes": {"one": "/mnt/a", "two": "/mnt/a/b"}})
    assert overlap.status_code == 400 and "overlap" in overlap.json()["error"]["message"]
    missing = api.post("/sessions", json={"volumes": {"nothing": "/mnt/x"}})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "volume_not_found"
    api.post("/volumes", json={"name": "three"})
    full = api.post("/volumes", json={"name": "four"})
    assert full.status_code == 429 and full.json()["error"]["type"] == "too_many_volumes"
    assert api.get("/volumes/one/files/nothing").status_code == 404
    assert api.get("/volumes/one/entries", params={"depth": "0"}).status_code == 400
    assert api.put("/volumes/one/files/../escape", content=b"x").status_code in (400, 403, 404)
    assert len(api.get("/sessions").json()["sessions"]) == 0  # nothing half-made


def test_volumes_and_their_sessions_survive_a_restart(tmp_path: Path) -> None:
    require_docker()
    with gateway(tmp_path, "--backend", "docker", "--pool-size", "0", "--persist-sessions") as gw:
        with gw.client(timeout=120) as c:
            c.post("/volumes", json={"name": "durable", "size": "32m"})
            sid = c.post("/sessions", json={"volumes": {"durable": "/mnt/d"}}).json()["id"]
            execute(c, sid, "open('/mnt/d/before.txt', 'w').write('kept')")
        gw.restart()
        with gw.client(timeout=120) as c:
            assert [v["name"] for v in c.get("/volumes").json()["volumes"]] == ["durable"]
            assert c.get(f"/sessions/{sid}").json()["volumes"] == {"/mnt/d": "durable"}
            out = execute(c, sid, "print(open('/mnt/d/before.txt').read())")
            assert out.stdout == "kept\n"
            assert c.post(f"/sessions/{sid}/restart").status_code == 200  # mounts it again
            assert execute(c, sid, "import os; print(os.listdir('/mnt/d'))").stdout == (
                "['before.txt']\n"
            )
            c.delete(f"/sessions/{sid}")
            assert c.delete("/volumes/durable").status_code == 204


def test_the_client_makes_mounts_and_deletes_volumes(server: ServerThread) -> None:
    with Client(server.url) as client:
        volume = client.create_volume("from-client", "32m")
        assert client.volume("from-client")["id"] == volume["id"]
        client.write_volume_file("from-client", "a/b.txt", b"bytes")
        with client.session(volumes={"from-client": "/mnt/c"}) as session:
            assert session.run("print(open('/mnt/c/a/b.txt').read())").stdout == "bytes\n"
            with pytest.raises(VolumeInUseError):
                client.delete_volume("from-client")
        assert [e["path"] for e in client.volume_entries("from-client", "a")] == ["a/b.txt"]
        assert client.read_volume_file("from-client", "a/b.txt") == b"bytes"
        client.delete_volume_file("from-client", "a")
        client.delete_volume(volume["id"])
        with pytest.raises(VolumeNotFoundError):
            client.volume("from-client")


async def test_the_async_client_does_the_same(server: ServerThread) -> None:
    async with AsyncClient(server.url) as client:
        await client.create_volume("from-async")
        async with client.session(volumes={"from-async": "/data/x"}) as session:
            await session.run("open('/data/x/made', 'w').write('async')")
        assert await client.read_volume_file("from-async", "made") == b"async"
        assert [v["name"] for v in await client.volumes()] == ["from-async"]
        await client.delete_volume("from-async")
