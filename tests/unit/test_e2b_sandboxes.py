"""E2B sandboxes over fake kernels: lifetime, pause, tokens, contexts, the control plane's
answers in E2B's shapes (no Docker, no SDK)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import pytest

from kernel_gateway import logs
from kernel_gateway.http.auth import Authenticator
from kernel_gateway.kernels.languages import Language
from kernel_gateway.kernels.volumes import Volumes
from kernel_gateway.logs import ROUTE_TEMPLATE
from kernel_gateway.protocols.e2b import contexts as contexts_module
from kernel_gateway.protocols.e2b import sandboxes as sandboxes_module
from kernel_gateway.protocols.e2b.app import E2BService
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.sandbox import Sandbox
from kernel_gateway.protocols.e2b.sandboxes import Sandboxes
from kernel_gateway.records import RecordStore
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.snapshots import SavedSessions, SnapshotStore
from kernel_gateway.sessions.usage import UsageSampler
from kernel_gateway.tenants.principal import ADMIN
from tests.support.fake_kernel import fake_registry, until


def _usage(registry: Registry) -> UsageSampler:
    return UsageSampler(registry.settings, registry.sessions)


def _volumes(registry: Registry) -> Volumes:
    root = registry.settings.runtime_dir / "volumes"
    return Volumes(root, capped=False, owner=None, max_volumes=registry.settings.max_volumes)


def _service(registry: Registry) -> E2BService:
    """The /e2b app over `registry`, authenticating with its settings' token."""
    return E2BService(
        registry,
        registry.settings,
        _saved(registry),
        _usage(registry),
        _volumes(registry),
        Authenticator(registry.settings.token),
    )


def _saved(registry: Registry) -> SavedSessions:
    return SavedSessions(registry, SnapshotStore(registry.settings.runtime_dir / "snapshots"))


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[Registry]:
    async with fake_registry(tmp_path, max_sessions=6, token="tok") as (registry, _):
        yield registry


async def test_a_sandbox_lives_until_its_timeout(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandboxes_module, "REAP_EVERY", 0.05)
    sandboxes = Sandboxes(registry, _saved(registry))
    sandboxes.start()
    try:
        sandbox = await sandboxes.create("code-interpreter-v1", 60, {"a": "b"}, {}, owner=ADMIN)
        assert registry.get(sandbox.id, ADMIN) is not None
        assert sandbox.accepts(sandbox.token) and not sandbox.accepts("nope")
        assert not sandbox.accepts(None)
        before = sandbox.end_at
        _, resumed = await sandboxes.connect(sandbox.id, 10, ADMIN)  # connect never shortens
        assert sandbox.end_at == before and not resumed
        await sandboxes.pause(sandbox.id, ADMIN)
        with pytest.raises(SandboxError) as again:
            await sandboxes.pause(sandbox.id, ADMIN)
        assert again.value.status == 409
        _, resumed = await sandboxes.connect(sandbox.id, None, ADMIN)
        assert resumed and not sandbox.paused
        sandboxes.set_timeout(sandbox.id, 1, ADMIN)
        await until(lambda: not sandboxes.has(sandbox.id), 5)
        assert sandbox.id not in {s.id for s in registry.sessions()}
        with pytest.raises(SandboxError) as gone:
            sandboxes.get(sandbox.id, ADMIN)
        assert gone.value.status == 404
        # A timeout of 0 (E2B's minimum) ends it now; a negative one is refused.
        other = await sandboxes.create("base", 60, {}, {}, owner=ADMIN)
        with pytest.raises(SandboxError) as negative:
            sandboxes.set_timeout(other.id, -1, ADMIN)
        assert negative.value.status == 400
        sandboxes.set_timeout(other.id, 0, ADMIN)
        await until(lambda: not sandboxes.has(other.id), 5)
    finally:
        await sandboxes.close()


async def test_bad_templates_and_timeouts_are_400s(registry: Registry) -> None:
    sandboxes = Sandboxes(registry, _saved(registry))
    for template, lifetime in (("my-template", 60), ("base", 0), ("base", 10**9)):
        with pytest.raises(SandboxError) as caught:
            await sandboxes.create(template, lifetime, {}, {}, owner=ADMIN)
        assert caught.value.status == 400
    assert registry.sessions() == []


async def test_contexts_share_the_files_and_close_with_the_sandbox(registry: Registry) -> None:
    sandboxes = Sandboxes(registry, _saved(registry))
    sandbox = await sandboxes.create("base", 60, {}, {}, owner=ADMIN)
    context = await sandboxes.create_context(sandbox, "python", None)
    session = await sandboxes.started_context(sandbox, context.id)
    owner = sandboxes.session(sandbox)
    assert session.slot.storage.root == owner.slot.storage.root
    assert context.id in sandbox.contexts and context.cwd == "/home/user"
    with pytest.raises(SandboxError, match="cannot be removed"):
        await sandboxes.remove_context(sandbox, sandbox.id)
    await sandboxes.kill(sandbox.id, ADMIN)
    assert registry.companions(sandbox.id) == []
    assert session.closed


async def test_a_gateway_without_javascript_lists_only_python(registry: Registry) -> None:
    sandboxes = Sandboxes(registry, _saved(registry))
    sandbox = await sandboxes.create("base", 60, {}, {}, owner=ADMIN)
    assert [c.language for c in sandbox.contexts.values()] == ["python"]
    await sandboxes.close()


async def test_a_new_sandbox_lists_python_and_javascript_and_starts_javascript_on_use(
    tmp_path: Path,
) -> None:
    javascript = Language("javascript", "Deno")
    async with fake_registry(tmp_path, max_sessions=6, languages=[javascript]) as (registry, _):
        await _lists_and_starts(registry)


async def _lists_and_starts(registry: Registry) -> None:
    sandboxes = Sandboxes(registry, _saved(registry))
    sandbox = await sandboxes.create("base", 60, {}, {}, owner=ADMIN)
    try:
        listed = {c.language: c for c in sandbox.contexts.values()}
        assert set(listed) == {"python", "javascript"}
        assert listed["python"].id == sandbox.id and listed["javascript"].cwd == "/home/user"
        pending = listed["javascript"]
        assert sandboxes.context_session(sandbox, pending.id) is None
        assert registry.companions(sandbox.id) == []  # no kernel until its first use
        by_id = await sandboxes.started_context(sandbox, pending.id)
        by_language = await sandboxes.started_context(
            sandbox, (await sandboxes.default_context(sandbox, "javascript")).id
        )
        assert by_id is by_language and by_id.language == "javascript"
        assert registry.companions(sandbox.id) == [by_id]
        assert [c.id for c in sandbox.contexts.values()] == [sandbox.id, pending.id]
        # A listed context removed before its first use is gone, and starts nothing.
        other = await sandboxes.create("base", 60, {}, {}, owner=ADMIN)
        unused = other.defaults["javascript"]
        await sandboxes.remove_context(other, unused)
        assert unused not in other.contexts and registry.companions(other.id) == []
        with pytest.raises(SandboxError) as gone:
            await sandboxes.started_context(other, unused)
        assert gone.value.status == 404
    finally:
        await sandboxes.close()


async def test_the_control_plane_answers_in_e2bs_shapes(registry: Registry) -> None:
    service = _service(registry)
    transport = httpx.ASGITransport(app=_with_state(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw/e2b") as http:
        refused = await http.post("/v2/sandboxes", json={}, headers={"X-API-KEY": "wrong"})
        assert refused.status_code == 401 and refused.json()["code"] == 401
        key = {"X-API-KEY": "tok"}
        made = await http.post("/v2/sandboxes", json={"templateID": "base"}, headers=key)
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["envdVersion"] and body["envdAccessToken"] == body["trafficAccessToken"]
        sandbox_id = body["sandboxID"]
        info = (await http.get(f"/sandboxes/{sandbox_id}", headers=key)).json()
        assert info["state"] == "running" and info["endAt"].endswith("Z")
        now = int(time.time())  # the SDKs send a window as Unix seconds in the query
        window = {"start": str(now - 3600), "end": str(now - 1800)}
        earlier = await http.get(f"/sandboxes/{sandbox_id}/metrics", params=window, headers=key)
        assert earlier.status_code == 200 and earlier.json() == []
        odd = await http.get(f"/sandboxes/{sandbox_id}/metrics?start=soon", headers=key)
        assert odd.status_code == 400 and "Unix time" in odd.json()["message"]
        json_type = {**key, "Content-Type": "application/json"}
        bad = await http.post("/v2/sandboxes", content=b"[1", headers=json_type)
        assert bad.status_code == 400 and bad.json()["code"] == 400
        form = await http.post("/v2/sandboxes", data={"templateID": "base"}, headers=key)
        assert form.status_code == 415 and form.json()["code"] == 415  # not from a web page
        huge = await http.post("/v2/sandboxes", content=b" " * (3 * 2**20), headers=json_type)
        assert huge.status_code == 413 and huge.json()["code"] == 413
        missing = await http.get("/sandboxes/nope", headers=key)
        assert missing.status_code == 404 and missing.json() == {
            "code": 404,
            "message": "sandbox 'nope' not found",
        }
        unknown = await http.post("/templates", json={}, headers=key)
        assert unknown.status_code == 501 and "not supported" in unknown.json()["message"]
        data_plane = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}
        no_token = await http.get("/health", headers=data_plane)
        assert no_token.status_code == 401
        ok = await http.get(
            "/health", headers={**data_plane, "X-Access-Token": body["envdAccessToken"]}
        )
        assert ok.status_code == 204
        stranger = await http.get(
            "/health", headers={"E2b-Sandbox-Id": "nope", "E2b-Sandbox-Port": "49983"}
        )
        assert stranger.status_code == 502 and "was not found" in stranger.json()["message"]
        assert (await http.delete(f"/sandboxes/{sandbox_id}", headers=key)).status_code == 204
        assert (await http.delete(f"/sandboxes/{sandbox_id}", headers=key)).status_code == 404
    await service.close()


def _with_state(service: E2BService):  # type: ignore[no-untyped-def]
    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        scope = dict(scope, root_path="/e2b", path=scope["path"])
        await service(scope, receive, send)

    return app


async def test_list_pages_by_next_token(registry: Registry) -> None:
    service = _service(registry)
    made = [
        await service.sandboxes.create("base", 60, {"n": str(i)}, {}, owner=ADMIN) for i in range(3)
    ]
    transport = httpx.ASGITransport(app=_with_state(service))
    key = {"X-API-KEY": "tok"}
    async with httpx.AsyncClient(transport=transport, base_url="http://gw/e2b") as http:
        first = await http.get("/v2/sandboxes", params={"limit": 2}, headers=key)
        assert len(first.json()) == 2 and first.headers["x-next-token"]
        rest = await http.get(
            "/v2/sandboxes",
            params={"limit": 2, "nextToken": first.headers["x-next-token"]},
            headers=key,
        )
        assert len(rest.json()) == 1 and "x-next-token" not in rest.headers
        listed = {s["sandboxID"] for s in first.json() + rest.json()}
        assert listed == {s.id for s in made}
        only = await http.get("/v2/sandboxes", params={"metadata": "n=1"}, headers=key)
        assert [s["metadata"] for s in only.json()] == [{"n": "1"}]


async def test_each_call_names_its_route_and_sandbox_for_logs_and_metrics(
    registry: Registry,
) -> None:
    service = _service(registry)
    seen: list[tuple[str, str | None]] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        state: dict[str, object] = {}
        await service(dict(scope, root_path="/e2b", state=state), receive, send)
        seen.append((str(state[ROUTE_TEMPLATE]), logs.current().get("session_id")))

    key = {"X-API-KEY": "tok"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw/e2b") as http:
        body = (await http.post("/sandboxes", json={}, headers=key)).json()
        sid, token = body["sandboxID"], body["envdAccessToken"]
        data_plane = {"E2b-Sandbox-Id": sid, "X-Access-Token": token}
        await http.get(f"/sandboxes/{sid}", headers=key)
        await http.get("/health", headers={**data_plane, "E2b-Sandbox-Port": "49983"})
        await http.get("/contexts", headers={**data_plane, "E2b-Sandbox-Port": "49999"})
        await http.get("/no/such/path", headers={**data_plane, "E2b-Sandbox-Port": "49983"})
        # e2b <= 2.45 sends the sandbox headers on connect too: still the control plane's
        old = await http.post(
            f"/sandboxes/{sid}/connect",
            json={"timeout": 60},
            headers={**key, "E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983"},
        )
        assert old.status_code == 200, old.text
    assert [route for route, _ in seen] == [
        "/e2b/sandboxes",
        "/e2b/sandboxes/{id}",
        "/e2b/health",
        "/e2b/contexts",
        "/e2b/{path}",
        "/e2b/sandboxes/{id}/connect",
    ]
    assert [bound for _, bound in seen[1:]] == [sid] * 5
    await service.close()


async def test_sandboxes_are_kept_for_the_next_gateway(registry: Registry, tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "e2b", Sandbox.from_json)
    sandboxes = Sandboxes(registry, _saved(registry), store)
    sandboxes.start()
    kept = await sandboxes.create("base", 600, {"who": "me"}, {"A": "1"}, owner=ADMIN)
    gone = await sandboxes.create("base", 600, {}, {}, owner=ADMIN)
    await sandboxes.pause(kept.id, ADMIN)
    await sandboxes.close()
    assert sorted(p.name for p in (tmp_path / "e2b").iterdir()) == sorted(
        [f"{kept.id}.json", f"{gone.id}.json"]
    )
    assert all(p.stat().st_mode & 0o077 == 0 for p in (tmp_path / "e2b").iterdir())
    await registry.delete_session(gone.id, ADMIN)  # its session was not adopted by the next gateway

    after = Sandboxes(registry, _saved(registry), RecordStore(tmp_path / "e2b", Sandbox.from_json))
    after.start()
    try:
        again = after.get(kept.id, ADMIN)
        assert (again.token, again.metadata, again.env) == (kept.token, {"who": "me"}, {"A": "1"})
        assert again.paused and again.end_at == kept.end_at
        assert list(again.contexts) == [kept.id]
        with pytest.raises(SandboxError):
            after.get(gone.id, ADMIN)
        await after.kill(kept.id, ADMIN)
    finally:
        await after.close()
    assert list((tmp_path / "e2b").iterdir()) == []


async def test_what_a_sandbox_cannot_have_is_refused_not_ignored(registry: Registry) -> None:
    service = _service(registry)
    transport = httpx.ASGITransport(app=_with_state(service))
    key = {"X-API-KEY": "tok"}
    async with httpx.AsyncClient(transport=transport, base_url="http://gw/e2b") as http:
        outside = await http.post(
            "/v2/sandboxes", json={"network": {"allowOut": ["example.com"]}}, headers=key
        )  # beyond the gateway's --egress-allow (empty here): E2B's 403, naming it
        assert outside.status_code == 403 and "example.com" in outside.json()["message"]
        literal = await http.post(
            "/v2/sandboxes", json={"network": {"allowOut": ["1.2.3.4"]}}, headers=key
        )  # not a domain, and beyond the ceiling anyway: 403, saying both
        assert literal.status_code == 403 and "IP address" in literal.json()["message"]
        body: Mapping[str, object]
        for body in (
            {"network": {"allowOut": "example.com"}},
            {"mcp": {"github": {}}},
            {"volumeMounts": {"v": "/data"}},
            {"volumeMounts": [{"name": "v"}]},
        ):
            refused = await http.post("/v2/sandboxes", json=body, headers=key)
            assert refused.status_code == 400, (body, refused.text)
            assert refused.json()["code"] == 400
        missing = {"volumeMounts": [{"name": "v", "path": "/data"}]}
        refused = await http.post("/v2/sandboxes", json=missing, headers=key)
        assert refused.status_code == 404 and "no volume" in refused.json()["message"]
        # Old SDKs send allow_internet_access=True for every sandbox: accepted (no effect).
        made = await http.post("/v2/sandboxes", json={"allow_internet_access": True}, headers=key)
        sandbox = made.json()
        envd = {
            "E2b-Sandbox-Id": sandbox["sandboxID"],
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sandbox["envdAccessToken"],
        }
        as_root = {**envd, "Authorization": "Basic cm9vdDo="}  # "root:"
        files = await http.get("/files", params={"path": "a.txt"}, headers=as_root)
        assert files.status_code == 400 and "'root' is not available" in files.json()["message"]
        # Named in the query instead (the SDKs' `username=`, and signed URLs): the same.
        for method in ("GET", "POST"):
            query = {"path": "a.txt", "username": "root"}
            files = await http.request(method, "/files", params=query, headers=envd)
            assert files.status_code == 400, files.text
            assert "'root' is not available" in files.json()["message"]
        # A form's plain field named `file` is the file's text, as envd takes it.
        query = {"path": "plain.txt", "username": "user"}
        field = {"file": (None, "text")}  # multipart, no file name
        plain = await http.post("/files", params=query, files=field, headers=envd)
        assert plain.status_code == 200, plain.text
        assert plain.json() == [
            {"name": "plain.txt", "type": "file", "path": "/home/user/plain.txt"}
        ]
        read = await http.get("/files", params={"path": "plain.txt"}, headers=envd)
        assert read.content == b"text"
        nameless = await http.post("/files", files=field, headers=envd)
        assert nameless.status_code == 400 and "path" in nameless.json()["message"]
        rpc = await http.post("/process.Process/List", json={}, headers=as_root)
        assert rpc.status_code == 400 and rpc.json()["code"] == "invalid_argument"
        as_user = {**envd, "Authorization": "Basic dXNlcjo="}  # "user:"
        listed = await http.post("/process.Process/List", json={}, headers=as_user)
        assert listed.status_code != 400, listed.text
    assert len(registry.sessions()) == 1
    await service.close()


async def test_auto_pause_at_the_end_and_auto_resume_on_a_call(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandboxes_module, "REAP_EVERY", 0.05)
    service = _service(registry)
    service.start()
    transport = httpx.ASGITransport(app=_with_state(service))
    key = {"X-API-KEY": "tok"}
    async with httpx.AsyncClient(transport=transport, base_url="http://gw/e2b") as http:
        made = await http.post(
            "/v2/sandboxes",
            json={"timeout": 1, "autoPause": True, "autoResume": {"enabled": True}},
            headers=key,
        )
        body = made.json()
        sandbox = service.sandboxes.get(body["sandboxID"], ADMIN)
        await until(lambda: sandbox.paused, 5)  # paused at its end, not killed
        assert registry.get(sandbox.id, ADMIN) is not None
        envd = {
            "E2b-Sandbox-Id": sandbox.id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": body["envdAccessToken"],
        }
        assert (await http.get("/health", headers=envd)).status_code == 204  # resumed
        assert not sandbox.paused
        plain = await http.post("/v2/sandboxes", json={"timeout": 60}, headers=key)
        other = service.sandboxes.get(plain.json()["sandboxID"], ADMIN)
        await service.sandboxes.pause(other.id, ADMIN)
        envd_other = {**envd, "E2b-Sandbox-Id": other.id}
        envd_other["X-Access-Token"] = plain.json()["envdAccessToken"]
        assert (await http.get("/health", headers=envd_other)).status_code == 502  # stays paused
    await service.close()


async def test_without_a_token_a_key_is_still_required(tmp_path: Path) -> None:
    """A web page cannot send X-API-KEY without the browser asking the gateway first."""
    async with fake_registry(tmp_path, max_sessions=2) as (registry, _):
        service = _service(registry)
        transport = httpx.ASGITransport(app=_with_state(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw/e2b") as http:
            assert (await http.post("/sandboxes")).status_code == 401
            made = await http.post("/sandboxes", headers={"X-API-KEY": "anything"})
            assert made.status_code == 201, made.text
        await service.close()


async def test_bad_data_plane_input_is_a_clear_error_never_a_500(registry: Registry) -> None:
    service = _service(registry)
    transport = httpx.ASGITransport(app=_with_state(service))
    key = {"X-API-KEY": "tok"}
    async with httpx.AsyncClient(transport=transport, base_url="http://gw/e2b") as http:
        body = (await http.post("/sandboxes", headers=key)).json()
        envd = {
            "E2b-Sandbox-Id": body["sandboxID"],
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": body["envdAccessToken"],
        }
        calls = [
            ("/filesystem.Filesystem/Stat", {"path": 5}),
            ("/filesystem.Filesystem/Move", {"source": "a", "destination": ["b"]}),
            ("/filesystem.Filesystem/ListDir", {"path": "a\\u0000b"}),
            ("/process.Process/SendSignal", {"process": {"pid": "abc"}, "signal": []}),
            ("/process.Process/SendSignal", {"process": {"pid": []}}),
            ("/process.Process/SendInput", {"process": {"tag": 5}}),
            ("/process.Process/CloseStdin", {"process": {"pid": 12345}}),
        ]
        for path, message in calls:
            answer = await http.post(path, json=message, headers=envd)
            assert 400 <= answer.status_code < 500, (path, message, answer.text)
            assert answer.json()["code"] in ("invalid_argument", "not_found"), answer.text
        big = await http.post(
            "/files",
            params={"path": "big.bin"},
            content=b"x" * (registry.settings.max_upload_bytes + 1),
            headers={**envd, "Content-Type": "application/octet-stream"},
        )
        assert big.status_code == 413, big.text
    await service.close()


async def test_a_sandboxs_env_and_a_contexts_cwd_reach_every_new_kernel(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandboxes = Sandboxes(registry, _saved(registry))
    sandbox = await sandboxes.create("base", 60, {}, {"A": "1"}, owner=ADMIN)
    session = sandboxes.session(sandbox)

    def executed() -> list[str]:
        kernel = session.slot.kernel
        assert kernel is not None
        return list(kernel.process.executed)  # type: ignore[attr-defined]

    assert any("environ.update({'A': '1'})" in code for code in executed())
    await session.restart()  # a new kernel: set up again before any cell reaches it
    assert any("environ.update({'A': '1'})" in code for code in executed())
    with pytest.raises(SandboxError) as bad:
        await sandboxes.create("base", 60, {}, {"B=C": "2"}, owner=ADMIN)
    assert bad.value.status == 400 and len(registry.sessions()) == 1

    def cannot(language: str, env: dict[str, str], cwd: str) -> str:
        raise SandboxError(400, f"a working directory cannot be set for {language}")

    monkeypatch.setattr(contexts_module, "setup_code", cannot)
    with pytest.raises(SandboxError):
        await sandboxes.create_context(sandbox, "python", "/home/user/sub")
    assert registry.companions(sandbox.id) == []  # its kernel was not left behind
