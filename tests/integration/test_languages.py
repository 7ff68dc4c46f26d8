"""JavaScript, TypeScript, R, Bash and Java kernels: real kernels in their images, docker backend.

Each language gets the same checks as Python's: state across cells, stdout streamed live,
errors with the language's own name, rich display, a runaway loop stopped by its timeout
with the session still usable, a file written by the code arriving as a `file` event,
stateless runs; then the same kernels through Jupyter Server's gateway client and through
MCP's official client. Unknown languages are refused with a clear 400.
"""

from __future__ import annotations

import asyncio
import base64
import io
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from jupyter_server.gateway.gateway_client import GatewayClient
from jupyter_server.gateway.managers import GatewayKernelManager
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from kernel_gateway.kernels.languages import family_image
from tests.support.api import Stream, execute, parse_sse
from tests.support.backends import IMAGE, require_languages
from tests.support.jupyter import Outputs, gateway_client_for, jupyter_process, run_cell
from tests.support.server import ServerFactory, ServerThread

TOKEN = "languages-token"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LANGUAGES = ("javascript", "typescript", "r", "bash", "java")


@dataclass(frozen=True)
class Case:
    """What to run in one language, and what it must give."""

    assign: str
    read: str
    """Reads the variable `assign` set, plus one: 42."""
    live: str
    """Prints `first`, waits 3 s, prints `second`."""
    error: str
    error_name: str
    loop: str
    write_file: str
    """Writes the file `FILES[language]`."""
    display: str | None
    display_mime: str | None


CASES = {
    "javascript": Case(
        assign="let x = 41",
        read="x + 1",
        live='console.log("first"); await new Promise(r => setTimeout(r, 3000)); '
        'console.log("second")',
        error='throw new TypeError("boom")',
        error_name="TypeError",
        loop="while (true) {}",
        write_file='Deno.writeTextFileSync("from-js.txt", "hello from js")',
        display='Deno.jupyter.display({"text/html": "<b>bold</b>"}, {raw: true})',
        display_mime="text/html",
    ),
    "typescript": Case(
        assign="const n: number = 41",
        read="n + 1",
        live='console.log("first"); await new Promise<void>(r => setTimeout(r, 3000)); '
        'console.log("second")',
        error='throw new RangeError("boom")',
        error_name="RangeError",
        loop="for (;;) {}",
        write_file='await Deno.writeTextFile("from-ts.txt", "hello from ts")',
        display="Deno.jupyter.display({'image/svg+xml': "
        '\'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>\'}, {raw: true})',
        display_mime="image/svg+xml",
    ),
    "r": Case(
        assign="x <- 41",
        read="x + 1",
        live='cat("first\\n"); Sys.sleep(3); cat("second\\n")',
        error='stop("boom")',
        error_name="ERROR",
        loop="repeat {}",
        write_file='png("from-r.png"); plot(1:3); invisible(dev.off())',
        display="plot(1:10)",
        display_mime="image/png",
    ),
    "bash": Case(
        assign="X=41",
        read="echo $((X+1))",
        live="echo first; sleep 3; echo second",
        error="ls /no/such/dir",
        error_name="ExitStatus",
        loop="while true; do :; done",
        write_file="echo 'hello from bash' > from-bash.txt",
        display=None,
        display_mime=None,
    ),
    "java": Case(
        assign="int x = 41;",
        read="x + 1",
        live='System.out.println("first"); Thread.sleep(3000); System.out.println("second");',
        error='throw new IllegalStateException("boom");',
        error_name="IllegalStateException",
        loop="while (true) {}",
        write_file='java.nio.file.Files.writeString(java.nio.file.Path.of("from-java.txt"), '
        '"hello from java");',
        display="var img = new java.awt.image.BufferedImage(8, 8, "
        "java.awt.image.BufferedImage.TYPE_INT_RGB); display(img);",
        display_mime="image/png",
    ),
}
FILES = {
    "javascript": ("from-js.txt", "text/plain"),
    "typescript": ("from-ts.txt", "text/plain"),
    "r": ("from-r.png", "image/png"),
    "bash": ("from-bash.txt", "text/plain"),
    "java": ("from-java.txt", "text/plain"),
}


@pytest.fixture(scope="module")
def gateway(servers: ServerFactory) -> ServerThread:
    require_languages(*LANGUAGES)
    # bash keeps one warm kernel (--language-pool); the others start on demand.
    return servers("docker", token=TOKEN, pool_size=1, max_sessions=16, language_pool="bash=1")


@pytest.fixture(scope="module")
def http(gateway: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=gateway.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
    ) as client:
        yield client


@pytest.fixture(scope="module", params=LANGUAGES)
def language(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def session(http: httpx.Client, language: str) -> Iterator[str]:
    """One session per language, shared by that language's tests, in order."""
    response = http.post("/sessions", json={"language": language})
    assert response.status_code == 201, response.text
    assert response.json()["language"] == language
    sid = str(response.json()["id"])
    yield sid
    http.delete(f"/sessions/{sid}")


def text_of(stream: Stream) -> str:
    """What the cell showed as text: stdout, results' and displays' text/plain."""
    parts = [stream.stdout]
    for data in stream.named("result") + stream.named("display"):
        parts.append(str(data["data"].get("text/plain", "")))
    return "\n".join(parts)


# -- the HTTP API --------------------------------------------------------------------------------


def test_languages_are_listed_with_versions(http: httpx.Client) -> None:
    answer = http.get("/languages").json()
    assert answer["default"] == "python"
    by_name = {lang["name"]: lang for lang in answer["languages"]}
    assert list(by_name)[0] == "python"
    assert set(LANGUAGES) <= set(by_name)
    for name in ("python", *LANGUAGES):
        assert by_name[name]["version"][0].isdigit(), by_name[name]
    assert by_name["javascript"]["interrupt_mode"] == "message"
    assert by_name["r"]["interrupt_mode"] == "signal"
    assert by_name["r"]["image"].endswith("-r:latest")
    health = http.get("/health").json()
    assert health["languages"][0] == "python" and set(LANGUAGES) <= set(health["languages"])


def test_a_language_pool_keeps_its_warm_kernels(http: httpx.Client) -> None:
    deadline = time.monotonic() + 120
    while True:
        pools = {lang["name"]: lang["pool"] for lang in http.get("/languages").json()["languages"]}
        if pools["bash"]["warm"] == 1:
            break
        assert time.monotonic() < deadline, pools
        time.sleep(0.5)
    assert pools["bash"]["target"] == 1
    assert pools["r"] == {"warm": 0, "starting": 0, "target": 0}  # on demand


def test_unknown_languages_are_refused_naming_the_available_ones(http: httpx.Client) -> None:
    for path, body in (
        ("/sessions", {"language": "cobol"}),
        ("/execute", {"code": "1", "language": "cobol"}),
    ):
        response = http.post(path, json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "unknown_language"
        assert "'cobol'" in error["message"]
        assert "python" in error["message"] and "r" in error["message"]
    response = http.post("/sessions", json={"language": 7})
    assert response.status_code == 422
    assert "'language'" in response.json()["error"]["message"]


def test_state_persists_across_cells(http: httpx.Client, session: str, language: str) -> None:
    case = CASES[language]
    first = execute(http, session, case.assign)
    assert first.done["status"] == "ok", first.events
    second = execute(http, session, case.read)
    assert second.done["status"] == "ok", second.events
    assert "42" in text_of(second), second.events
    info = http.get(f"/sessions/{session}").json()
    assert info["language"] == language


def test_stdout_is_streamed_live(http: httpx.Client, session: str, language: str) -> None:
    stream = execute(http, session, CASES[language].live)
    assert stream.done["status"] == "ok", stream.events
    lines = [(d["text"], t) for n, d, t in stream.events if n == "stdout"]
    first = next(t for text, t in lines if "first" in text)
    second = next(t for text, t in lines if "second" in text)
    assert second - first > 2.0, "the first line arrived only with the second"


def test_an_error_is_an_error_event_with_the_languages_name(
    http: httpx.Client, session: str, language: str
) -> None:
    stream = execute(http, session, CASES[language].error)
    assert stream.done["status"] == "error", stream.events
    errors = stream.named("error")
    # JJava names the wrapper (RuntimeException) and puts the exception's class in evalue.
    assert errors, stream.events
    assert CASES[language].error_name in f"{errors[0]['ename']} {errors[0]['evalue']}", errors
    if language != "bash":  # bash_kernel reports the exit status, with no traceback
        assert errors[0]["traceback"], errors
        assert "boom" in errors[0]["evalue"] + "".join(errors[0]["traceback"])


def test_rich_display(http: httpx.Client, session: str, language: str) -> None:
    case = CASES[language]
    if case.display is None:
        pytest.skip(f"{language} has no rich display of its own")
    stream = execute(http, session, case.display)
    assert stream.done["status"] == "ok", stream.events
    shown = [d["data"] for d in stream.named("display") + stream.named("result")]
    found = [data[case.display_mime] for data in shown if case.display_mime in data]
    assert found, shown
    if case.display_mime == "image/png":
        assert base64.b64decode(found[0]).startswith(PNG_MAGIC)


def test_a_runaway_loop_is_stopped_by_its_timeout_and_the_session_lives_on(
    http: httpx.Client, session: str, language: str
) -> None:
    case = CASES[language]
    started = time.monotonic()
    stream = execute(http, session, case.loop, timeout=3)
    assert time.monotonic() - started < 15
    done = stream.done
    assert done["status"] == "timeout", stream.events
    assert not done["restarted"], "the interrupt did not stop the loop: the kernel was replaced"
    assert stream.named("error"), stream.events
    after = execute(http, session, case.read)
    assert after.done["status"] == "ok" and "42" in text_of(after), after.events


def test_a_file_the_code_writes_arrives_as_a_file_event(
    http: httpx.Client, session: str, language: str
) -> None:
    name, mime = FILES[language]
    stream = execute(http, session, CASES[language].write_file)
    assert stream.done["status"] == "ok", stream.events
    files = {f["path"]: f for f in stream.named("file")}
    assert name in files, stream.events
    assert files[name]["mime"] == mime
    body = http.get(f"/sessions/{session}/files/{name}").content
    if mime == "image/png":
        assert body.startswith(PNG_MAGIC)
    else:
        assert body.startswith(b"hello from")


def test_restart_gives_a_fresh_kernel_of_the_same_language(
    http: httpx.Client, session: str, language: str
) -> None:
    response = http.post(f"/sessions/{session}/restart")
    assert response.status_code == 200, response.text
    assert response.json()["language"] == language
    stream = execute(http, session, CASES[language].read)
    # The variable is gone: an error, or (bash) an empty expansion giving 1.
    assert "42" not in text_of(stream), stream.events
    stream = execute(http, session, CASES[language].assign)
    assert stream.done["status"] == "ok"


def test_stateless_execute_takes_a_language(http: httpx.Client, language: str) -> None:
    case = CASES[language]
    code = f"{case.assign}\n{case.read}"
    with http.stream("POST", "/execute", json={"code": code, "language": language}) as response:
        assert response.status_code == 200, response.read()
        events = list(parse_sse(response.iter_bytes()))
    stream = Stream([(n, d, 0.0) for n, d in events])
    assert stream.done["status"] == "ok", events
    assert "42" in text_of(stream), events


def test_a_kernel_behind_the_bridge_has_pythons_hardening(http: httpx.Client) -> None:
    """R, whose kernel listens on the container's loopback behind the bridge: the same
    user, no capabilities, no network but the loopback, read-only root."""
    response = http.post("/sessions", json={"language": "r"})
    sid = response.json()["id"]
    try:
        code = (
            'cat(system("id -u; grep CapEff /proc/self/status; ls /sys/class/net; '
            'touch /usr/evil 2>&1", intern = TRUE), sep = "\n")'
        )
        out = execute(http, sid, code).stdout.splitlines()
        assert out[0] == "1000", out
        assert out[1] == "CapEff:\t0000000000000000", out
        assert out[2] == "lo" and "Read-only file system" in out[3], out
        reach = execute(
            http,
            sid,
            'tryCatch(readLines(url("http://1.1.1.1/")), '
            'error = function(e) cat("refused:", conditionMessage(e)))',
        )
        assert "refused:" in reach.stdout, reach.events
    finally:
        http.delete(f"/sessions/{sid}")


def test_a_non_python_kernel_has_pythons_hardening(http: httpx.Client) -> None:
    """Bash, where the checks are easy to write: same user, no capabilities, no network,
    read-only root."""
    response = http.post("/sessions", json={"language": "bash"})
    sid = response.json()["id"]
    try:
        stream = execute(
            http,
            sid,
            "id -u; grep CapEff /proc/self/status; ls /sys/class/net; "
            "(exec 3<>/dev/tcp/1.1.1.1/53) 2>&1 | head -1; "
            "touch /usr/evil 2>&1 | head -1; true",
        )
        out = stream.stdout
        assert out.splitlines()[0] == "1000", out
        assert "CapEff:\t0000000000000000" in out
        assert out.split("\n")[2] == "lo", out  # the loopback and nothing else
        assert "Network is unreachable" in out
        assert "Read-only file system" in out
    finally:
        http.delete(f"/sessions/{sid}")


# -- other people's clients ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def through_jupyter_server(
    gateway: ServerThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayClient]:
    root = tmp_path_factory.mktemp("jupyter-languages")
    with jupyter_process("jupyter_server", gateway.url, TOKEN, root) as url:
        yield gateway_client_for(url, request_timeout=120)


def test_jupyter_server_lists_a_kernelspec_per_language(
    through_jupyter_server: GatewayClient,
) -> None:
    specs = httpx.get(f"{through_jupyter_server.url}/api/kernelspecs", timeout=60).json()
    names = set(specs["kernelspecs"])
    assert {"python3", *LANGUAGES} <= names, names
    assert specs["kernelspecs"]["r"]["spec"]["language"] == "r"


def test_each_language_through_jupyter_servers_gateway_client(
    through_jupyter_server: GatewayClient, language: str
) -> None:
    case = CASES[language]

    async def scenario() -> None:
        km = GatewayKernelManager()
        await km.start_kernel(kernel_name=language)

        async def alive() -> bool:
            # jupyter_client's wait_for_ready asks is_alive when kernel_info takes over a
            # second (a JVM under load), and GatewayKernelManager, having no provisioner,
            # fails an assertion there; the kernel is the gateway's, and alive once started.
            return True

        km._async_is_alive = alive  # type: ignore[method-assign]
        kc = km.client()
        await kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=120)
            reply = await run_cell(kc, case.assign)
            assert reply["content"]["status"] == "ok", reply
            outputs = Outputs()
            reply = await run_cell(kc, case.read, outputs)
            assert reply["content"]["status"] == "ok", reply
            texts = [m["text"] for m in outputs.of("stream")] + [
                m["data"].get("text/plain", "")
                for m in outputs.of("execute_result") + outputs.of("display_data")
            ]
            assert any("42" in t for t in texts), outputs.messages
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

    asyncio.run(scenario())


async def _mcp_call(gateway: ServerThread, arguments: dict[str, Any]) -> types.CallToolResult:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    transport = streamable_http_client(f"{gateway.url}/mcp", http_client=http)
    async with http, Client(transport) as client:
        return await client.call_tool("run_python", arguments)


def test_each_language_through_mcp(gateway: ServerThread, language: str) -> None:
    case = CASES[language]
    result = asyncio.run(
        _mcp_call(gateway, {"code": f"{case.assign}\n{case.read}", "language": language})
    )
    text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    assert not result.is_error, text
    assert "42" in text, text


def test_mcp_lists_the_languages_and_refuses_an_unknown_one(gateway: ServerThread) -> None:
    async def scenario() -> tuple[list[types.Tool], types.CallToolResult]:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
        transport = streamable_http_client(f"{gateway.url}/mcp", http_client=http)
        async with http, Client(transport) as client:
            tools = (await client.list_tools()).tools
            return tools, await client.call_tool("run_python", {"code": "1", "language": "cobol"})

    tools, refused = asyncio.run(scenario())
    run = next(t for t in tools if t.name == "run_python")
    assert set(run.input_schema["properties"]["language"]["enum"]) >= {"python", *LANGUAGES}
    assert run.description is not None
    assert all(name in run.description for name in LANGUAGES)
    assert refused.is_error
    text = "".join(c.text for c in refused.content if isinstance(c, types.TextContent))
    assert "'cobol'" in text and "javascript" in text


def test_an_operators_image_adds_a_language(servers: ServerFactory) -> None:
    """`--language-images`: a kernelspec in an image of one's own is a language, read at
    startup without running the image; naming a missing image stops the gateway."""
    import docker

    require_languages("bash")
    tag = "kg-test-operator-language:latest"
    dockerfile = (
        f"FROM {family_image(IMAGE, 'bash')}\n"
        "USER root\n"
        "RUN mkdir -p /opt/kernel/kernelspecs/shell"
        ' && sed \'s/"Bash"/"Shell (ours)"/\' /opt/kernel/kernelspecs/bash/kernel.json'
        " > /opt/kernel/kernelspecs/shell/kernel.json"
        " && echo 9.9.9 > /opt/kernel/kernelspecs/shell/version\n"
        "USER sandbox\n"
    )
    client = docker.from_env()
    try:
        client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
        gateway = servers("docker", pool_size=0, languages="python,shell", language_images=tag)
        with httpx.Client(base_url=gateway.url, timeout=120) as http:
            languages = {lang["name"]: lang for lang in http.get("/languages").json()["languages"]}
            assert list(languages) == ["python", "shell"]
            assert languages["shell"]["version"] == "9.9.9"
            assert languages["shell"]["display_name"] == "Shell (ours)"
            assert languages["shell"]["image"] == tag
            sid = http.post("/sessions", json={"language": "shell"}).json()["id"]
            assert execute(http, sid, "echo $((6 * 7))").stdout == "42\n"
            refused = http.post("/sessions", json={"language": "bash"})
            assert refused.status_code == 400  # not asked for in --languages
    finally:
        client.images.remove(tag, force=True)
        client.close()


DEATHS = {
    "javascript": "Deno.exit(3)",
    "typescript": "Deno.exit(3)",
    "r": "tools::pskill(Sys.getpid(), tools::SIGKILL)",
    "bash": "kill -9 $PPID",  # bash_kernel's own process: the kernel dies
    "java": "System.exit(3);",
}


def test_a_kernel_that_dies_is_reported_and_the_session_recovers(
    http: httpx.Client, language: str
) -> None:
    response = http.post("/sessions", json={"language": language})
    sid = response.json()["id"]
    try:
        assert execute(http, sid, CASES[language].assign).done["status"] == "ok"
        died = execute(http, sid, DEATHS[language], timeout=30)
        assert died.done["status"] == "died", died.events
        assert died.named("error")[-1]["ename"] == "KernelDied", died.events
        after = execute(http, sid, CASES[language].read)
        assert after.done["restarted"] is True  # this cell runs on the replacement kernel
        assert "42" not in text_of(after)  # a fresh kernel: the variable is gone
        info = http.get(f"/sessions/{sid}").json()
        assert info["language"] == language and info["restarts"] == 1
    finally:
        http.delete(f"/sessions/{sid}")


def test_the_client_and_the_command_line_take_a_language(gateway: ServerThread) -> None:
    from kernel_gateway.client import Client, UnknownLanguageError

    with Client(gateway.url, token=TOKEN) as client:
        names = [lang["name"] for lang in client.languages()]
        assert names[0] == "python" and set(LANGUAGES) <= set(names)
        with client.session(language="r") as session:
            assert session.info()["language"] == "r"
            assert session.run("cat(6 * 7)").stdout == "42"
        assert client.run("echo $((6 * 7))", language="bash").stdout == "42\n"
        with pytest.raises(UnknownLanguageError, match="'cobol'"):
            client.create_session("cobol")
    command = [sys.executable, "-m", "kernel_gateway", "run", "--url", gateway.url]
    result = subprocess.run(
        [*command, "--token", TOKEN, "--language", "typescript", "console.log(6 * 7)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "42\n"
