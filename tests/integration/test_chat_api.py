"""The chat through the HTTP API, on real kernels in Docker, against a scripted
OpenAI-compatible model server that streams as the real API streams: a chart of an uploaded
CSV, a second turn that uses the first's variable, a failing cell retried, the stream read
again by event id, the conversation's history, and what is refused."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kernel_gateway.client import AsyncClient, AsyncSession, Client, Session
from tests.support.api import parse_sse
from tests.support.scripted_model import Reply, ScriptedModel, last_tool_output, last_user_text
from tests.support.server import ServerFactory, ServerThread

TOKEN = "gateway-token-" + "7" * 24
MODEL_KEY = "sk-model-key-" + "3" * 24
CSV = "region,month,sales\nnorth,2026-10,120\nsouth,2026-10,95\nwest,2026-10,143\n"
PLOT = (
    "import pandas as pd, matplotlib.pyplot as plt\n"
    "df = pd.read_csv('sales.csv')\n"
    "df.plot.bar(x='region', y='sales')\n"
    "plt.show()\n"
    "print(len(df), 'rows')\n"
)


HUNT = f"""
import os, subprocess
found = []
for name in (n[::-1] for n in ("{TOKEN[::-1]}", "{MODEL_KEY[::-1]}")):
    if any(name in v for v in os.environ.values()):
        found.append("environ")
    where = subprocess.run(
        ["grep", "-rls", "--", name, "/proc/self/environ", "/proc/1/environ", "/proc/1/cmdline",
         "/home", "/tmp", "/etc", "/opt", "/conn", "/run", "/var"],
        capture_output=True, text=True,
    ).stdout.split()
    found += where
print("found:", found)
"""


def script(request: dict[str, Any]) -> Reply:
    """The model's answers, by what the conversation holds."""
    asked, output = last_user_text(request), last_tool_output(request)
    if "chart" in asked:
        if output is None:
            return Reply(text="I'll read **sales.csv** and plot it.", code=[PLOT])
        rows = re.search(r"(\d+) rows", output)
        return Reply(text=f"Here is the chart; the file has {rows[1] if rows else '?'} rows.")
    if "total" in asked:
        if output is None:
            return Reply(code=["print(df['sales'].sum())"])
        return Reply(text=f"Total sales: {output.strip()}.")
    if "secrets" in asked:
        if output is None:
            return Reply(code=[HUNT])
        return Reply(text=output)
    if "retry" in asked:
        if output is None:
            return Reply(code=["1 / 0"])
        if "ZeroDivisionError" in output:
            return Reply(text="That divided by zero; again.", code=["print('second try')"])
        return Reply(text="Done.")
    return Reply(text="?")


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(script) as scripted:
        yield scripted


@pytest.fixture(scope="module")
def server(
    servers: ServerFactory, model: ScriptedModel, tmp_path_factory: pytest.TempPathFactory
) -> ServerThread:
    key_file = tmp_path_factory.mktemp("llm") / "key"
    key_file.write_text(MODEL_KEY + "\n")
    return servers(
        "docker",
        pool_size=1,
        token=TOKEN,
        llm_url=model.url,
        llm_model="scripted",
        llm_key_file=key_file,
    )


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, timeout=60, headers=headers) as http:
        yield http


@pytest.fixture(scope="module")
def session_id(client: httpx.Client) -> str:
    answer = client.post("/sessions")
    assert answer.status_code == 201
    return str(answer.json()["id"])


def ask(client: httpx.Client, session_id: str, body: dict[str, Any]) -> list[tuple[str, Any]]:
    with client.stream("POST", f"/sessions/{session_id}/chat", json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["turn-id"].isdigit()
        return list(parse_sse(response.iter_bytes()))


def test_a_chart_of_an_uploaded_csv_in_one_stream(
    client: httpx.Client, session_id: str, model: ScriptedModel
) -> None:
    assert client.put(f"/sessions/{session_id}/files/sales.csv", content=CSV).status_code in (
        200,
        201,
    )
    assert client.get("/chat").json()["enabled"] is True
    events = ask(
        client, session_id, {"message": "a chart of sales by region", "files": ["sales.csv"]}
    )
    names = [name for name, _ in events]
    assert names[0] == "turn" and names[-1] == "end"
    assert names.index("cell") < names.index("display") < names.index("done") < len(names) - 1
    text = "".join(data["text"] for name, data in events if name == "text")
    assert text.startswith("I'll read **sales.csv** and plot it.")
    png = next(data["data"]["image/png"] for name, data in events if name == "display")
    assert base64.b64decode(png).startswith(b"\x89PNG")
    stdout = "".join(data["text"] for name, data in events if name == "stdout")
    assert stdout == "3 rows\n"
    end = events[-1][1]
    assert end["status"] == "answered" and end["cells"] == 1
    assert end["text"].endswith("the file has 3 rows.")
    # The model was told the file's columns and first rows; the key went nowhere.
    told = model.requests[0]["messages"][-1]["content"]
    assert "columns: region, month, sales" in told and "north,2026-10,120" in told
    assert set(model.authorizations) == {f"Bearer {MODEL_KEY}"}


def test_a_second_turn_uses_the_first_turns_variable(client: httpx.Client, session_id: str) -> None:
    events = ask(client, session_id, {"message": "the total?"})
    assert "".join(d["text"] for n, d in events if n == "stdout") == "358\n"
    assert events[-1][1]["text"] == "Total sales: 358."
    # The person's cell sees the model's variable too.
    with client.stream(
        "POST", f"/sessions/{session_id}/execute", json={"code": "print(df.shape)"}
    ) as response:
        out = "".join(d["text"] for n, d in parse_sse(response.iter_bytes()) if n == "stdout")
    assert out == "(3, 3)\n"


def test_a_failing_cell_is_retried_and_its_output_arrives(
    client: httpx.Client, session_id: str
) -> None:
    events = ask(client, session_id, {"message": "retry please"})
    cells = [d for n, d in events if n == "cell"]
    assert [c["code"] for c in cells] == ["1 / 0", "print('second try')"]
    assert next(d for n, d in events if n == "error")["ename"] == "ZeroDivisionError"
    assert [d["status"] for n, d in events if n == "done"] == ["error", "ok"]
    assert "".join(d["text"] for n, d in events if n == "stdout") == "second try\n"
    assert events[-1][1]["status"] == "answered"


def test_the_turn_is_read_again_and_the_history_kept(client: httpx.Client, session_id: str) -> None:
    with client.stream("GET", f"/sessions/{session_id}/chat/events") as response:
        whole = list(parse_sse(response.iter_bytes()))
    assert whole[0][0] == "turn" and whole[-1][0] == "end"
    with client.stream("GET", f"/sessions/{session_id}/chat/events") as response:
        ids = [line.split(": ")[1] for line in response.iter_lines() if line.startswith("id:")]
    middle = ids[len(ids) // 2]
    with client.stream(
        "GET", f"/sessions/{session_id}/chat/events", headers={"Last-Event-ID": middle}
    ) as response:
        rest = list(parse_sse(response.iter_bytes()))
    assert rest == whole[len(ids) // 2 + 1 :]
    history = client.get(f"/sessions/{session_id}/chat").json()
    assert history["running"] is False
    assert [t["status"] for t in history["turns"]] == ["answered"] * 3
    assert history["turns"][0]["files"] == ["sales.csv"]
    assert [c["status"] for c in history["turns"][2]["cells"]] == ["error", "ok"]


def test_neither_the_token_nor_the_model_key_reach_the_kernel(
    client: httpx.Client, session_id: str
) -> None:
    events = ask(client, session_id, {"message": "find the secrets"})
    assert "".join(d["text"] for n, d in events if n == "stdout") == "found: []\n"
    assert MODEL_KEY not in client.get(f"/sessions/{session_id}/chat").text
    assert MODEL_KEY not in client.get("/chat").text


def test_the_python_client(server: ServerThread, session_id: str) -> None:
    with Client(server.url, token=TOKEN) as gateway:
        session = Session(gateway, session_id)
        pieces: list[str] = []
        reply = session.chat("the total again", on_text=pieces.append)
        assert reply.ok and reply.text == "Total sales: 358." == "".join(pieces)
        [(code, cell)] = reply.cells
        assert code == "print(df['sales'].sum())" and cell.stdout == "358\n" and cell.ok
        assert session.chat_history()["turns"][-1]["text"] == "Total sales: 358."
        assert session.stop_chat() is False

    async def run_async() -> None:
        async with AsyncClient(server.url, token=TOKEN) as agateway:
            asession = AsyncSession(agateway, session_id)
            areply = await asession.chat("the total, async")
            assert areply.status == "answered" and areply.cells[0][1].stdout == "358\n"

    asyncio.run(run_async())


def test_a_hibernated_session_resumes_for_its_chat(client: httpx.Client, session_id: str) -> None:
    turns = len(client.get(f"/sessions/{session_id}/chat").json()["turns"])
    hibernated = client.post(f"/sessions/{session_id}/hibernate")
    assert hibernated.status_code == 200 and hibernated.json()["status"] == "hibernated"
    events = ask(client, session_id, {"message": "the total after a sleep"})
    assert events[-1][1]["text"] == "Total sales: 358."
    assert len(client.get(f"/sessions/{session_id}/chat").json()["turns"]) == turns + 1


def test_what_is_refused(client: httpx.Client, session_id: str) -> None:
    assert client.post(f"/sessions/{session_id}/chat", json={"message": ""}).status_code == 422
    missing = client.post(
        f"/sessions/{session_id}/chat", json={"message": "hi", "files": ["nope.csv"]}
    )
    assert missing.status_code == 404 and "nope.csv" in missing.json()["error"]["message"]
    assert client.post("/sessions/nope/chat", json={"message": "hi"}).status_code == 404
    assert client.post(f"/sessions/{session_id}/chat/stop").json() == {"stopped": False}
    assert client.delete(f"/sessions/{session_id}/chat").status_code == 204
    assert client.get(f"/sessions/{session_id}/chat").json()["turns"] == []
    assert client.get(f"/sessions/{session_id}/chat/events").status_code == 404


def test_a_gateway_without_a_model(servers: ServerFactory) -> None:
    server = servers("local", pool_size=0)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/chat").json()["enabled"] is False
        session = http.post("/sessions").json()["id"]
        refused = http.post(f"/sessions/{session}/chat", json={"message": "hi"})
        assert refused.status_code == 501
        assert refused.json()["error"]["type"] == "chat_not_configured"
        assert "--llm-url" in refused.json()["error"]["message"]
