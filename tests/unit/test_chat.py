"""The chat's turns on fake kernels, against a scripted OpenAI-compatible model server: what
a turn streams, how each way of ending it ends it, what the conversation keeps."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel_gateway.chat.context import describe_file
from kernel_gateway.chat.service import Chat
from kernel_gateway.errors import ChatNotConfigured, Gone, QuotaExceeded, TurnRunning
from kernel_gateway.sessions.conversation import Conversation, SavedConversation
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.tenants.principal import ADMIN
from kernel_gateway.types import Record
from tests.support.fake_kernel import fake_registry
from tests.support.scripted_model import Reply, ScriptedModel, last_tool_output

Script = Any


class Model:
    """A scripted model whose script the test sets (`model.script = ...`)."""

    def __init__(self) -> None:
        self.script: Script = lambda request: Reply(text="hello")
        self.server = ScriptedModel(lambda request: self.script(request))

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.server.requests


@pytest.fixture(scope="module")
def model() -> Iterator[Model]:
    scripted = Model()
    with scripted.server:
        yield scripted


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[Registry]:
    async with fake_registry(tmp_path) as (registry, _):
        yield registry


def chat_for(
    registry: Registry, model: Model | None, folder: Path | None = None, **kw: Any
) -> Chat:
    values = {
        "backend": "local",
        "runtime_dir": registry.settings.runtime_dir,
        **({"llm_url": model.server.url, "llm_model": "scripted"} if model else {}),
        **kw,
    }
    return Chat(Settings(**values), folder)


async def turn_events(
    chat: Chat, session: Session, message: str, caller: str = "admin"
) -> list[Record]:
    turn = await chat.ask(session, message, [], caller)
    return [r async for r in turn.records()]


def names(records: list[Record]) -> list[str]:
    """Event names, each run of `text` as one."""
    out: list[str] = []
    for r in records:
        if not (r.event.name == "text" and out and out[-1] == "text"):
            out.append(r.event.name)
    return out


def end_of(records: list[Record]) -> dict[str, Any]:
    assert records[-1].event.name == "end"
    data: dict[str, Any] = records[-1].event.data
    return data


async def test_a_turn_streams_text_a_cell_its_output_and_the_answer(
    registry: Registry, model: Model
) -> None:
    def script(request: dict[str, Any]) -> Reply:
        output = last_tool_output(request)
        if output is None:
            return Reply(text="Let me **count**.", code=["print 42"])
        return Reply(text=f"The answer is {output.strip()}.")

    model.script = script
    chat = chat_for(registry, model)
    session = await registry.create_session(owner=ADMIN)
    records = await turn_events(chat, session, "what is six times seven?")
    assert names(records) == ["turn", "text", "cell", "stdout", "done", "text", "end"]
    ids = [r.id for r in records]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    cell = next(r.event.data for r in records if r.event.name == "cell")
    assert cell["code"] == "print 42" and cell["cell"] == 1
    end = end_of(records)
    assert end["status"] == "answered" and end["cells"] == 1
    assert end["text"] == "Let me **count**.\n\nThe answer is 42."
    assert end["tokens"] == 200  # as the scripted model reported them, two calls
    # The model read the system message, the tool, and the cell's output.
    first = model.requests[-2]
    assert first["messages"][0]["role"] == "system"
    assert first["tools"][0]["function"]["name"] == "run_python"
    assert first["stream"] is True
    roles = [m["role"] for m in session.conversation.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    summary = session.conversation.turns[-1]
    assert summary.status == "answered" and summary.cells[0].status == "ok"
    sample = session.metrics.registry.get_sample_value
    assert sample("kernel_gateway_chat_turns_total", {"status": "answered", "key": "admin"}) == 1
    assert sample("kernel_gateway_chat_model_calls_total", {"outcome": "ok", "key": "admin"}) == 2
    assert sample("kernel_gateway_chat_tokens_total", {"key": "admin"}) == 200
    await chat.close()


async def test_a_failing_cell_is_retried_and_a_second_turn_remembers(
    registry: Registry, model: Model
) -> None:
    def script(request: dict[str, Any]) -> Reply:
        output = last_tool_output(request)
        if output is None:
            return Reply(code=["error"])
        if "Error" in output:
            return Reply(text="That failed; again.", code=["print fixed"])
        return Reply(text="Fixed.")

    model.script = script
    chat = chat_for(registry, model)
    session = await registry.create_session(owner=ADMIN)
    records = await turn_events(chat, session, "go")
    assert [r.event.name for r in records if r.event.name in ("cell", "error", "stdout")] == [
        "cell",
        "error",
        "cell",
        "stdout",
    ]
    assert end_of(records)["status"] == "answered" and end_of(records)["cells"] == 2
    model.script = lambda request: Reply(text=f"{len(request['messages'])} messages so far")
    second = await turn_events(chat, session, "and now?")
    # system + the first turn's 6 (user, assistant, tool, assistant, tool, assistant) + user
    assert end_of(second)["text"] == "8 messages so far"
    assert [t.turn for t in session.conversation.turns] == [1, 2]
    await chat.close()


async def test_the_person_s_own_cells_are_told_to_the_model(
    registry: Registry, model: Model
) -> None:
    model.script = lambda request: Reply(text="ok")
    chat = chat_for(registry, model)
    session = await registry.create_session(owner=ADMIN)
    execution = session.submit("print from the person", None)
    async for _ in execution.records():
        pass
    await turn_events(chat, session, "what did I do?")
    told = model.requests[-1]["messages"][-1]["content"]
    assert "print from the person" in told and "from the person" in told.split("```")[-1]
    await turn_events(chat, session, "again?")
    assert "print from the person" not in model.requests[-1]["messages"][-1]["content"]
    await chat.close()


async def test_the_step_limit_ends_the_turn_and_every_call_is_answered(
    registry: Registry, model: Model
) -> None:
    model.script = lambda request: Reply(code=["print a", "print b"])
    chat = chat_for(registry, model, chat_max_steps=3)
    session = await registry.create_session(owner=ADMIN)
    records = await turn_events(chat, session, "loop")
    end = end_of(records)
    assert end["status"] == "step_limit" and end["cells"] == 3
    messages = session.conversation.messages
    calls = [c["id"] for m in messages if m["role"] == "assistant" for c in m["tool_calls"]]
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert sorted(calls) == sorted(answered) and len(calls) == 4
    assert "limit of 3 cells" in messages[-1]["content"]
    await chat.close()


async def test_tokens_and_calls_are_bounded(registry: Registry, model: Model) -> None:
    model.script = lambda request: Reply(code=["print x"], usage=40_000)
    chat = chat_for(registry, model, chat_max_tokens=50_000)
    session = await registry.create_session(owner=ADMIN)
    assert end_of(await turn_events(chat, session, "x"))["status"] == "token_limit"
    await chat.close()

    chat = chat_for(registry, model, chat_calls_per_hour=2)
    model.script = lambda request: Reply(code=["print y"], usage=10)
    end = end_of(await turn_events(chat, session, "y"))
    assert end["status"] == "call_limit" and end["error"]["type"] == "call_limit"
    with pytest.raises(QuotaExceeded) as refused:
        await chat.ask(session, "z", [], "admin")
    assert refused.value.retry_after is not None and refused.value.retry_after > 3000
    other = await turn_events(chat, session, "another key's", "key-2")  # counted per caller
    assert end_of(other)["status"] == "call_limit"
    await chat.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("reply", "error_type"),
    [
        (Reply(garbage=True), "model_malformed"),
        (Reply(status=500), "model_error"),
        (Reply(status=401), "model_error"),
        (Reply(delay=3), "model_timeout"),
    ],
)
async def test_a_failing_model_ends_the_turn_and_the_session_lives_on(
    registry: Registry, model: Model, reply: Reply, error_type: str
) -> None:
    model.script = lambda request: reply
    chat = chat_for(registry, model, llm_timeout=1)
    session = await registry.create_session(owner=ADMIN)
    end = end_of(await turn_events(chat, session, "hi"))
    assert end["status"] == "model_error" and end["error"]["type"] == error_type
    assert "Authorization" not in end["error"]["message"]
    execution = session.submit("print still here", None)
    assert [r.event.name async for r in execution.records()] == ["stdout", "done"]
    model.script = lambda request: Reply(text="back")
    assert end_of(await turn_events(chat, session, "again"))["status"] == "answered"
    await chat.close()


async def test_a_model_that_is_not_there(registry: Registry) -> None:
    settings = Settings(
        backend="local",
        runtime_dir=registry.settings.runtime_dir,
        llm_url=f"http://127.0.0.1:{closed_port()}/v1",
        llm_model="nobody",
    )
    chat = Chat(settings, None)
    session = await registry.create_session(owner=ADMIN)
    end = end_of(await turn_events(chat, session, "hi"))
    assert end["error"]["type"] == "model_unavailable"
    await chat.close()


async def test_malformed_tool_calls_are_answered_and_the_model_tries_again(
    registry: Registry, model: Model
) -> None:
    def script(request: dict[str, Any]) -> Reply:
        output = last_tool_output(request)
        if output is None:
            return Reply(raw_arguments="{not json")
        if output.startswith("Not run") and "no tool" not in output:
            return Reply(code=["print ok"], tool="run_rust")
        return Reply(text=f"read: {output}")

    model.script = script
    chat = chat_for(registry, model)
    session = await registry.create_session(owner=ADMIN)
    end = end_of(await turn_events(chat, session, "hi"))
    assert end["status"] == "answered" and end["cells"] == 0
    assert "there is no tool 'run_rust'; use run_python" in end["text"]
    await chat.close()


async def test_one_turn_at_a_time_and_stopping_it(registry: Registry, model: Model) -> None:
    model.script = lambda request: Reply(code=["sleep 30"])
    chat = chat_for(registry, model)
    session = await registry.create_session(owner=ADMIN)
    turn = await chat.ask(session, "sleep", [], "admin")
    seen: list[Record] = []
    async for record in turn.records():
        seen.append(record)
        if record.event.name == "cell":
            break
    with pytest.raises(TurnRunning):
        await chat.ask(session, "and this?", [], "admin")
    await asyncio.sleep(0.2)
    assert await session.interrupt() is True
    rest = [r async for r in turn.records(after=seen[-1].id)]
    assert [r.event.name for r in rest][-2:] == ["done", "end"]
    assert rest[-2].event.data["status"] == "interrupted"
    assert end_of(rest)["status"] == "interrupted"
    # A stop during the model's call.
    model.script = lambda request: Reply(text="slow", delay=5)
    turn = await chat.ask(session, "slow", [], "admin")
    await asyncio.sleep(0.3)
    assert session.conversation.stop() is True
    records = [r async for r in turn.records()]
    assert end_of(records)["status"] == "interrupted"
    assert session.conversation.stop() is False
    await chat.close()


async def test_a_turn_is_read_again_from_an_event_id(registry: Registry, model: Model) -> None:
    model.script = lambda request: (
        Reply(text="x" * 40, code=["print 1"])
        if last_tool_output(request) is None
        else Reply(text="done")
    )
    chat = chat_for(registry, model)
    session = await registry.create_session(owner=ADMIN)
    records = await turn_events(chat, session, "go")
    turn = session.conversation.events()
    for cut in range(len(records)):
        again = [r async for r in turn.records(after=records[cut].id)]
        assert again == records[cut + 1 :]
    await chat.close()


async def test_conversations_are_kept_for_the_next_gateway(
    registry: Registry, model: Model, tmp_path: Path
) -> None:
    folder = tmp_path / "chats"
    model.script = lambda request: Reply(text="remembered")
    chat = chat_for(registry, model, folder)
    await chat.open([])
    session = await registry.create_session(owner=ADMIN)
    gone = await registry.create_session(owner=ADMIN)
    await turn_events(chat, session, "keep this")
    await turn_events(chat, gone, "and this")
    await chat.close()
    saved = json.loads((folder / f"{session.id}.json").read_text())
    assert saved["turns"][0]["message"] == "keep this"
    assert (folder / f"{gone.id}.json").exists()

    session.conversation = Conversation(session.id)  # as a successor gateway adopts it
    chat = chat_for(registry, model, folder)
    await chat.open([session])
    later = session.conversation
    assert [t.message for t in later.turns] == ["keep this"]
    assert [m["role"] for m in later.messages] == ["user", "assistant"]
    assert not (folder / f"{gone.id}.json").exists()  # its session did not come back
    with pytest.raises(Gone, match="restarted"):
        later.events()
    assert end_of(await turn_events(chat, session, "more"))["status"] == "answered"
    assert len(model.requests[-1]["messages"]) == 4  # system, the kept turn, the new message
    await chat.close()


async def test_a_deleted_session_ends_its_turn_and_its_file(
    registry: Registry, model: Model, tmp_path: Path
) -> None:
    folder = tmp_path / "chats"
    model.script = lambda request: Reply(code=["sleep 30"])
    chat = chat_for(registry, model, folder)
    await chat.open([])
    session = await registry.create_session(owner=ADMIN)
    turn = await chat.ask(session, "sleep", [], "admin")
    async for record in turn.records():
        if record.event.name == "cell":
            break
    await registry.delete_session(session.id, ADMIN)
    records = [r async for r in turn.records()]
    assert end_of(records)["status"] == "failed"
    await chat.close()
    assert not (folder / f"{session.id}.json").exists()


async def test_no_model_no_chat(registry: Registry) -> None:
    chat = chat_for(registry, None)
    assert chat.info()["enabled"] is False
    session = await registry.create_session(owner=ADMIN)
    with pytest.raises(ChatNotConfigured):
        await chat.ask(session, "hi", [], "admin")
    await chat.close()


def test_a_table_is_described_by_its_columns() -> None:
    head = b"region,month,sales\nnorth,2026-01,120\nsouth,2026-01,95\n"
    text = describe_file("sales.csv", head, len(head))
    assert f"`sales.csv` ({len(head)} bytes" in text
    assert "columns: region, month, sales" in text and "north,2026-01,120" in text
    assert describe_file("model.bin", b"\0\1", 2).endswith("in the working directory).")
    semicolons = describe_file("t.csv", b"a;b\n1;2\n", 8)
    assert "columns: a, b" in semicolons


async def test_a_gateway_killed_during_a_model_cell_leaves_a_conversation_that_goes_on(
    registry: Registry, model: Model, tmp_path: Path
) -> None:
    folder = tmp_path / "chats"
    model.script = lambda request: Reply(code=["sleep 30", "print never"])
    chat = chat_for(registry, model, folder)
    await chat.open([])
    session = await registry.create_session(owner=ADMIN)
    turn = await chat.ask(session, "sleep", [], "admin")
    async for record in turn.records():
        if record.event.name == "cell":
            break
    assert chat.store is not None
    await chat.store.flush()
    saved = json.loads((folder / f"{session.id}.json").read_text())  # as a SIGKILL leaves it
    assert saved["messages"][-1]["tool_calls"] and saved["turns"][0]["status"] == "running"
    await chat.close()
    session.conversation = Conversation(session.id)
    session.conversation.take_up(SavedConversation.from_json(saved))
    roles = [m["role"] for m in session.conversation.messages]
    assert roles == ["user", "assistant", "tool", "tool"]  # each call answered "not run"
    assert session.conversation.turns[0].status == "interrupted"
    assert session.conversation.turns[0].cells[0].status == "interrupted"


async def test_with_vision_the_images_follow_all_the_steps_tool_messages(
    registry: Registry, model: Model
) -> None:
    png = "iVBORw0KGgo="

    def script(request: dict[str, Any]) -> Reply:
        if last_tool_output(request) is None and request["messages"][-1]["role"] == "user":
            return Reply(code=["print a", "print b"])
        return Reply(text="seen")

    model.script = script
    chat = chat_for(registry, model, llm_vision=True)
    session = await registry.create_session(owner=ADMIN)
    # A cell whose display is an image: the fake kernel has none, so add one to the render.
    end = end_of(await turn_events(chat, session, "two"))
    assert end["status"] == "answered"
    roles = [m["role"] for m in session.conversation.messages]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]
    from kernel_gateway.chat.context import images_message
    from kernel_gateway.render import Image, Rendered

    shown = [Rendered("t", [Image("image/png", png)], [], "ok")] * 2
    message = images_message(shown)
    assert message is not None and message["role"] == "user"
    assert len(message["content"]) == 3
    await chat.close()


async def test_an_empty_answer_is_a_model_error(registry: Registry, model: Model) -> None:
    model.script = lambda request: Reply(text="")
    chat = chat_for(registry, model)
    session = await registry.create_session(owner=ADMIN)
    end = end_of(await turn_events(chat, session, "hm"))
    assert end["status"] == "model_error" and end["error"]["type"] == "model_malformed"
    assert all(m["role"] != "assistant" for m in session.conversation.messages)
    await chat.close()


async def test_a_turn_stopped_before_it_ran_still_ends(registry: Registry, model: Model) -> None:
    model.script = lambda request: Reply(text="never")
    chat = chat_for(registry, model)
    session = await registry.create_session(owner=ADMIN)
    turn = await chat.ask(session, "now", [], "admin")
    assert session.conversation.stop() is True  # before its task took its first step
    records = [r async for r in turn.records()]
    assert [r.event.name for r in records] == ["end"]
    assert end_of(records)["status"] == "interrupted" and not session.conversation.running
    await chat.close()


async def test_the_person_s_cells_during_a_turn_are_told_next_time(
    registry: Registry, model: Model
) -> None:
    model.script = lambda request: (
        Reply(code=["sleep 0.5"]) if last_tool_output(request) is None else Reply(text="ok")
    )
    chat = chat_for(registry, model)
    session = await registry.create_session(owner=ADMIN)
    turn = await chat.ask(session, "wait", [], "admin")
    async for record in turn.records():
        if record.event.name == "cell":
            break
    mine = session.submit("print by hand", None)
    async for _ in turn.records():
        pass
    async for _ in mine.records():
        pass
    model.script = lambda request: Reply(text="ok")
    await turn_events(chat, session, "what did I run?")
    told = model.requests[-1]["messages"][-1]["content"]
    assert "print by hand" in told and "sleep 0.5" not in told
    await chat.close()


def test_an_odd_table_is_described_at_once() -> None:
    head = (',"a' * 21000).encode()
    assert "columns" in describe_file("odd.csv", head, len(head))
