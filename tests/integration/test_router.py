"""The routing tier on one machine: real node gateways (local backend) and real routers,
each its own process. What a multi-node swarm adds (engines, overlay, rolling updates)
is in tests/integration/cluster/.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from kernel_gateway.client import Client, NodeLostError, Stdout
from kernel_gateway.client._failover import Replicas
from kernel_gateway.cluster import placement
from kernel_gateway.cluster.directory import Node
from kernel_gateway.cluster.settings import NodeTarget, RouterSettings, from_env
from kernel_gateway.kernels.storage import reclaim
from kernel_gateway.settings import Settings
from kernel_gateway.settings import from_env as serve_settings
from tests.support.api import execute
from tests.support.backends import require_docker
from tests.support.processes import Gateway, gateway, router

TOKEN = "router-test-token"
FAST = ["--poll-interval", "0.3", "--node-lost-after", "3", "--node-wait", "2"]


@contextlib.contextmanager
def nodes(
    tmp_path: Path, *names: str, max_sessions: int = 2, extra: tuple[str, ...] = ()
) -> Iterator[list[Gateway]]:
    with contextlib.ExitStack() as stack:
        gws = []
        for name in names:
            folder = tmp_path / name
            folder.mkdir()
            key = folder / "secrets.key"  # each node seals with a key of its own
            key.write_bytes(os.urandom(32))
            gws.append(
                stack.enter_context(
                    gateway(
                        folder,
                        "--backend",
                        "local",
                        "--node-name",
                        name,
                        "--pool-size",
                        "1",
                        "--max-sessions",
                        str(max_sessions),
                        "--secrets-key-file",
                        str(key),
                        *extra,
                        token=TOKEN,
                    )
                )
            )
        yield gws


def _raw_get(gw: Gateway, path: str) -> bytes:
    """A GET sent byte for byte (no client library resolves its dot segments)."""
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        return sock.recv(65536)


def _wait_up(r: Gateway, count: int) -> None:
    """Until the router sees `count` nodes up (a busy node may miss its first poll)."""
    deadline = time.monotonic() + 30
    while True:
        nodes = httpx.get(r.url + "/health").json()["nodes"]
        if sum(n["state"] == "up" for n in nodes) == count:
            return
        assert time.monotonic() < deadline, nodes
        time.sleep(0.1)


def _node_of(session_id: str) -> str:
    return session_id.partition(".")[0]


def test_sessions_spread_and_capacity_is_the_sum(tmp_path: Path) -> None:
    with (
        nodes(tmp_path, "n1", "n2", max_sessions=3) as gws,
        router(tmp_path, [g.url.removeprefix("http://") for g in gws], *FAST, token=TOKEN) as r,
        r.client() as c,
    ):
        made = [c.post("/sessions") for _ in range(4)]
        assert [m.status_code for m in made] == [201] * 4
        ids = [m.json()["id"] for m in made]
        # The emptiest node first: two each, though either node had room for three.
        assert sorted(_node_of(i) for i in ids) == ["n1", "n1", "n2", "n2"]
        ids += [c.post("/sessions").json()["id"] for _ in range(2)]
        full = c.post("/sessions")
        assert full.status_code == 429
        assert full.json()["error"]["type"] == "too_many_sessions"
        assert full.headers["retry-after"]
        listed = c.get("/sessions").json()
        assert sorted(s["id"] for s in listed["sessions"]) == sorted(ids)
        time.sleep(0.8)  # a poll round: the nodes' own counts
        health = httpx.get(r.url + "/health").json()  # public, like a node's
        assert health["status"] == "ok" and health["role"] == "router"
        assert [(n["name"], n["state"], n["sessions"]) for n in health["nodes"]] == [
            ("n1", "up", 3),
            ("n2", "up", 3),
        ]
        assert health["capacity"]["max_sessions"] == 6
        for i in ids:
            assert c.delete(f"/sessions/{i}").status_code == 204
        assert c.post("/sessions").status_code == 201


def test_state_and_streams_through_alternating_routers(tmp_path: Path) -> None:
    with nodes(tmp_path, "n1", "n2") as gws:
        addresses = [g.url.removeprefix("http://") for g in gws]
        with (
            router(tmp_path, addresses, *FAST, token=TOKEN, name="r1") as r1,
            router(tmp_path, addresses, *FAST, token=TOKEN, name="r2") as r2,
            r1.client() as c1,
            r2.client() as c2,
        ):
            _wait_up(r1, 2)
            ids = [c1.post("/sessions").json()["id"] for _ in range(2)]
            assert {_node_of(i) for i in ids} == {"n1", "n2"}
            for sid in ids:
                assert execute(c1, sid, "x = 1").done["status"] == "ok"
                for step in range(2, 6):
                    client = c2 if step % 2 == 0 else c1
                    stream = execute(client, sid, "x += 1\nprint(x)")
                    assert stream.stdout == f"{step}\n"
            # Streams stay live through the router: the first line arrives long before
            # the last, not all at the end.
            code = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')"
            stream = execute(c2, ids[0], code)
            first_at = next(
                t for n, d, t in stream.events if n == "stdout" and "first" in d["text"]
            )
            assert stream.events[-1][2] - first_at > 1.0
            # ... and resumable from another router, with Last-Event-ID.
            answer = c1.post(
                f"/sessions/{ids[0]}/execute",
                json={"code": "print('a'); print('b', flush=True)"},
                headers={"Accept": "text/event-stream"},
            )
            location = answer.headers["content-location"]
            first_id = next(
                line.split(":", 1)[1].strip()
                for line in answer.text.splitlines()
                if line.startswith("id:")
            )
            resumed = c2.get(location, headers={"Last-Event-ID": first_id})
            assert resumed.status_code == 200
            assert "event: done" in resumed.text
            assert f"id: {first_id}\n" not in resumed.text
            # Files, with a name that must stay percent-encoded on its way through.
            name = "d%C3%A9j%C3%A0/a%20b%25.txt"
            put = c1.put(f"/sessions/{ids[1]}/files/{name}", content=b"x" * 70000)
            assert put.status_code == 201, put.text
            assert put.json()["path"] == "déjà/a b%.txt"
            got = c2.get(f"/sessions/{ids[1]}/files/{name}")
            assert got.content == b"x" * 70000
            code = "print(len(open('déjà/a b%.txt').read()))"
            assert execute(c2, ids[1], code).stdout == "70000\n"
            # A big upload streams through (not kept for a retry), chunked or not.
            big = b"y" * (3 * 1024 * 1024)
            assert c1.put(f"/sessions/{ids[1]}/files/big.bin", content=big).status_code == 201
            chunks = iter([big[:1000], big[1000:]])
            assert c2.put(f"/sessions/{ids[1]}/files/big2.bin", content=chunks).status_code == 201
            assert c1.get(f"/sessions/{ids[1]}/files/big2.bin").content == big
            # %2F is part of one name, never a folder: the router answers as the node does.
            holder = {"n1": gws[0], "n2": gws[1]}[_node_of(ids[1])]
            encoded = f"/sessions/{ids[1]}/files/d%C3%A9j%C3%A0%2Fa%20b%25.txt"
            with holder.client() as direct:
                assert c1.get(encoded).status_code == direct.get(encoded).status_code
            # Dot segments would become another route on the way: refused.
            for path in (f"/sessions/{ids[0]}/../../metrics", f"/sessions/{ids[0]}/%2e%2e/x"):
                assert _raw_get(r1, path).startswith(b"HTTP/1.1 400"), path
            # A GET with a stray body is no 500.
            assert c1.request("GET", f"/sessions/{ids[0]}", content=b"{}").status_code == 200
            time.sleep(3)  # past --node-lost-after: a node never met is no node of ours
            unknown = c1.get("/sessions/n9.0123abcd")
            assert unknown.status_code == 404
            assert unknown.json()["error"]["type"] == "session_not_found"
            assert c1.get("/sessions/nodot").status_code == 404
            assert c1.get("/sessions/a.b.c" + "d" * 300).status_code == 404
            assert c1.get("/sessions/a.b.c" + "d" * 300).status_code == 404
            assert c1.get("/sessions", headers={"Authorization": "Bearer wrong"}).status_code == 401


def _until(check: Callable[[], bool], what: str, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_keys_made_anywhere_reach_every_node_and_router(tmp_path: Path) -> None:
    """cluster/keys.py on one machine: a key made through one router is on every node when
    the answer comes and works through the other router at once; its session quota holds
    across nodes; a key made on one node alone (as E2B's `/api-keys` there does) reaches the
    other node and every router within polls; a revocation through one router is refused
    through the other; usage adds up the nodes'."""
    with nodes(tmp_path, "n1", "n2") as gws:
        addresses = [g.url.removeprefix("http://") for g in gws]
        with (
            router(tmp_path, addresses, *FAST, token=TOKEN, name="r1") as r1,
            router(tmp_path, addresses, *FAST, token=TOKEN, name="r2") as r2,
            r1.client() as admin,
        ):
            _wait_up(r1, 2)
            _wait_up(r2, 2)
            made = admin.post("/keys", json={"name": "agent", "quotas": {"max_sessions": 1}})
            assert made.status_code == 201, made.text
            key = made.json()
            for gw in gws:
                with gw.client() as direct:
                    assert direct.get(f"/keys/{key['id']}").status_code == 200
            bearer = {"Authorization": f"Bearer {key['secret']}"}
            with httpx.Client(base_url=r2.url, headers=bearer, timeout=60) as c:
                created = c.post("/sessions")
                assert created.status_code == 201, created.text
                sid = created.json()["id"]
                assert created.json()["owner"] == key["id"]
                refused = c.post("/sessions")  # the other node has room, the key has not
                assert refused.status_code == 429, refused.text
                assert refused.json()["error"]["type"] == "quota_exceeded"
                assert execute(c, sid, "print(6 * 7)").stdout == "42\n"
                assert c.post("/keys", json={"name": "x"}).status_code == 403
            with gws[0].client() as direct:
                alone = direct.post("/keys", json={"name": "made-on-n1"}).json()
            with gws[1].client() as direct:
                _until(
                    lambda: direct.get(f"/keys/{alone['id']}").status_code == 200,
                    "the key made on n1 reached n2",
                )
            with httpx.Client(
                base_url=r1.url, headers={"Authorization": f"Bearer {alone['secret']}"}
            ) as c:
                assert c.get("/sessions").json()["sessions"] == []  # none of the other key's
                assert c.get(f"/sessions/{sid}").status_code == 404
            with r2.client() as admin2:
                assert admin2.delete(f"/keys/{key['id']}").status_code == 204
            with httpx.Client(base_url=r1.url, headers=bearer, timeout=60) as c:
                assert c.get(f"/sessions/{sid}").status_code == 401
            used = admin.get(f"/keys/{key['id']}/usage").json()
            assert (used["sessions_created"], used["sessions_held"]) == (1, 1), used
            versions = {httpx.get(g.url + "/health").json()["keys"] for g in gws}
            assert len(versions) == 1
            # A path spelled so that only the node reads it as E2B's (`%65` is `e`) carries
            # no cluster token: the node asks for E2B's own key, as for `/e2b/`.
            for path in ("/%652b/sandboxes", "/%65%32b/v2/sandboxes"):
                sneaked = httpx.post(r1.url + path, json={"templateID": "base"}, timeout=30)
                assert sneaked.status_code == 401, (path, sneaked.text)
                listed = httpx.get(r1.url + path, timeout=30)
                assert listed.status_code == 401, (path, listed.text)
            assert [s["id"] for s in admin.get("/sessions").json()["sessions"]] == [sid]


def test_secrets_made_through_one_router_are_on_every_node(tmp_path: Path) -> None:
    """cluster/secrets.py: a secret made, rotated and deleted through either router is so on
    every node (each sealing it with its own key), with one id; E2B's `/secrets` too."""
    with nodes(tmp_path, "n1", "n2") as gws:
        addresses = [g.url.removeprefix("http://") for g in gws]
        with (
            router(tmp_path, addresses, *FAST, token=TOKEN, name="r1") as r1,
            router(tmp_path, addresses, *FAST, token=TOKEN, name="r2") as r2,
            r1.client() as one,
            r2.client() as two,
        ):
            _wait_up(r1, 2)
            _wait_up(r2, 2)
            body = {"name": "TOKEN_A", "value": "s3cr3t-value", "domains": ["api.example.org"]}
            made = one.post("/secrets", json=body)
            assert made.status_code == 201, made.text
            ids = set()
            for gw in gws:
                with gw.client() as direct:
                    shown = direct.get("/secrets/TOKEN_A").json()
                    ids.add(shown["id"])
                    assert shown["version"] == 1 and "s3cr3t" not in json.dumps(shown)
            assert ids == {made.json()["id"]}
            assert two.put("/secrets/TOKEN_A", json={"value": "r0tated"}).json()["version"] == 2
            for gw in gws:
                with gw.client() as direct:
                    assert direct.get("/secrets/TOKEN_A").json()["version"] == 2
            e2b = two.post(
                "/e2b/secrets", json={"name": "e2b-key", "value": "v"}, headers={"X-API-Key": TOKEN}
            )
            assert e2b.status_code == 201, e2b.text
            secret_id = e2b.json()["secretID"]
            for gw in gws:
                with gw.client() as direct:
                    assert (
                        direct.get(
                            f"/e2b/secrets/{secret_id}", headers={"X-API-Key": TOKEN}
                        ).status_code
                        == 200
                    )
            assert one.delete("/secrets/TOKEN_A").status_code == 204
            assert (
                one.delete(f"/e2b/secrets/{secret_id}", headers={"X-API-Key": TOKEN}).status_code
                == 204
            )
            for gw in gws:
                with gw.client() as direct:
                    assert direct.get("/secrets").json()["secrets"] == []


def test_a_dead_node_loses_only_its_sessions(tmp_path: Path) -> None:
    with (
        nodes(tmp_path, "n1", "n2") as gws,
        router(tmp_path, [g.url.removeprefix("http://") for g in gws], *FAST, token=TOKEN) as r,
        r.client() as c,
    ):
        ids = {_node_of(i): i for i in (c.post("/sessions").json()["id"] for _ in range(2))}
        for sid in ids.values():
            execute(c, sid, "y = 7")
        gws[1].proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        try:
            _lost_node_answers(c, r, ids, killed_at)
        finally:
            _bury(tmp_path / "n2")


def _bury(folder: Path) -> None:
    """What a SIGKILLed local gateway leaves: its kernels' processes and its mounted
    session disks (a successor on the same runtime dir would reclaim them)."""
    marker = str(folder).encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
    time.sleep(0.5)
    reclaim(folder)


def _lost_node_answers(c: httpx.Client, r: Gateway, ids: dict[str, str], killed_at: float) -> None:
    while True:
        answer = c.get(f"/sessions/{ids['n2']}")
        if answer.status_code == 410:
            break
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["type"] == "node_unavailable"
        assert time.monotonic() - killed_at < 30
    assert answer.json()["error"]["type"] == "node_lost"
    assert "n2" in answer.json()["error"]["message"]
    assert execute(c, ids["n1"], "print(y)").stdout == "7\n"
    for _ in range(2):  # new sessions go to the live node (n1 has room for one)
        made = c.post("/sessions")
        if made.status_code == 201:
            assert _node_of(made.json()["id"]) == "n1"
        else:
            assert made.json()["error"]["type"] == "too_many_sessions"
    health = c.get("/health").json()
    assert health["status"] == "degraded"
    assert {n["name"]: n["state"] for n in health["nodes"]} == {"n1": "up", "n2": "lost"}
    metrics = c.get("/metrics").text
    assert 'kernel_gateway_router_nodes{state="lost"} 1.0' in metrics
    with Client(r.url, token=TOKEN) as client, pytest.raises(NodeLostError):
        client.session(ids["n2"]).info()


def test_the_client_fails_over_between_routers_even_mid_stream(tmp_path: Path) -> None:
    with nodes(tmp_path, "n1") as gws:
        addresses = [gws[0].url.removeprefix("http://")]
        with (
            router(tmp_path, addresses, token=TOKEN, name="r1") as r1,
            router(tmp_path, addresses, token=TOKEN, name="r2") as r2,
        ):
            with Client([r1.url, r2.url], token=TOKEN) as client:
                session = client.create_session()
                session.run("z = 5")
                code = (
                    "import time\n"
                    "for i in range(8):\n"
                    "    print(i, flush=True)\n"
                    "    time.sleep(0.25)\n"
                )
                seen: list[str] = []

                def kill_r1() -> None:
                    while not seen:
                        time.sleep(0.01)
                    r1.proc.send_signal(signal.SIGKILL)

                killer = threading.Thread(target=kill_r1)
                killer.start()
                for event in session.stream(code):
                    if isinstance(event, Stdout):
                        seen.append(event.text)
                killer.join()
                assert r1.proc.wait(5) == -signal.SIGKILL
                assert "".join(seen).split() == [str(i) for i in range(8)]
                assert session.run("print(z)").stdout == "5\n"
                assert client.replicas is not None and client.replicas.current == 1


def test_paths_only_nodes_serve_are_clear_404s(tmp_path: Path) -> None:
    with (
        nodes(tmp_path, "n1") as gws,
        router(tmp_path, [gws[0].url.removeprefix("http://")], token=TOKEN) as r,
        r.client() as c,
    ):
        for path in ("/mcp", "/api/kernels"):
            answer = c.get(path)
            assert answer.status_code == 404
            assert "node gateway" in answer.json()["error"]["message"]
        assert c.get("/openapi.json").json()["openapi"].startswith("3.1")


# -- units ----------------------------------------------------------------------------------


def test_node_targets_parse() -> None:
    assert NodeTarget.parse("tasks.kg_node:9000") == NodeTarget("tasks.kg_node", 9000)
    assert NodeTarget.parse("http://10.0.0.2") == NodeTarget("10.0.0.2", 8888)
    assert NodeTarget.parse("[::1]:7") == NodeTarget("::1", 7)
    for bad in ("", "host:0", "host:x", "http://h/p", ":80"):
        with pytest.raises(ValueError):
            NodeTarget.parse(bad)


def test_router_settings_are_checked_once() -> None:
    with pytest.raises(ValueError, match="--nodes"):
        RouterSettings()
    with pytest.raises(ValueError, match="node-lost-after"):
        RouterSettings(nodes="a", poll_interval=5, node_lost_after=6)
    settings = from_env({"KG_NODES": "a:1,b", "KG_NODE_LOST_AFTER": "12"})
    assert [t.port for t in settings.node_targets] == [1, 8888]
    assert settings.node_lost_after == 12
    with pytest.raises(ValueError, match="without a token"):
        RouterSettings(nodes="a", host="0.0.0.0").check_exposure()


def test_token_file(tmp_path: Path) -> None:
    secret = tmp_path / "kg_token"
    secret.write_text("s3cret\n")
    assert serve_settings({"KG_TOKEN_FILE": str(secret)}).token == "s3cret"
    assert from_env({"KG_NODES": "a", "KG_TOKEN_FILE": str(secret)}).token == "s3cret"
    with pytest.raises(ValueError, match="both"):
        serve_settings({"KG_TOKEN_FILE": str(secret), "KG_TOKEN": "x"})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        serve_settings({"KG_TOKEN_FILE": str(tmp_path / "empty")})
    with pytest.raises(ValueError, match="cannot read"):
        serve_settings({"KG_TOKEN_FILE": str(tmp_path / "missing")})


def test_node_names_are_checked() -> None:
    assert Settings(node_name="abc-1_x").node_name == "abc-1_x"
    for bad in ("", "a.b", "-a", "x" * 64, "a/b"):
        with pytest.raises(ValueError, match="node-name"):
            Settings(node_name=bad)


def _node(name: str, sessions: int, max_sessions: int, stateless: int = 0) -> Node:
    node = Node(name, f"http://{name}", 0.0)
    node.health = {"pool": {"sessions": sessions, "max_sessions": max_sessions, "max_stateless": 4}}
    node.stateless = stateless
    return node


def test_placement_prefers_free_capacity_and_skips_full_or_down_nodes() -> None:
    a, b, c, d = _node("a", 3, 4), _node("b", 0, 2), _node("c", 4, 4), _node("d", 0, 9)
    d.state = "unreachable"
    assert [n.name for n in placement.for_session([a, b, c, d])][:2] == ["b", "a"]
    assert "d" not in [n.name for n in placement.for_session([a, b, c, d])]
    b.placed = 2  # placed since the last poll: b is full now, tried after a
    assert [n.name for n in placement.for_session([a, b, c, d])][0] == "a"
    busy, idle = _node("busy", 0, 1, stateless=3), _node("idle", 0, 1, stateless=1)
    assert [n.name for n in placement.for_stateless([busy, idle, d])] == ["idle", "busy"]


def test_replicas_retarget_keeps_the_path_under_each_base() -> None:
    replicas = Replicas(["http://a:1/gw", "http://b:2"])
    request = httpx.Request("GET", "http://a:1/gw/sessions/x?y=1")
    replicas.retarget(request, 1)
    assert str(request.url) == "http://b:2/sessions/x?y=1"
    assert request.headers["Host"] == "b:2"
    replicas.retarget(request, 0)
    assert str(request.url) == "http://a:1/gw/sessions/x?y=1"
    replicas.current = 1
    assert replicas.order() == [1, 0]
    with pytest.raises(ValueError):
        Replicas([])


def test_a_fresh_router_waits_for_nodes_it_has_not_met(tmp_path: Path) -> None:
    """A router that just started may not have met a restarting node: no final 404."""
    with (
        nodes(tmp_path, "n1") as gws,
        router(tmp_path, [gws[0].url.removeprefix("http://")], *FAST, token=TOKEN) as r,
        r.client() as c,
    ):
        young = c.get("/sessions/n7.0123abcd")
        assert young.status_code == 503, young.text
        assert young.json()["error"]["type"] == "node_unavailable"
        time.sleep(3)
        assert c.get("/sessions/n7.0123abcd").status_code == 404


def test_e2bs_sdk_through_a_router(tmp_path: Path) -> None:
    """E2B's own SDK, pointed at a router: sandboxes are placed on the nodes, each call goes
    to its sandbox's node, and lists gather every node's sandboxes."""
    sdk = pytest.importorskip("e2b_code_interpreter")
    with (
        nodes(tmp_path, "n1", "n2", max_sessions=3) as gws,
        router(tmp_path, [g.url.removeprefix("http://") for g in gws], *FAST, token=TOKEN) as r,
    ):
        _wait_up(r, 2)
        options = {"api_key": TOKEN, "api_url": r.url + "/e2b", "sandbox_url": r.url + "/e2b"}
        first = sdk.Sandbox.create(**options)
        second = sdk.Sandbox.create(**options)
        try:
            assert {_node_of(first.sandbox_id), _node_of(second.sandbox_id)} == {"n1", "n2"}
            first.run_code("x = 41")
            assert first.run_code("x + 1").text == "42"
            first.files.write("note.txt", "on n1 or n2")
            assert first.files.read("note.txt") == "on n1 or n2"
            listed = {s.sandbox_id for s in sdk.Sandbox.list(**options).next_items()}
            assert {first.sandbox_id, second.sandbox_id} <= listed
            assert sdk.Sandbox.connect(second.sandbox_id, **options).run_code("6 * 7").text == "42"
        finally:
            first.kill()
            second.kill()
        assert sdk.Sandbox.kill(first.sandbox_id, **options) is False


def test_templates_are_built_on_every_node_and_sessions_placed_where_they_are_ready(
    tmp_path: Path,
) -> None:
    """Two docker node gateways (one engine, two runtime folders) behind a router."""
    with docker_nodes(tmp_path) as (gws, r), r.client() as c:
        steps = [{"type": "RUN", "args": ["echo here > /opt/mark", "root"]}]
        # Built on n2 alone (through its own address): sessions go there, though n1 is free.
        with gws[1].client() as n2:
            started = n2.post("/templates", json={"name": "only-n2", "steps": steps})
            assert started.status_code == 202, started.text
            wait_ready(n2, "only-n2")
        placed = [c.post("/sessions", json={"template": "only-n2"}) for _ in range(2)]
        assert [p.status_code for p in placed] == [201, 201], [p.text for p in placed]
        assert {_node_of(p.json()["id"]) for p in placed} == {"n2"}
        missing = c.post("/sessions", json={"template": "nowhere"})
        assert (
            missing.status_code == 404 and missing.json()["error"]["type"] == "template_not_found"
        )
        for p in placed:
            c.delete(f"/sessions/{p.json()['id']}")
        # Built through the router: on both nodes; listed once; found; removed from both.
        started = c.post("/templates", json={"name": "everywhere", "steps": steps})
        assert started.status_code == 202, started.text
        for gw in gws:
            with gw.client() as node:
                wait_ready(node, "everywhere")
        names = [t["name"] for t in c.get("/templates").json()["templates"]]
        assert sorted(names) == ["everywhere", "only-n2"]
        assert c.get("/templates/everywhere").json()["ready_build"]
        build = started.json()
        logs = c.get(
            f"/templates/everywhere/builds/{build['id']}/logs",
            headers={"Accept": "application/json"},
        )
        assert logs.status_code == 200 and logs.json()["build"]["state"] == "ready"
        sessions = [c.post("/sessions", json={"template": "everywhere"}).json() for _ in range(2)]
        assert {_node_of(s["id"]) for s in sessions} == {"n1", "n2"}  # spread, as any session
        for s in sessions:
            assert execute(c, s["id"], "print(open('/opt/mark').read().strip())").stdout == "here\n"
            c.delete(f"/sessions/{s['id']}")
        assert c.delete("/templates/everywhere").status_code == 204
        assert c.get("/templates/everywhere").status_code == 404
        assert c.delete("/templates/only-n2").status_code == 204  # from n2; n1 never had it
        with gws[1].client() as n2:
            assert n2.get("/templates/only-n2").status_code == 404


@contextlib.contextmanager
def docker_nodes(tmp_path: Path) -> Iterator[tuple[list[Gateway], Gateway]]:
    """Two docker node gateways, n1 and n2 (one engine, two runtime folders), and a router."""
    require_docker()
    with contextlib.ExitStack() as stack:
        gws = []
        for name in ("n1", "n2"):
            folder = tmp_path / name
            folder.mkdir()
            gws.append(
                stack.enter_context(
                    gateway(
                        folder, "--backend", "docker", "--runtime", "runsc", "--node-name", name,
                        "--pool-size", "0", "--max-sessions", "4", token=TOKEN,
                    )
                )
            )  # fmt: skip
        r = stack.enter_context(
            router(tmp_path, [g.url.removeprefix("http://") for g in gws], *FAST, token=TOKEN)
        )
        _wait_up(r, 2)
        yield gws, r


def test_e2bs_template_sdk_builds_on_every_node_through_a_router(tmp_path: Path) -> None:
    """`Template.build` from E2B's SDK, pointed at a router: one template id and one build
    id on each node, its files uploaded to both, sandboxes of it on both, listed once,
    deleted from both."""
    e2b = pytest.importorskip("e2b")
    sdk = pytest.importorskip("e2b_code_interpreter")
    context = tmp_path / "context"
    context.mkdir()
    (context / "data.txt").write_text("copied through the router\n")
    with docker_nodes(tmp_path) as (gws, r):
        options = {"api_key": TOKEN, "api_url": r.url + "/e2b", "sandbox_url": r.url + "/e2b"}
        template = (
            e2b.Template(file_context_path=str(context))
            .from_base_image()
            .copy("data.txt", "/opt/data.txt")
            .run_cmd("cat /opt/data.txt")
        )
        lines: list[str] = []
        info = e2b.Template.build(
            template,
            "routed:v1",
            skip_cache=True,
            on_build_logs=lambda entry: lines.append(entry.message),
            **options,
        )
        assert "copied through the router" in lines, lines
        assert e2b.Template.exists("routed", **options)
        assert not e2b.Template.exists("nowhere", **options)
        records = []
        for gw in gws:  # built on each node, under the same ids
            with gw.client() as node:
                record = node.get("/templates/routed").json()
                assert record["state"] == "ready", record
                records.append(record)
        assert {rec["id"] for rec in records} == {info.template_id}
        assert {rec["ready_build"] for rec in records} == {info.build_id}
        with httpx.Client(base_url=r.url + "/e2b", headers={"X-API-KEY": TOKEN}) as http:
            listed = http.get("/v2/templates").json()
            assert [t["templateID"] for t in listed] == [info.template_id]
            assert listed[0]["buildStatus"] == "ready"
        boxes = [sdk.Sandbox.create("routed:v1", **options) for _ in range(2)]
        try:
            assert {_node_of(b.sandbox_id) for b in boxes} == {"n1", "n2"}
            for box in boxes:
                text = box.run_code("print(open('/opt/data.txt').read().strip())").logs.stdout
                assert text == ["copied through the router\n"]
        finally:
            for box in boxes:
                box.kill()
        with httpx.Client(base_url=r.url + "/e2b", headers={"X-API-KEY": TOKEN}) as http:
            assert http.delete(f"/templates/{info.template_id}").status_code == 204
            assert http.get(f"/templates/{info.template_id}").status_code == 404
        for gw in gws:
            with gw.client() as node:
                assert node.get("/templates/routed").status_code == 404


def wait_ready(client: httpx.Client, name: str) -> None:
    deadline = time.monotonic() + 180
    while True:
        state = client.get(f"/templates/{name}").json()["state"]
        if state in ("ready", "error"):
            assert state == "ready"
            return
        assert time.monotonic() < deadline
        time.sleep(0.3)
