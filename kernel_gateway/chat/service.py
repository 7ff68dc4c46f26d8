"""The chat's long-lived part: the model, the call budget, the turns running, the files.

Made by the app's lifespan. `open` takes up the conversations an earlier gateway saved
(those of sessions that came back; the others' files are removed); `ask` checks a new
message, begins its turn and runs it in the background (it runs to its `end` whether or
not anyone reads it); `close` stops the turns running (they end `interrupted`) and writes
every conversation.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from kernel_gateway.chat import context
from kernel_gateway.chat.limits import CallBudget
from kernel_gateway.chat.model import Model
from kernel_gateway.chat.turns import TurnLimits, TurnRunner
from kernel_gateway.errors import (
    BadRequest,
    ChatNotConfigured,
    NotFound,
    QuotaExceeded,
)
from kernel_gateway.sessions.conversation import ConversationStore, SavedConversation, Turn
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.settings.values import read_token_file
from kernel_gateway.tasks import TaskSet

logger = logging.getLogger(__name__)


class Chat:
    def __init__(self, settings: Settings, folder: Path | None) -> None:
        """`folder`: where conversations are written (`--persist-sessions`), else None."""
        self.settings = settings
        self.model: Model | None = None
        if settings.llm_url is not None and settings.llm_model is not None:
            key = read_token_file(settings.llm_key_file) if settings.llm_key_file else None
            self.model = Model(settings.llm_url, settings.llm_model, key, settings.llm_timeout)
        self.limits = TurnLimits(
            settings.chat_max_steps, settings.chat_max_tokens, settings.llm_vision
        )
        self.budget = CallBudget(settings.chat_calls_per_hour)
        self.store = ConversationStore(folder) if folder is not None else None
        self._turns = TaskSet()

    def info(self) -> dict[str, Any]:
        """`GET /chat`: whether there is a model, and the limits of a turn."""
        return {
            "enabled": self.model is not None,
            "model": self.model.name if self.model is not None else None,
            "max_steps": self.limits.max_steps,
            "max_tokens": self.limits.max_tokens,
            "vision": self.limits.vision,
        }

    async def open(self, sessions: list[Session]) -> None:
        """Take up saved conversations of the sessions there are; remove the others."""
        if self.store is None:
            return
        await asyncio.to_thread(self.store.open)
        saved: list[SavedConversation] = await asyncio.to_thread(self.store.load)
        by_id = {s.id: s for s in sessions}
        for record in saved:
            session = by_id.get(record.id)
            if session is None:
                self.store.delete(record.id)
                continue
            session.conversation.take_up(record)
            session.conversation.store = self.store
        await self.store.flush()

    async def close(self) -> None:
        await self._turns.close()  # each ends `interrupted`, and is written
        if self.store is not None:
            await self.store.close()
        if self.model is not None:
            await self.model.close()

    async def ask(
        self,
        session: Session,
        message: str,
        files: list[str],
        caller: str,
        key_name: str | None = None,
    ) -> Turn:
        """Begin a turn of `session`'s chat and run it in the background. `caller`: whose
        model calls these are (a key's id, or `admin`); `key_name`: its name, for metrics."""
        if self.model is None:
            raise ChatNotConfigured(
                "this gateway has no model to ask: start it with --llm-url and --llm-model "
                "(an OpenAI-compatible API with tool calling; see docs/chat.md)"
            )
        wait = self.budget.wait(caller)
        if wait is not None:
            raise QuotaExceeded(
                f"the model calls of this key for the hour ({self.budget.per_hour}, "
                "--chat-calls-per-hour) are used up",
                retry_after=wait,
            )
        conversation = session.conversation
        conversation.refuse_if_running()
        heads = [await self._head(session, path) for path in files]
        told = conversation.told_up_to
        person = [
            e
            for e in session.executions()
            if e.number > told and e.finished and e.number not in conversation.model_cells
        ]
        conversation.told_up_to = session.log.submitted
        conversation.model_cells = {n for n in conversation.model_cells if n > told}
        user = await asyncio.to_thread(context.user_message, message, heads, person)
        if session.hibernated:  # only now: a refused ask wakes nothing
            await session.resume()
        conversation.store = self.store
        turn = conversation.begin(message, files)
        runner = TurnRunner(
            session, turn, self.model, self.limits, self.budget, caller, key_name or caller
        )
        turn.task = self._turns.spawn(
            runner.run(user), name=f"chat {session.id} turn {turn.number}"
        )
        turn.task.add_done_callback(runner.settle)
        return turn

    async def _head(self, session: Session, path: str) -> tuple[str, bytes | None, int]:
        """An attached file's first bytes and size; 404 when it is not there."""
        try:
            fd, info = await session.files.open_read(path)
        except (NotFound, BadRequest) as exc:
            raise NotFound(f"files: {exc.message}") from None
        try:
            head = await asyncio.to_thread(os.pread, fd, context.FILE_HEAD_BYTES, 0)
        except OSError:
            return path, None, info.st_size
        finally:
            os.close(fd)
        return path, head, info.st_size
