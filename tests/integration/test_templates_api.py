"""`/templates` on a real gateway (Docker, runc: builds under gVisor are test_templates.py's):
build with files, an environment variable and a command; a session on the template sees
all three; logs live as SSE; the errors a user meets; delete."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from kernel_gateway.kernels.backends.labels import LABEL_LOCK, LABEL_ROLE
from tests.support.api import collected, execute, parse_sse
from tests.support.backends import backend_settings
from tests.support.server import ServerFactory, ServerThread


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("docker", pool_size=0, token="tok")


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    headers = {"Authorization": "Bearer tok"}
    with httpx.Client(base_url=server.url, timeout=120, headers=headers) as c:
        yield c


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def follow(client: httpx.Client, build: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The build's log lines, live, and the build as the `end` event gives it."""
    lines: list[str] = []
    path = f"/templates/{build['template']}/builds/{build['id']}/logs"
    with client.stream("GET", path) as response:
        assert response.status_code == 200
        for event, data in parse_sse(response.iter_bytes()):
            if event == "log":
                lines.append(data["message"])
            elif event == "end":
                return lines, data
    raise AssertionError(f"no end event after {lines}")


def test_a_session_on_a_template_has_its_files_env_and_command_output(
    client: httpx.Client,
) -> None:
    template = name()
    context = tar_of({"data/table.csv": b"a,b\n1,2\n"})
    response = client.post(
        "/templates",
        json={
            "name": template,
            "steps": [
                {"type": "COPY", "args": ["data", "/opt/data/"]},
                {"type": "ENV", "args": ["DATASET", "/opt/data/table.csv"]},
                {"type": "RUN", "args": ["echo built > /opt/built.txt && echo step-ran", "root"]},
            ],
            "context": base64.b64encode(context).decode(),
            "tags": ["v1"],
        },
    )
    assert response.status_code == 202, response.text
    started = response.json()
    assert response.headers["location"] == f"/templates/{template}/builds/{started['id']}"
    assert started["state"] == "building"
    lines, build = follow(client, started)
    assert build["state"] == "ready", (build, lines)
    assert "step-ran" in lines and any(line.startswith("Step 3/3") for line in lines)
    assert build["tags"] == ["v1"] and build["image"]

    response = client.post("/sessions", json={"template": f"{template}:v1"})
    assert response.status_code == 201, response.text
    session = response.json()
    assert session["template"] == {
        "id": build["template_id"],
        "name": template,
        "build_id": build["id"],
    }
    try:
        code = (
            "import os\n"
            "print(open(os.environ['DATASET']).read().strip().replace(chr(10), '|'))\n"
            "print(open('/opt/built.txt').read().strip())\n"
            "print(os.getuid())"
        )
        stream = execute(client, session["id"], code)
        assert stream.stdout.split() == ["a,b|1,2", "built", "1000"]
        # A stateless cell on the template: a kernel of its own, gone afterwards.
        document = collected(
            client, "/execute", {"code": code, "template": f"{template}:v1"}, timeout=120
        )
        printed = "".join(e["data"]["text"] for e in document["events"] if e["event"] == "stdout")
        assert printed.split() == ["a,b|1,2", "built", "1000"]
        listed = client.get(f"/templates/{template}").json()
        assert listed["sessions"] == 1 and listed["ready_build"] == build["id"]
        assert listed["language"] == "python"
        refused = client.delete(f"/templates/{template}")
        assert refused.status_code == 409
        assert refused.json()["error"]["type"] == "template_conflict"
    finally:
        client.delete(f"/sessions/{session['id']}")
    assert client.delete(f"/templates/{template}").status_code == 204
    gone = client.get(f"/templates/{template}")
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "template_not_found"


def test_a_dockerfile_and_files_uploaded_by_hash(client: httpx.Client) -> None:
    context = tar_of({"app.py": b"ANSWER = 42\n"})
    files_hash = hashlib.sha256(context).hexdigest()
    assert client.get(f"/templates/files/{files_hash}").json()["present"] is False
    uploaded = client.put(f"/templates/files/{files_hash}", content=context)
    assert uploaded.status_code == 201, uploaded.text
    assert uploaded.json() == {"hash": files_hash, "present": True, "size_bytes": len(context)}
    template = name()
    dockerfile = "FROM python\nARG V=7\nENV APP_VERSION=$V\nRUN mkdir -p /opt/app\n"
    response = client.post(
        "/templates",
        json={
            "name": template,
            "dockerfile": dockerfile,
            "context": base64.b64encode(context).decode(),
        },
    )
    assert response.status_code == 202, response.text
    _, build = follow(client, response.json())
    assert build["state"] == "ready", build
    session = client.post("/sessions", json={"template": template}).json()
    try:
        stream = execute(client, session["id"], "import os; print(os.environ['APP_VERSION'])")
        assert stream.stdout.strip() == "7"
    finally:
        client.delete(f"/sessions/{session['id']}")
        client.delete(f"/templates/{template}")


def test_a_failed_build_names_its_step_and_output(client: httpx.Client) -> None:
    template = name()
    response = client.post(
        "/templates",
        json={
            "name": template,
            "steps": [
                {"type": "RUN", "args": ["true"]},
                {"type": "RUN", "args": ["echo no such package >&2; exit 100"]},
            ],
        },
    )
    assert response.status_code == 202, response.text
    lines, build = follow(client, response.json())
    assert build["state"] == "error" and build["failed_step"] == 2
    assert "exited with code 100" in build["reason"] and "no such package" in build["reason"]
    assert any(line.startswith("Build failed") for line in lines)
    page = client.get(
        f"/templates/{template}/builds/{build['id']}/logs?offset=1",
        headers={"Accept": "application/json"},
    ).json()
    assert page["build"]["state"] == "error" and page["next_offset"] == 1 + len(page["logs"])
    refused = client.post("/sessions", json={"template": template})
    assert refused.status_code == 409, refused.text
    assert "no ready build" in refused.json()["error"]["message"]
    assert client.delete(f"/templates/{template}").status_code == 204


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"steps": [{"type": "FROB", "args": []}]}, 422, "type"),
        ({"steps": [{"type": "COPY", "args": ["x", "/x"]}]}, 422, "COPY needs files"),
        ({"steps": [{"type": "COPY", "args": ["../x", "/x"]}], "context": "AAAA"}, 422, "context"),
        ({"base": "ubuntu:22.04"}, 422, "not one of this gateway's"),
        ({"base": "template:no-such-template"}, 404, "no-such-template"),
        ({"dockerfile": "RUN true"}, 422, "FROM"),
        ({"dockerfile": "FROM python\nFROM python"}, 422, "line 2"),
    ],
)
def test_bad_requests_get_clear_errors_and_leave_no_template(
    client: httpx.Client, body: dict[str, Any], status: int, words: str
) -> None:
    template = name()
    response = client.post("/templates", json={"name": template, **body})
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]
    assert client.get(f"/templates/{template}").status_code == 404


def test_names_and_references_that_do_not_exist(client: httpx.Client) -> None:
    assert client.post("/templates", json={"name": "Bad Name"}).status_code == 422
    missing = client.post("/sessions", json={"template": "no-such-template"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "template_not_found"
    template = name()
    first = client.post("/templates", json={"name": template})
    assert first.status_code == 202
    again = client.post("/templates", json={"name": template})
    assert again.status_code == 409 and "/builds" in again.json()["error"]["message"]
    _, build = follow(client, first.json())
    assert build["state"] == "ready"
    assert client.post("/sessions", json={"template": f"{template}:nope"}).status_code == 404
    not_tar = client.put(f"/templates/files/{'0' * 64}", content=b"not a tar")
    assert not_tar.status_code == 400
    assert client.get(f"/templates/files/{'0' * 64}").json()["present"] is False
    assert client.delete(f"/templates/{template}").status_code == 204


def test_files_a_template_puts_in_the_working_directory_reach_each_new_session(
    client: httpx.Client,
) -> None:
    template = name()
    context = tar_of({"notes/readme.txt": b"read me\n"})
    response = client.post(
        "/templates",
        json={
            "name": template,
            "steps": [
                {"type": "COPY", "args": ["notes", "/home/user/notes/"]},
                {"type": "RUN", "args": ["echo made > /home/user/made.txt"]},
            ],
            "context": base64.b64encode(context).decode(),
        },
    )
    assert response.status_code == 202, response.text
    lines, build = follow(client, response.json())
    assert build["state"] == "ready", (build, lines)
    assert any("3 files in /home/user kept for new sessions" in line for line in lines), lines
    sessions = [client.post("/sessions", json={"template": template}).json() for _ in range(2)]
    try:
        first, second = (s["id"] for s in sessions)
        listed = {f["path"] for f in client.get(f"/sessions/{first}/files").json()["files"]}
        assert {"notes/readme.txt", "made.txt"} <= listed
        code = (
            "import os; print(open('notes/readme.txt').read().strip(), os.stat('made.txt').st_uid)"
        )
        assert execute(client, first, code).stdout.split() == ["read", "me", "1000"]
        # Each session has its own copy: a change in one is not seen by the other.
        execute(client, first, "os.remove('made.txt')")
        check = "import os; print(os.path.exists('made.txt'))"
        assert execute(client, second, check).stdout.strip() == "True"
    finally:
        for session in sessions:
            client.delete(f"/sessions/{session['id']}")
        client.delete(f"/templates/{template}")


def test_a_session_on_a_template_hibernates_and_resumes_on_its_template(
    client: httpx.Client,
) -> None:
    template = name()
    response = client.post(
        "/templates",
        json={
            "name": template,
            "steps": [{"type": "RUN", "args": ["echo tpl > /opt/mark", "root"]}],
        },
    )
    _, build = follow(client, response.json())
    assert build["state"] == "ready", build
    session = client.post("/sessions", json={"template": template}).json()
    try:
        execute(client, session["id"], "x = 41")
        hibernated = client.post(f"/sessions/{session['id']}/hibernate")
        assert hibernated.status_code == 200, hibernated.text
        assert hibernated.json()["status"] == "hibernated"
        code = "print(x + 1, open('/opt/mark').read().strip())"
        assert execute(client, session["id"], code).stdout.split() == ["42", "tpl"]
        assert client.get(f"/sessions/{session['id']}").json()["template"]["name"] == template
    finally:
        client.delete(f"/sessions/{session['id']}")
        client.delete(f"/templates/{template}")


def test_a_template_cannot_change_how_its_kernels_run(client: httpx.Client) -> None:
    """Its USER, WORKDIR and a removed launcher do not reach the kernels: they run as uid
    1000, on a read-only root, with no network, from the gateway's own launcher."""
    template = name()
    response = client.post(
        "/templates",
        json={
            "name": template,
            "steps": [
                {"type": "RUN", "args": ["rm -rf /opt/kernel", "root"]},
                {"type": "USER", "args": ["root"]},
                {"type": "WORKDIR", "args": ["/root"]},
            ],
        },
    )
    lines, build = follow(client, response.json())
    assert build["state"] == "ready", (build, lines)
    session = client.post("/sessions", json={"template": template}).json()
    try:
        code = (
            "import os, pathlib\n"
            "print(os.getuid(), os.getcwd())\n"
            "try:\n"
            "    pathlib.Path('/opt/x').write_text('x')\n"
            "except OSError as e:\n"
            "    print('read-only', e.errno)\n"
            "print(sorted(os.listdir('/sys/class/net')))"
        )
        out = execute(client, session["id"], code).stdout.splitlines()
        assert out[0] == "1000 /home/user"
        assert out[1].startswith("read-only")
        assert out[2] == "['lo']"
    finally:
        client.delete(f"/sessions/{session['id']}")
        client.delete(f"/templates/{template}")


def test_a_template_that_breaks_the_kernel_fails_its_readiness_check(
    client: httpx.Client,
) -> None:
    template = name()
    response = client.post(
        "/templates",
        json={
            "name": template,
            "steps": [{"type": "RUN", "args": ["rm -f /usr/bin/python3*", "root"]}],
        },
    )
    lines, build = follow(client, response.json())
    assert build["state"] == "error", lines
    assert build["failed_step"] is None
    assert "the kernel did not start from the image" in build["reason"]
    assert build["image"] is None
    assert client.post("/sessions", json={"template": template}).status_code == 409
    client.delete(f"/templates/{template}")


def test_pip_install_steps_fetch_wheels_through_the_host(
    client: httpx.Client, package_index: tuple[str, str]
) -> None:
    """Containers reach no index; the host does (here: an index on the host's loopback,
    which no container could reach even with a network)."""
    index, package = package_index
    template = name()
    response = client.post(
        "/templates",
        json={
            "name": template,
            "steps": [
                {"type": "RUN", "args": [f"pip install --index-url {index} {package}", "root"]}
            ],
        },
    )
    lines, build = follow(client, response.json())
    assert build["state"] == "ready", (build, lines)
    assert any("pip download on the gateway's host" in line for line in lines)
    assert any("--no-index --find-links /tmp/kg-wheels" in line for line in lines)
    session = client.post("/sessions", json={"template": template}).json()
    try:
        code = f"import {package}; print({package}.VALUE)"
        assert execute(client, session["id"], code).stdout.strip() == "from the index"
    finally:
        client.delete(f"/sessions/{session['id']}")
    # The same package the container would fetch itself: no network, so it fails, naming pip.
    failing = client.post(
        f"/templates/{template}/builds",
        json={
            "steps": [
                {"type": "RUN", "args": [f"pip install --index-url {index} {package} && true"]}
            ]
        },
    )
    _, failed = follow(client, failing.json())
    assert failed["state"] == "error" and failed["failed_step"] == 1
    client.delete(f"/templates/{template}")


def test_a_template_keeps_one_kernel_warm_while_used_and_none_once_idle(
    servers: ServerFactory,
) -> None:
    server = servers("docker", pool_size=1, template_pool_idle=3.0)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        template = name()
        _, build = follow(client, client.post("/templates", json={"name": template}).json())
        assert build["state"] == "ready", build
        engine = docker.from_env()
        try:

            def kernels() -> int:
                """This gateway's kernels of the template (an empty template's image is
                the same for every gateway on the engine: another test's may run too)."""
                found = engine.containers.list(filters={"ancestor": build["image"]})
                return sum(1 for c in found if c.labels.get(LABEL_LOCK, "").startswith(f"{own}/"))

            own = str(server.settings.runtime_dir)

            assert kernels() == 0  # none before it is used
            session = client.post("/sessions", json={"template": template}).json()
            deadline = time.monotonic() + 60
            while kernels() < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert kernels() == 2  # the session's, and one warm for the next
            second = client.post("/sessions", json={"template": template}).json()
            assert second["template"]["build_id"] == build["id"]
            for s in (session, second):
                client.delete(f"/sessions/{s['id']}")
            deadline = time.monotonic() + 60
            while kernels() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert kernels() == 0  # idle for 3 s: its warm kernel is stopped
        finally:
            engine.close()
        assert client.delete(f"/templates/{template}").status_code == 204


def test_start_and_ready_commands_run_before_each_kernel_is_handed_out(
    client: httpx.Client,
) -> None:
    template = name()
    response = client.post(
        "/templates",
        json={
            "name": template,
            "steps": [
                {"type": "RUN", "args": ["mkdir -p /opt/site && echo up > /opt/site/mark", "root"]}
            ],
            "start_cmd": "sleep 1; python3 -m http.server 8765 --directory /opt/site",
            "ready_cmd": "curl -sf http://127.0.0.1:8765/mark",
        },
    )
    lines, build = follow(client, response.json())
    assert build["state"] == "ready", (build, lines)
    assert any(line.startswith("Waiting for the ready command") for line in lines)
    session = client.post("/sessions", json={"template": template}).json()
    try:
        code = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8765/mark').read().decode().strip())"
        # The server the start command started is up when the session is handed out.
        assert execute(client, session["id"], code).stdout.strip() == "up"
    finally:
        client.delete(f"/sessions/{session['id']}")
    client.delete(f"/templates/{template}")


def test_a_ready_command_that_never_succeeds_fails_the_build(servers: ServerFactory) -> None:
    # It is given --kernel-start-timeout (8 s here) beside the kernel the check starts.
    server = servers("docker", pool_size=0, kernel_start_timeout=8.0)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        template = name()
        response = client.post("/templates", json={"name": template, "ready_cmd": "exit 1"})
        _, failed = follow(client, response.json())
        assert failed["state"] == "error", failed
        assert "ready command 'exit 1' did not succeed within 8 s" in failed["reason"]
        client.delete(f"/templates/{template}")


def test_templates_survive_a_restart_and_a_build_cut_short_leaves_nothing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A plain restart (no --persist-sessions) on the same runtime dir: the template is
    there and starts sessions. The build that was in a RUN step when the gateway stopped
    left no container, no image and no folder, and is marked failed."""
    root = tmp_path_factory.mktemp("gw-restart")
    settings = backend_settings("docker", root, pool_size=0)
    kept, cut = name(), name()
    with ServerThread(settings) as first, httpx.Client(base_url=first.url, timeout=120) as client:
        steps = [{"type": "RUN", "args": ["echo kept > /opt/mark", "root"]}]
        made = client.post("/templates", json={"name": kept, "steps": steps})
        _, ready = follow(client, made.json())
        assert ready["state"] == "ready", ready
        context = tar_of({"note.txt": b"for the step\n"})
        running = client.post(
            "/templates",
            json={
                "name": cut,
                "steps": [
                    {"type": "COPY", "args": ["note.txt", "/opt/note.txt"]},
                    {"type": "RUN", "args": [f"echo {uuid.uuid4().hex}; echo started; sleep 300"]},
                ],
                "context": base64.b64encode(context).decode(),
            },
        ).json()
        path = f"/templates/{cut}/builds/{running['id']}/logs"
        with client.stream("GET", path) as response:
            for event, data in parse_sse(response.iter_bytes()):
                if event == "log" and data["message"] == "started":
                    break
                assert event == "log", (event, data)
        cut_id = client.get(f"/templates/{cut}").json()["id"]
        assert len(build_containers(root)) == 1  # the RUN step's, running
        assert template_images(cut_id) != []  # the COPY step's image at least
    # The gateway stopped during the RUN step.
    assert build_containers(root) == []
    assert template_images(cut_id) == []
    assert list(root.glob("*/k/*")) == []  # no folder a step was given

    with ServerThread(settings) as second, httpx.Client(base_url=second.url, timeout=120) as client:
        listed = {t["name"]: t for t in client.get("/templates").json()["templates"]}
        assert listed[kept]["ready_build"] == ready["id"]
        stopped = client.get(f"/templates/{cut}/builds/{running['id']}").json()
        assert stopped["state"] == "error" and stopped["image"] is None, stopped
        session = client.post("/sessions", json={"template": kept})
        assert session.status_code == 201, session.text
        sid = session.json()["id"]
        assert execute(client, sid, "print(open('/opt/mark').read())").stdout.strip() == "kept"
        client.delete(f"/sessions/{sid}")
        for template in (kept, cut):
            assert client.delete(f"/templates/{template}").status_code == 204


def build_containers(root: Path) -> list[str]:
    """The build containers of gateways on the runtime dir `root`, running or not."""
    engine = docker.from_env()
    try:
        found = engine.containers.list(all=True, filters={"label": f"{LABEL_ROLE}=build"})
        return [str(c.id) for c in found if c.labels.get(LABEL_LOCK, "").startswith(f"{root}/")]
    finally:
        engine.close()


def template_images(template_id: str) -> list[str]:
    """Every image (named, or a step's) a build of the template made."""
    engine = docker.from_env()
    try:
        filters = {"label": f"io.kernel-gateway.template={template_id}"}
        found: list[str] = engine.api.images(filters=filters, all=True, quiet=True)
        return found
    finally:
        engine.close()
