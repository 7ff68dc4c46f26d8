"""E2B's template API with E2B's own SDK (`e2b`, and `e2b_code_interpreter` for the
sandboxes), unchanged, against a real gateway on the docker backend: a template built
from a context folder and run, builds in the background, `Template.exists`, tags, what
is refused and how, and the signed upload URL. Containers reach no registry here: every
base is the gateway's own image."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import BuildException, LogEntry, Template, TemplateException
from e2b.api.client.api.templates import get_templates_template_id, get_v2_templates
from e2b.api.client.client import AuthenticatedClient
from e2b.api.client.models import TemplateWithBuilds

from tests.support.backends import backend_settings, require_backend
from tests.support.server import ServerFactory, ServerThread

sdk = pytest.importorskip("e2b_code_interpreter")
TOKEN = "e2b_" + "5e" * 20
VARIABLES = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")
UPLOAD_CAP = 256 * 1024


@pytest.fixture(scope="module")
def e2b_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A docker gateway's `/e2b`, set as E2B's variables for the module. Its templates are
    deleted at the end, and the images of any whose removal failed (a template's warm
    kernel still held it) once the gateway has stopped."""
    require_backend("docker")
    settings = backend_settings(
        "docker",
        tmp_path_factory.mktemp("gw-docker"),
        token=TOKEN,
        pool_size=1,
        max_sessions=8,
        template_upload_max="256k",
    )
    saved = {key: os.environ.get(key) for key in VARIABLES}
    made: set[str] = set()
    try:
        with ServerThread(settings) as server:
            os.environ["E2B_API_URL"] = os.environ["E2B_SANDBOX_URL"] = server.url + "/e2b"
            os.environ["E2B_API_KEY"] = TOKEN
            try:
                yield server.url + "/e2b"
            finally:
                made = _delete_templates(server.url + "/e2b")
    finally:
        _remove_images(made)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _delete_templates(url: str) -> set[str]:
    with httpx.Client(base_url=url, headers=_key(), timeout=120) as http:
        ids = {t["templateID"] for t in http.get("/v2/templates").json()}
        for template_id in ids:
            http.delete(f"/templates/{template_id}")
    return ids


def _remove_images(template_ids: set[str]) -> None:
    import docker

    client = docker.from_env()
    try:
        for image in client.images.list(filters={"label": "io.kernel-gateway.template"}):
            if image.labels.get("io.kernel-gateway.template") in template_ids:
                for tag in image.tags:
                    client.images.remove(tag)
    finally:
        client.close()


@pytest.fixture
def http(e2b_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=e2b_url, headers=_key(), timeout=60) as client:
        yield client


def _key() -> dict[str, str]:
    return {"X-API-KEY": TOKEN}


def _name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("context")
    (folder / "data").mkdir()
    (folder / "data" / "hello.txt").write_text("hello from the context\n")
    (folder / "data" / "nested").mkdir()
    (folder / "data" / "nested" / "deep.txt").write_text("deep\n")
    return folder


@pytest.fixture(scope="module")
def built(e2b_url: str, context: Path) -> tuple[str, list[str]]:
    """A template made by the SDK from `context`: (its name, its build log lines)."""
    name = _name("ctx")
    template = (
        Template(file_context_path=str(context))
        .from_base_image()
        .copy("data/", "/opt/data/")
        .copy("data/hello.txt", "/home/user/")  # given to each sandbox as its own copy
        .run_cmd("cat /opt/data/hello.txt && ls /opt/data/nested")
        .set_envs({"GREETING": "hi from the template"})
    )
    lines: list[str] = []
    # skip_cache: the steps run (and log) whatever an earlier run left in Docker's cache.
    Template.build(template, name, skip_cache=True, on_build_logs=lambda e: lines.append(e.message))
    return name, lines


def test_a_built_template_runs_sandboxes_with_its_files_and_env(
    built: tuple[str, list[str]], http: httpx.Client
) -> None:
    name, lines = built
    assert "hello from the context" in lines and "deep.txt" in lines, lines
    with sdk.Sandbox.create(name, timeout=120) as sandbox:
        seen = sandbox.run_code(
            "import os\nprint(open('/opt/data/hello.txt').read().strip(), "
            "open('/opt/data/nested/deep.txt').read().strip(), os.environ['GREETING'])"
        )
        assert seen.logs.stdout == ["hello from the context deep hi from the template\n"], seen
        assert sandbox.files.read("hello.txt") == "hello from the context\n"
        assert sandbox.run_code("1 + 1").text == "2"
        info = sandbox.get_info()
        template_id = http.get(f"/templates/aliases/{name}").json()["templateID"]
        assert info.template_id == template_id and info.name == name
        listed = {s.sandbox_id: s for s in sdk.Sandbox.list().next_items()}
        assert listed[sandbox.sandbox_id].template_id == template_id
        in_use = http.delete(f"/templates/{name}")
        assert in_use.status_code == 409 and "in use" in in_use.json()["message"]


def test_the_sdks_models_read_the_lists_and_a_template_with_its_builds(
    built: tuple[str, list[str]], e2b_url: str
) -> None:
    name, _ = built
    client = AuthenticatedClient(
        base_url=e2b_url, token=TOKEN, auth_header_name="X-API-KEY", prefix=""
    )
    with client:
        listed = get_v2_templates.sync(client=client)
        assert isinstance(listed, list)
        mine = [t for t in listed if name in t.names]
        assert len(mine) == 1 and mine[0].build_status.value == "ready"
        one = get_templates_template_id.sync(template_id=name, client=client)
        assert isinstance(one, TemplateWithBuilds)
        assert one.template_id == mine[0].template_id and one.build_count == len(one.builds)
        assert str(one.builds[0].build_id) == mine[0].build_id


def test_a_build_in_the_background_is_followed_by_its_status(e2b_url: str) -> None:
    template = Template().from_base_image().run_cmd("echo started; sleep 2; echo slept")
    info = Template.build_in_background(template, _name("bg"), skip_cache=True)
    first = Template.get_build_status(info)
    assert first.status.value in ("building", "ready"), first
    offset, messages = 0, []
    deadline = time.monotonic() + 300
    while True:
        status = Template.get_build_status(info, logs_offset=offset)
        offset += len(status.log_entries)
        messages += [e.message for e in status.log_entries]
        if status.status.value in ("ready", "error") and not status.log_entries:
            break
        assert time.monotonic() < deadline, messages
        time.sleep(0.3)
    assert status.status.value == "ready", (status.reason, messages)
    assert "started" in messages and messages.count("slept") == 1  # each entry once


def test_exists(built: tuple[str, list[str]]) -> None:
    name, _ = built
    assert Template.exists("base") and Template.exists("code-interpreter-v1")
    assert Template.exists(name)
    assert not Template.exists(f"nonexistent-{uuid.uuid4()}")


def test_tags_are_built_assigned_listed_removed_and_start_sandboxes(e2b_url: str) -> None:
    name = _name("tags")
    # /tmp is the kernel's own tmpfs at run time: what a build leaves there is not seen.
    template = Template().from_base_image().run_cmd("echo v1 > /opt/version", user="root")
    info = Template.build(template, f"{name}:v1")
    assert info.tags == ["v1"]
    assigned = Template.assign_tags(f"{name}:v1", ["Production", "stable"])
    assert sorted(assigned.tags) == ["production", "stable"]
    assert assigned.build_id == info.build_id
    tags = {t.tag: t.build_id for t in Template.get_tags(name)}
    assert tags == {"v1": info.build_id, "production": info.build_id, "stable": info.build_id}
    with sdk.Sandbox.create(f"{name}:production", timeout=60) as sandbox:
        shown = sandbox.run_code("print(open('/opt/version').read().strip())")
        assert shown.logs.stdout == ["v1\n"], shown
    Template.remove_tags(name, "production")
    assert {t.tag for t in Template.get_tags(name)} == {"v1", "stable"}
    with pytest.raises(Exception, match="no tag 'production'"):
        sdk.Sandbox.create(f"{name}:production", timeout=60)
    for bad in (":invalid-tag", f"{name}:"):
        with pytest.raises(TemplateException, match="400"):
            Template.assign_tags(f"{name}:v1", bad)
    with pytest.raises(TemplateException, match="400"):
        Template.assign_tags(f"{name}:", "fine")
    with pytest.raises(TemplateException, match="default"):
        Template.remove_tags(name, "default")


def test_a_failing_step_names_its_output(e2b_url: str) -> None:
    template = Template().from_base_image().run_cmd("echo the-step-said-this; exit 3")
    with pytest.raises(BuildException) as failed:
        Template.build(template, _name("fail"), skip_cache=True)
    assert "the-step-said-this" in str(failed.value), failed.value
    assert "echo the-step-said-this" in str(failed.value)


def test_a_registry_image_is_refused_with_what_a_base_can_be(e2b_url: str) -> None:
    template = Template().from_image("ubuntu:22.04").run_cmd("true")
    with pytest.raises(BuildException) as refused:
        Template.build(template, _name("ubuntu"))
    message = str(refused.value)
    assert "400" in message and "ubuntu:22.04" in message and "e2bdev/base" in message


def test_a_dockerfile_from_e2bs_base_builds(e2b_url: str) -> None:
    dockerfile = "FROM e2bdev/base\nENV STAGE=docker\nRUN echo from-a-dockerfile-$STAGE\n"
    logs: list[LogEntry] = []
    name = _name("df")
    template = Template().from_dockerfile(dockerfile)
    Template.build(template, name, skip_cache=True, on_build_logs=logs.append)
    assert any(e.message == "from-a-dockerfile-docker" for e in logs), [e.message for e in logs]
    with sdk.Sandbox.create(name, timeout=60) as sandbox:
        shown = sandbox.run_code("import os; print(os.environ['STAGE'])")
        assert shown.logs.stdout == ["docker\n"], shown


def test_an_unknown_template_is_e2bs_404_naming_it(e2b_url: str) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match=f"404.*{missing}"):
        sdk.Sandbox.create(missing, timeout=60)


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _upload_url(http: httpx.Client, template_id: str, files_hash: str) -> str:
    asked = http.get(f"/templates/{template_id}/files/{files_hash}")
    assert asked.status_code == 201, asked.text
    assert asked.json()["present"] is False
    url: str = asked.json()["url"]
    return url


def test_the_upload_url_is_signed_capped_and_takes_only_tars(http: httpx.Client) -> None:
    made = http.post("/v3/templates", json={"name": _name("up")})
    assert made.status_code == 202, made.text
    template_id, build_id = made.json()["templateID"], made.json()["buildID"]
    archive = _tar({"a.txt": b"a"})
    files_hash = hashlib.sha256(archive).hexdigest()
    url = _upload_url(http, template_id, files_hash)
    assert url.startswith(str(http.base_url).rstrip("/") + f"/templates/{template_id}/files/")
    with httpx.Client(timeout=60) as plain:  # as the SDK uploads: no API key
        forged = plain.put(url.replace("token=", "token=1"), content=archive)
        assert forged.status_code == 403 and forged.json()["code"] == 403
        other = url.replace(files_hash, "0" * 64)
        assert plain.put(other, content=archive).status_code == 403  # bound to its hash
        not_tar = plain.put(url, content=b"not a tar at all")
        assert not_tar.status_code == 400 and "tar" in not_tar.json()["message"]
        huge = plain.put(url, content=b"\0" * (UPLOAD_CAP + 1))
        assert huge.status_code == 413 and huge.json()["code"] == 413
        assert plain.put(url, content=archive).status_code == 200
    again = http.get(f"/templates/{template_id}/files/{files_hash}").json()
    assert again["present"] is True
    never = "1" * 64
    step = {"type": "COPY", "args": ["a.txt", "/opt/a.txt"], "filesHash": never}
    started = http.post(f"/v2/templates/{template_id}/builds/{build_id}", json={"steps": [step]})
    assert started.status_code == 400 and "never uploaded" in started.json()["message"]
    registry = http.post(
        f"/v2/templates/{template_id}/builds/{build_id}",
        json={"fromImageRegistry": {"type": "registry", "username": "u", "password": "p"}},
    )
    assert registry.status_code == 400 and "registr" in registry.json()["message"]
    assert http.delete(f"/templates/{template_id}").status_code == 204
    assert http.get(f"/templates/{template_id}").status_code == 404


def test_bad_input_is_e2bs_400_or_404_never_a_500(http: httpx.Client) -> None:
    answers: list[tuple[int, Any]] = []
    for method, path, body in (
        ("POST", "/v3/templates", {}),
        ("POST", "/v3/templates", {"name": "base"}),
        ("POST", "/v3/templates", {"name": "Bad Name!"}),
        ("POST", "/v3/templates", {"name": "ok-name", "cpuCount": "two"}),
        ("GET", "/templates/nope/builds/x/status", None),
        ("GET", "/templates/nope/files/" + "0" * 64, None),
        ("GET", "/templates/aliases/nope", None),
        ("DELETE", "/templates/nope", None),
        ("POST", "/templates/tags", {"target": "nope", "tags": ["x"]}),
        ("DELETE", "/templates/tags", {"name": "nope:tag", "tags": ["x"]}),
    ):
        response = http.request(method, path, json=body)
        answers.append((response.status_code, response.json()))
        assert response.json()["code"] == response.status_code
    assert [status for status, _ in answers] == [400, 400, 400, 400, 404, 404, 404, 404, 404, 400]
    unsigned = http.put("/templates/nope/files/" + "0" * 64 + "/upload", content=b"x")
    assert unsigned.status_code == 403


def test_where_the_backend_builds_no_templates_the_answers_say_so(servers: ServerFactory) -> None:
    server = servers("local", token=TOKEN)
    with httpx.Client(base_url=server.url + "/e2b", headers=_key(), timeout=60) as http:
        assert http.get("/templates/aliases/base").json() == {"templateID": "base", "public": True}
        assert http.get("/templates/aliases/mine").status_code == 404
        assert http.get("/v2/templates").json() == []
        made = http.post("/v3/templates", json={"name": "mine"})
        assert made.status_code == 501 and "docker backend" in made.json()["message"]
        sandbox = http.post("/v2/sandboxes", json={"templateID": "mine"})
        assert sandbox.status_code == 400 and "code-interpreter-v1" in sandbox.json()["message"]
