"""API keys on a real gateway: made by the admin, each seeing only what it made, within its
quotas; revoked at once, open streams included; kept across a restart.

The ownership walk reads the gateway's own OpenAPI document: every operation naming a
session, a snapshot or a key is called by another key with the first key's ids, and must
answer 404, so an operation added later without the check fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import collected
from tests.support.backends import require_backend, settings_for
from tests.support.server import ServerFactory, ServerThread

TOKEN = "admin-token-for-keys"
OWNED = {"session_id", "snapshot_id", "key_id", "volume", "name", "build_id"}
"""Path parameters naming what a key owns (or a part of it), walked below."""
FILLED = {"execution_id": "1", "path": "a.txt"}
SHARED = {"hash"}
"""Path parameters naming what is no one's: a template's COPY files, stored by their
SHA-256 (uploading or asking after a hash says nothing of who uploaded it)."""


def client(server: ServerThread, secret: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {secret}"}, timeout=60
    )


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("docker", token=TOKEN, pool_size=1, max_sessions=8)


@pytest.fixture(scope="module")
def admin(server: ServerThread) -> Iterator[httpx.Client]:
    with client(server, TOKEN) as c:
        yield c


def new_key(admin: httpx.Client, name: str, **quotas: float) -> dict[str, Any]:
    made = admin.post("/keys", json={"name": name, "quotas": quotas})
    assert made.status_code == 201, made.text
    assert made.headers["cache-control"] == "no-store"
    key: dict[str, Any] = made.json()
    return key


def example(schema: dict[str, Any], document: dict[str, Any]) -> Any:
    """A small valid value of `schema` (its required fields only), to get past validation."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return example(document["components"]["schemas"][name], document)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return example(schema[key][0], document)
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            value = example(part, document)
            if isinstance(value, dict):
                merged.update(value)
        return merged
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {k: example(props[k], document) for k in schema.get("required", [])}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return max(1, schema.get("minimum", 1))
    if kind == "boolean":
        return False
    return "print(1)" if schema.get("minLength", 0) <= 8 else "x" * schema["minLength"]


def test_keys_are_made_shown_once_and_managed_by_the_admin(
    server: ServerThread, admin: httpx.Client
) -> None:
    key = new_key(admin, "lister", max_sessions=2, requests_per_minute=600)
    secret = key.pop("secret")
    unset = dict.fromkeys(("cpus", "memory_bytes", "disk_bytes", "total_disk_bytes"))
    assert key["quotas"] == {
        "max_sessions": 2,
        "max_stateless": None,
        "requests_per_minute": 600,
        **unset,
    }
    assert admin.get(f"/keys/{key['id']}").json() == key  # never the secret again
    assert key in admin.get("/keys").json()["keys"]
    with client(server, secret) as own:
        assert own.get("/keys").json() == {"keys": [key]}  # a key sees only itself
        refused = own.post("/keys", json={"name": "more"})
        assert refused.status_code == 403 and "admin token" in refused.json()["error"]["message"]
        assert own.patch(f"/keys/{key['id']}", json={"quotas": {}}).status_code == 403
        rotated = own.post(f"/keys/{key['id']}/rotate")
        assert rotated.status_code == 200
        assert own.get("/sessions").status_code == 401  # the old secret, refused at once
    with client(server, rotated.json()["secret"]) as own:
        assert own.get("/sessions").status_code == 200
        changed = admin.patch(f"/keys/{key['id']}", json={"quotas": {"max_sessions": 1}})
        assert changed.json()["quotas"]["max_sessions"] == 1
        assert own.delete(f"/keys/{key['id']}").status_code == 204  # a key may revoke itself
        gone = own.get("/sessions")
        assert gone.status_code == 401 and gone.json()["error"]["type"] == "unauthorized"
    listed = admin.get("/keys", params={"revoked": "true"}).json()["keys"]
    assert [k["revoked_at"] is not None for k in listed if k["id"] == key["id"]] == [True]
    assert admin.post("/keys", json={"name": "admin"}).status_code == 422
    assert (
        admin.post("/keys", json={"name": "x", "quotas": {"max_sessions": -1}}).status_code == 422
    )
    assert admin.get("/keys/key_nope").json()["error"]["type"] == "key_not_found"


def test_another_key_gets_404_on_every_operation_naming_what_a_key_made(
    server: ServerThread, admin: httpx.Client
) -> None:
    alice, bob = new_key(admin, "alice"), new_key(admin, "bob")
    with client(server, alice["secret"]) as a, client(server, bob["secret"]) as b:
        sid = a.post("/sessions").json()["id"]
        ran = a.post(
            f"/sessions/{sid}/execute",
            json={"code": "open('a.txt', 'w').write('mine'); x = 41"},
            headers={"Accept": "application/json"},
        )
        assert ran.status_code == 200, ran.text
        snapshot = a.post(f"/sessions/{sid}/snapshots", json={"name": "base"})
        assert snapshot.status_code == 201, snapshot.text
        volume = a.post("/volumes", json={"name": "alices"})
        assert volume.status_code == 201, volume.text
        steps = [{"type": "ENV", "args": ["OWNER", "alice"]}]
        built = a.post("/templates", json={"name": "alices", "steps": steps})
        assert built.status_code == 202, built.text
        ids = {
            "session_id": sid,
            "snapshot_id": snapshot.json()["id"],
            "key_id": alice["id"],
            "volume": volume.json()["id"],
            "name": "alices",
            "build_id": built.json()["id"],
        }

        document = admin.get("/openapi.json").json()
        walked = []
        for path, item in document["paths"].items():
            names = {p.strip("{}") for p in path.split("/") if p.startswith("{")}
            unknown = names - OWNED - SHARED - set(FILLED)
            assert not unknown, f"{path}: is {unknown} a key's own? classify it here"
            if not names & OWNED:
                continue
            url = path
            for name in names:
                url = url.replace("{" + name + "}", ids.get(name) or FILLED[name])
            for method, operation in item.items():
                body = operation.get("requestBody", {}).get("content", {}).get("application/json")
                kwargs: dict[str, Any] = {}
                if body is not None:
                    kwargs["json"] = example(body["schema"], document)
                elif method in ("put", "post"):
                    kwargs["content"] = b"x"
                answer = b.request(method.upper(), url, **kwargs)
                assert answer.status_code == 404, (method, url, answer.text)
                walked.append(operation["operationId"])
        assert len(walked) >= 20, walked
        assert b.get("/sessions").json() == {"sessions": []}
        assert b.get("/snapshots").json() == {"snapshots": []}
        assert b.get("/api/kernels").json() == []
        assert b.get("/volumes").json() == {"volumes": []}
        assert "alices" not in [t["name"] for t in b.get("/templates").json()["templates"]]
        assert b.post("/sessions", json={"snapshot": "base"}).status_code == 404
        assert b.post("/sessions", json={"volumes": {"alices": "/mnt/x"}}).status_code == 404
        assert b.post("/sessions", json={"template": "alices"}).status_code == 404
        # Bob's own snapshot may have the same name: names are each key's own.
        bob_sid = b.post("/sessions").json()["id"]
        assert b.post(f"/sessions/{bob_sid}/snapshots", json={"name": "base"}).status_code == 201

        # Alice's session is untouched, and hers; the admin sees both keys' sessions.
        kept = a.post(
            f"/sessions/{sid}/execute",
            json={"code": "print(open('a.txt').read(), x + 1)"},
            headers={"Accept": "application/json"},
        ).json()
        assert kept["stdout"] == "mine 42\n"
        mine = a.get(f"/sessions/{sid}").json()
        assert mine["owner"] == alice["id"]
        seen = {s["id"] for s in admin.get("/sessions").json()["sessions"]}
        assert {sid, bob_sid} <= seen
        assert admin.get(f"/sessions/{sid}").status_code == 200
        assert {s["id"] for s in a.get("/sessions").json()["sessions"]} == {sid}
        for c, own in ((a, sid), (b, bob_sid)):
            assert c.delete(f"/sessions/{own}").status_code == 204


def test_a_key_past_its_quota_is_refused_and_another_key_is_not(
    server: ServerThread, admin: httpx.Client
) -> None:
    small = new_key(admin, "small", max_sessions=1, requests_per_minute=1000)
    other = new_key(admin, "other")
    with client(server, small["secret"]) as s, client(server, other["secret"]) as o:
        first = s.post("/sessions")
        assert first.status_code == 201
        refused = s.post("/sessions")
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["type"] == "quota_exceeded" and "max_sessions" in error["message"]
        assert o.post("/sessions").status_code == 201  # its own quota, untouched
        assert s.delete(f"/sessions/{first.json()['id']}").status_code == 204
        assert s.post("/sessions").status_code == 201  # room again
    limited = new_key(admin, "limited", requests_per_minute=2)
    with client(server, limited["secret"]) as c:
        assert [c.get("/sessions").status_code for _ in range(2)] == [200, 200]
        third = c.get("/sessions")
        assert third.status_code == 429 and third.json()["error"]["type"] == "rate_limited"
        assert 1 <= int(third.headers["retry-after"]) <= 30
    for s in admin.get("/sessions").json()["sessions"]:
        admin.delete(f"/sessions/{s['id']}")


CGROUP_LIMITS = (
    "import pathlib\n"
    "def read(*names):\n"
    "    for name in names:\n"
    "        p = pathlib.Path('/sys/fs/cgroup', name)\n"
    "        if p.exists(): return p.read_text().split()\n"
    "mem = read('memory/memory.limit_in_bytes', 'memory.max')[0]\n"
    "cpu = read('cpu/cpu.cfs_quota_us', 'cpu.max')[0]\n"
    "print(mem, cpu)"
)


def test_a_keys_kernels_get_its_cpu_and_memory_within_the_gateways(
    server: ServerThread, admin: httpx.Client
) -> None:
    """`cpus` and `memory_bytes` per kernel: set on its first kernel and on the one after a
    restart, enforced (a cell past the memory dies, the session lives on), never above the
    gateway's own limits (422), and not on another key's kernels."""
    over = admin.post("/keys", json={"name": "greedy", "quotas": {"cpus": 64}})
    assert over.status_code == 422 and "--cpu-limit" in over.json()["error"]["message"]
    over = admin.post("/keys", json={"name": "greedy", "quotas": {"memory_bytes": 2**50}})
    assert over.status_code == 422 and "--memory-limit" in over.json()["error"]["message"]
    small = new_key(admin, "small-kernels", cpus=0.5, memory_bytes=256 * 2**20)
    assert small["quotas"]["cpus"] == 0.5 and small["quotas"]["memory_bytes"] == 256 * 2**20
    other = new_key(admin, "gateway-kernels")
    with client(server, small["secret"]) as s, client(server, other["secret"]) as o:
        sid = s.post("/sessions").json()["id"]
        shown = collected(s, f"/sessions/{sid}/execute", {"code": CGROUP_LIMITS})["stdout"]
        assert shown.split() == [str(256 * 2**20), "50000"], shown
        metrics = s.get(f"/sessions/{sid}/metrics").json()
        assert metrics["metrics"][-1]["mem_total"] == 256 * 2**20, metrics
        grown = collected(
            s,
            f"/sessions/{sid}/execute",
            {"code": "x = bytearray(400 * 2**20); x[::4096] = b'1' * len(x[::4096])"},
        )
        assert grown["status"] != "ok", grown  # its kernel was killed at the key's limit
        assert s.post(f"/sessions/{sid}/restart").status_code == 200
        again = collected(s, f"/sessions/{sid}/execute", {"code": CGROUP_LIMITS})["stdout"]
        assert again.split() == [str(256 * 2**20), "50000"], again  # the new kernel too
        theirs = o.post("/sessions").json()["id"]
        unlimited = collected(o, f"/sessions/{theirs}/execute", {"code": CGROUP_LIMITS})
        assert unlimited["stdout"].split() == [str(2**30), "100000"], unlimited
        for held in (s, sid), (o, theirs):
            held[0].delete(f"/sessions/{held[1]}")


WRITE = (
    "import os\n"
    "def write(name, mb):\n"
    "    try:\n"
    "        with open(name, 'wb') as f:\n"
    "            for _ in range(mb): f.write(os.urandom(2**20))\n"
    "        return 'written'\n"
    "    except OSError as e:\n"
    "        return e.strerror\n"
)


def test_a_keys_sessions_get_its_disk_and_no_more_sessions_past_its_total(
    server: ServerThread, admin: httpx.Client
) -> None:
    """`disk_bytes` caps each of its sessions' disks (a cell gets ENOSPC, an upload 413, the
    metrics show the cap); `total_disk_bytes` refuses a new session once its sessions hold
    that much (at the next sample); another key's sessions keep the gateway's disk."""
    over = admin.post("/keys", json={"name": "hoarder", "quotas": {"disk_bytes": 2**50}})
    assert over.status_code == 422 and "--workspace-size" in over.json()["error"]["message"]
    mb = 2**20
    key = new_key(admin, "small-disks", disk_bytes=64 * mb, total_disk_bytes=100 * mb)
    other = new_key(admin, "big-disks")
    with client(server, key["secret"]) as c, client(server, other["secret"]) as o:
        made = c.post("/sessions")
        assert made.status_code == 201, made.text
        first = made.json()["id"]
        run = f"/sessions/{first}/execute"
        assert collected(c, run, {"code": WRITE + "print(write('a', 100))"})["stdout"] == (
            "No space left on device\n"
        )
        disk = c.get(f"/sessions/{first}/metrics").json()["metrics"][-1]
        assert 60 * mb < disk["disk_total"] <= 64 * mb, disk
        assert collected(c, run, {"code": "import os; os.remove('a')"})["status"] == "ok"
        assert collected(c, run, {"code": WRITE + "print(write('a', 50))"})["stdout"] == (
            "written\n"
        )
        uploads = [
            c.put(f"/sessions/{first}/files/b{i}.bin", content=os.urandom(mb - 1))
            for i in range(20)  # 20 MB more would fit the gateway's 1g, not the key's 64 MB
        ]
        assert [u.status_code for u in uploads].count(201) < 14, uploads
        full = uploads[-1].json()["error"]
        assert uploads[-1].status_code == 413 and "full" in full["message"], full
        second = c.post("/sessions")
        assert second.status_code == 201, second.text  # 50 MB held of 100
        run = f"/sessions/{second.json()['id']}/execute"
        assert collected(c, run, {"code": WRITE + "print(write('a', 55))"})["stdout"] == (
            "written\n"
        )
        deadline = time.monotonic() + 20
        while (third := c.post("/sessions")).status_code == 201:  # until sampled
            c.delete(f"/sessions/{third.json()['id']}")
            assert time.monotonic() < deadline, "the total was never counted"
            time.sleep(0.5)
        assert third.status_code == 429, third.text
        assert "total_disk_bytes" in third.json()["error"]["message"]
        theirs = o.post("/sessions").json()["id"]
        disk = o.get(f"/sessions/{theirs}/metrics").json()["metrics"][-1]
        assert disk["disk_total"] > 900 * mb, disk  # the gateway's 1g
        for sid in (first, second.json()["id"]):
            c.delete(f"/sessions/{sid}")
        o.delete(f"/sessions/{theirs}")


def test_under_gvisor_a_keys_memory_holds_its_whole_sandbox(servers: ServerFactory) -> None:
    """runsc takes no `docker update`: the limits are written in the sandbox's cgroup, which
    holds the whole sandbox (the kernel sees no cgroup of its own)."""
    gvisor = servers("gvisor", pool_size=1, max_sessions=2)
    with httpx.Client(base_url=gvisor.url, timeout=60) as open_gateway:
        made = open_gateway.post("/keys", json={"name": "boxed", "quotas": {"memory_bytes": 2**28}})
        assert made.status_code == 201, made.text
    with client(gvisor, made.json()["secret"]) as c:
        sid = c.post("/sessions").json()["id"]
        metrics = c.get(f"/sessions/{sid}/metrics").json()["metrics"]
        assert metrics[-1]["mem_total"] == 2**28, metrics
        grown = collected(c, f"/sessions/{sid}/execute", {"code": "x = b'1' * (400 * 2**20)"})
        assert grown["status"] != "ok", grown
        assert collected(c, f"/sessions/{sid}/execute", {"code": "1 + 1"})["status"] == "ok"
        c.delete(f"/sessions/{sid}")


def test_revoking_a_key_ends_its_open_stream_at_once(
    server: ServerThread, admin: httpx.Client
) -> None:
    key = new_key(admin, "streamer")
    with client(server, key["secret"]) as c:
        sid = c.post("/sessions").json()["id"]
        ended: list[float] = []
        events: list[str] = []

        def follow() -> None:
            body = {"code": "import time\nprint('started', flush=True)\ntime.sleep(60)"}
            with c.stream("POST", f"/sessions/{sid}/execute", json=body) as stream:
                for line in stream.iter_lines():
                    events.append(line)
            ended.append(time.monotonic())

        reader = threading.Thread(target=follow)
        reader.start()
        deadline = time.monotonic() + 30
        while not any("started" in e for e in events) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any("started" in e for e in events), events
        revoked_at = time.monotonic()
        assert admin.delete(f"/keys/{key['id']}").status_code == 204
        reader.join(timeout=20)
        assert not reader.is_alive() and ended[0] - revoked_at < 10
    assert admin.get(f"/sessions/{sid}").status_code == 200  # kept, for the admin
    assert admin.delete(f"/sessions/{sid}").status_code == 204


def test_keys_and_what_they_own_survive_a_restart(tmp_path: Path) -> None:
    require_backend("docker")
    settings = settings_for("docker", tmp_path, token=TOKEN, pool_size=0, persist_sessions=False)
    with ServerThread(settings) as first, client(first, TOKEN) as admin:
        key = new_key(admin, "durable", max_sessions=3)
        with client(first, key["secret"]) as c:
            snap_sid = c.post("/sessions").json()["id"]
            assert (
                c.post(f"/sessions/{snap_sid}/snapshots", json={"name": "kept"}).status_code == 201
            )
    with ServerThread(settings) as second, client(second, TOKEN) as admin:
        shown = admin.get(f"/keys/{key['id']}").json()
        assert shown["quotas"]["max_sessions"] == 3
        with client(second, key["secret"]) as c:
            assert [s["name"] for s in c.get("/snapshots").json()["snapshots"]] == ["kept"]
            started = c.post("/sessions", json={"snapshot": "kept"})
            assert started.status_code == 201, started.text
            assert started.json()["owner"] == key["id"]
        other = new_key(admin, "newcomer")
        with client(second, other["secret"]) as c:
            assert c.get("/snapshots").json() == {"snapshots": []}
    assert json.loads(json.dumps(shown))["name"] == "durable"


def ready(c: httpx.Client, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        template: dict[str, Any] = c.get(f"/templates/{name}").json()
        if template["state"] in ("ready", "error"):
            assert template["state"] == "ready", template
            return template
        time.sleep(0.5)
    raise AssertionError(f"template {name} did not build within 300 s")


def test_the_operators_templates_are_every_keys_but_only_the_admins_to_change(
    server: ServerThread, admin: httpx.Client
) -> None:
    steps = [{"type": "ENV", "args": ["SHARED", "yes"]}]
    assert admin.post("/templates", json={"name": "shared", "steps": steps}).status_code == 202
    ready(admin, "shared")
    user = new_key(admin, "user")
    with client(server, user["secret"]) as c:
        assert "shared" in [t["name"] for t in c.get("/templates").json()["templates"]]
        sid = c.post("/sessions", json={"template": "shared"}).json()["id"]
        ran = c.post(
            f"/sessions/{sid}/execute",
            json={"code": "import os; print(os.environ['SHARED'])"},
            headers={"Accept": "application/json"},
        ).json()
        assert ran["stdout"] == "yes\n"
        for method, path in (("DELETE", "/templates/shared"), ("POST", "/templates/shared/builds")):
            refused = c.request(method, path, json={"steps": steps} if method == "POST" else None)
            assert refused.status_code == 403, refused.text
        # A template of its own by that name is its own, and its name means it from then on.
        mine = [{"type": "ENV", "args": ["SHARED", "mine"]}]
        assert c.post("/templates", json={"name": "shared", "steps": mine}).status_code == 202
        ready(c, "shared")
        assert (
            c.get("/templates/shared").json()["id"] != admin.get("/templates/shared").json()["id"]
        )
        assert c.delete(f"/sessions/{sid}").status_code == 204
        assert c.delete("/templates/shared").status_code == 204
    assert admin.get("/templates/shared").status_code == 200  # the operator's is untouched
    assert admin.delete("/templates/shared").status_code == 204


def test_e2b_sdk_with_a_key_sees_only_its_own_sandboxes(
    server: ServerThread, admin: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b import SandboxException
    from e2b_code_interpreter import Sandbox

    for variable in ("E2B_API_URL", "E2B_SANDBOX_URL"):
        monkeypatch.setenv(variable, server.url + "/e2b")
    alice, bob = new_key(admin, "e2b-alice"), new_key(admin, "e2b-bob")
    sandbox = Sandbox.create(api_key=alice["secret"])
    assert sandbox.run_code("6 * 7").text == "42"
    assert Sandbox.list(api_key=bob["secret"]).next_items() == []
    mine = [s.sandbox_id for s in Sandbox.list(api_key=alice["secret"]).next_items()]
    assert mine == [sandbox.sandbox_id]
    everyone = [s.sandbox_id for s in Sandbox.list(api_key=TOKEN).next_items()]
    assert sandbox.sandbox_id in everyone
    with pytest.raises(SandboxException):  # not found, for bob
        Sandbox.connect(sandbox.sandbox_id, api_key=bob["secret"])
    assert Sandbox.kill(sandbox.sandbox_id, api_key=bob["secret"]) is False
    assert sandbox.run_code("6 * 7").text == "42"  # untouched

    # E2B's /api-keys are the same keys; revoking alice's stops her sandbox too.
    e2b = {"X-API-KEY": TOKEN}
    listed = httpx.get(f"{server.url}/e2b/api-keys", headers=e2b).json()
    assert {alice["id"], bob["id"]} <= {k["id"] for k in listed}
    own = httpx.get(f"{server.url}/e2b/api-keys", headers={"X-API-KEY": bob["secret"]}).json()
    assert [k["id"] for k in own] == [bob["id"]]
    made = httpx.post(f"{server.url}/e2b/api-keys", json={"name": "from-e2b"}, headers=e2b)
    assert made.status_code == 201 and made.json()["key"].startswith("e2b_")
    assert admin.get(f"/keys/{made.json()['id']}").json()["name"] == "from-e2b"
    gone = httpx.delete(f"{server.url}/e2b/api-keys/{alice['id']}", headers=e2b)
    assert gone.status_code == 204
    with pytest.raises(Exception, match="401|revoked|nauthori"):
        sandbox.run_code("1")
    assert Sandbox.list(api_key=alice["secret"]) is not None
    with pytest.raises(Exception, match="401|nauthori|API key"):
        Sandbox.list(api_key=alice["secret"]).next_items()
    assert Sandbox.kill(sandbox.sandbox_id, api_key=TOKEN) is True


def test_the_keys_command_manages_keys_with_the_admin_token(server: ServerThread) -> None:
    def keys(*args: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KG_URL": server.url, "KG_TOKEN": token}
        command = [sys.executable, "-m", "kernel_gateway", "keys", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    made = keys("create", "from-cli", "--max-sessions", "2")
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)
    assert key["quotas"]["max_sessions"] == 2 and key["secret"].startswith("e2b_")
    listed = [json.loads(line) for line in keys("list").stdout.splitlines()]
    assert key["id"] in [k["id"] for k in listed]
    changed = json.loads(keys("quotas", key["id"], "--max-stateless", "3").stdout)
    wanted = {"max_sessions": None, "max_stateless": 3, "requests_per_minute": None}
    wanted |= dict.fromkeys(("cpus", "memory_bytes", "disk_bytes", "total_disk_bytes"))
    assert changed["quotas"] == wanted
    refused = keys("create", "sneaky", token=key["secret"])
    assert refused.returncode == 2 and "admin token" in refused.stderr
    rotated = json.loads(keys("rotate", key["id"]).stdout)
    assert rotated["secret"] != key["secret"]
    assert keys("revoke", key["id"]).returncode == 0
    assert keys("show", key["id"], token=rotated["secret"]).returncode == 2
    shown = json.loads(keys("show", key["id"]).stdout)
    assert shown["revoked_at"] is not None


E2B_SPEC = Path(__file__).parents[1] / "e2b_suite" / "spec" / "openapi.yml"


def resolved(node: Any, document: dict[str, Any]) -> Any:
    """`node`, its `$ref` followed (anywhere in the document)."""
    while isinstance(node, dict) and "$ref" in node:
        target: Any = document
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def test_another_key_gets_404_on_every_e2b_route_naming_what_a_key_made(
    server: ServerThread, admin: httpx.Client
) -> None:
    import yaml

    alice, bob = new_key(admin, "e2b-walk-alice"), new_key(admin, "e2b-walk-bob")
    base = server.url + "/e2b"
    with httpx.Client(base_url=base, headers={"X-API-KEY": alice["secret"]}, timeout=120) as a:
        sandbox = a.post("/sandboxes", json={"templateID": "base"})
        assert sandbox.status_code == 201, sandbox.text
        sid = sandbox.json()["sandboxID"]
        snapshot = a.post(f"/sandboxes/{sid}/snapshots", json={"name": "walk-snap"})
        assert snapshot.status_code == 201, snapshot.text
        volume = a.post("/volumes", json={"name": "walk-vol"})
        assert volume.status_code == 201, volume.text
        template = a.post("/v3/templates", json={"name": "walk-tpl"})
        assert template.status_code == 202, template.text
    ids = {
        "sandboxID": sid,
        "snapshotID": snapshot.json()["snapshotID"],
        "volumeID": volume.json()["volumeID"],
        "templateID": template.json()["templateID"],
        "buildID": template.json()["buildID"],
        "alias": "walk-tpl",
        "apiKeyID": alice["id"],
    }
    others = {"hash": "0" * 64}  # COPY files are no one's
    document = yaml.safe_load(E2B_SPEC.read_text())
    walked: list[str] = []
    with httpx.Client(base_url=base, headers={"X-API-KEY": bob["secret"]}, timeout=120) as b:
        for path, item in document["paths"].items():
            names = {p.strip("{}") for p in path.split("/") if p.startswith("{")}
            url = path
            for name in names:
                url = url.replace("{" + name + "}", ids.get(name) or others.get(name) or "x-1")
            for method, operation in item.items():
                if method not in ("get", "post", "put", "patch", "delete"):
                    continue
                if not names & set(ids):
                    if method == "get":  # a listing: none of alice's
                        listed = b.get(url)
                        assert not any(i in listed.text for i in ids.values()), (url, listed.text)
                    continue
                kwargs: dict[str, Any] = {}
                body = resolved(operation.get("requestBody"), document)
                if body is not None:
                    schema = resolved(body["content"]["application/json"]["schema"], document)
                    kwargs["json"] = example(schema, document)
                answer = b.request(method.upper(), url, **kwargs)
                assert answer.status_code in (404, 501), (method, url, answer.text)
                if answer.status_code == 404:
                    walked.append(f"{method} {path}")
    assert len(walked) >= 20, walked
    # What bob was refused is still alice's and untouched.
    with httpx.Client(base_url=base, headers={"X-API-KEY": alice["secret"]}, timeout=60) as a:
        assert a.get(f"/sandboxes/{sid}").json()["state"] == "running"
        assert a.delete(f"/sandboxes/{sid}").status_code == 204


async def test_mcp_tools_and_jupyter_routes_of_another_key_find_nothing(
    server: ServerThread, admin: httpx.Client
) -> None:
    import httpx2
    import websockets
    from mcp import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client

    from tests.support.mcp import handle_of, text_of

    alice, bob = new_key(admin, "mcp-alice"), new_key(admin, "mcp-bob")

    def mcp(secret: str) -> tuple[Any, McpClient]:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {secret}"}, timeout=60)
        return http, McpClient(streamable_http_client(f"{server.url}/mcp", http_client=http))

    http_a, client_a = mcp(alice["secret"])
    http_b, client_b = mcp(bob["secret"])
    async with http_a, client_a, http_b, client_b:
        made = await client_a.call_tool("run_python", {"code": "secret = 'alice'"})
        assert not made.is_error, text_of(made)
        handle = handle_of(made)
        tools = [t.name for t in (await client_b.list_tools()).tools]
        arguments = {"session": handle, "code": "print(secret)", "path": "a.txt", "content": "x"}
        for tool in tools:
            schema = next(t for t in (await client_b.list_tools()).tools if t.name == tool)
            asked = {k: v for k, v in arguments.items() if k in schema.input_schema["properties"]}
            if "session" not in asked:
                continue
            answer = await client_b.call_tool(tool, asked)
            assert answer.is_error and "alice" not in text_of(answer), (tool, text_of(answer))
            assert "there is no sandbox" in text_of(answer), (tool, text_of(answer))
        again = await client_a.call_tool("run_python", {"code": "print(secret)", "session": handle})
        assert text_of(again).startswith("alice\n")

    # Jupyter's API: a kernel of alice's is no kernel for bob, nor its channels.
    with client(server, alice["secret"]) as a, client(server, bob["secret"]) as b:
        kernel = a.post("/api/kernels", json={"name": "python3"}).json()["id"]
        for method, path in (
            ("GET", f"/api/kernels/{kernel}"),
            ("POST", f"/api/kernels/{kernel}/interrupt"),
            ("POST", f"/api/kernels/{kernel}/restart"),
            ("DELETE", f"/api/kernels/{kernel}"),
        ):
            assert b.request(method, path).status_code == 404, (method, path)
        assert kernel not in [k["id"] for k in b.get("/api/kernels").json()]
        url = server.url.replace("http", "ws") + f"/api/kernels/{kernel}/channels"
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(
                url, additional_headers={"Authorization": f"Bearer {bob['secret']}"}
            ):
                pass
        assert refused.value.response.status_code == 404
        async with websockets.connect(
            url, additional_headers={"Authorization": f"Bearer {alice['secret']}"}
        ):
            pass
        assert a.delete(f"/api/kernels/{kernel}").status_code == 204


def test_a_keys_usage_is_counted_and_shown(server: ServerThread, admin: httpx.Client) -> None:
    key = new_key(admin, "metered")
    with client(server, key["secret"]) as c:
        sid = c.post("/sessions").json()["id"]
        ran = c.post(
            f"/sessions/{sid}/execute",
            json={"code": "x = bytearray(50_000_000); sum(range(3_000_000))"},
            headers={"Accept": "application/json"},
        )
        assert ran.status_code == 200, ran.text
        assert c.get(f"/sessions/{sid}/metrics").status_code == 200  # a sample, now
        stateless = c.post("/execute", json={"code": "1"}, headers={"Accept": "application/json"})
        assert stateless.status_code == 200, stateless.text
        used = c.get(f"/keys/{key['id']}/usage").json()
        assert used["sessions_created"] == 1 and used["stateless_requests"] == 1, used
        assert used["kernel_seconds"] > 0 and used["peak_memory_bytes"] > 50_000_000, used
        other = new_key(admin, "unmetered")
        with client(server, other["secret"]) as o:
            assert o.get(f"/keys/{key['id']}/usage").status_code == 404
            # A stateless execution's kernel time is its key's too (no session to sample).
            slept = o.post(
                "/execute",
                json={"code": "import time; time.sleep(1.5)"},
                headers={"Accept": "application/json"},
            )
            assert slept.status_code == 200, slept.text
            deadline = time.monotonic() + 10
            while (seconds := o.get(f"/keys/{other['id']}/usage").json()["kernel_seconds"]) < 1.5:
                assert time.monotonic() < deadline, seconds
                time.sleep(0.2)
        exposition = admin.get("/metrics").text
        assert 'kernel_gateway_key_sessions_created_total{key="metered"} 1.0' in exposition
        assert c.delete(f"/sessions/{sid}").status_code == 204
