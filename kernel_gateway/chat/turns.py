"""One chat turn: ask the model, run the code it writes, give it the output, until it answers.

    turn ─▶ ask ─▶ text … ─▶ no tool call ─────────────────────────▶ end answered
              ▲                 │ tool calls
              │                 ▼
              └─── output ◀── cell (the session's own queue) ◀─ each call, in order

Each step is one model call (`Model.ask`: its text streamed as `text` events) and the
cells its tool calls ask for, each run in the session like any cell (the same queue,
limits and network policy) and followed to its `done`, its events copied into the turn's
log. A turn ends with one `end` event, whatever happens:

    answered      the model answered without a tool call
    step_limit    `--chat-max-steps` cells ran (calls beyond it are answered "not run")
    token_limit   the turn's calls used `--chat-max-tokens`
    call_limit    the key's model calls for the hour (`--chat-calls-per-hour`) ran out
    interrupted   stopped (`POST .../chat/stop`, `.../interrupt`), or the gateway stopped
    model_error   the model endpoint failed (`error.type`: `model.py`'s)
    failed        the session ended or failed under it

The conversation keeps a consistent history whatever ends the turn: every tool call the
model made gets its answer (a call that never ran is answered "not run"), so the next turn
can be sent as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from kernel_gateway.chat import context
from kernel_gateway.chat.limits import CallBudget
from kernel_gateway.chat.model import Answer, Model, ModelError, ToolCall
from kernel_gateway.errors import GatewayError, ShuttingDown
from kernel_gateway.render import Rendered
from kernel_gateway.sessions.conversation import CellSummary, Turn, turn_event
from kernel_gateway.sessions.execution import Execution
from kernel_gateway.sessions.follow import Disconnect, follow
from kernel_gateway.sessions.session import Session
from kernel_gateway.types import TurnStatus

logger = logging.getLogger(__name__)

DONE_WAIT = 10.0
"""Seconds a stopped turn waits for its interrupted cell's `done`."""


@dataclass(frozen=True)
class TurnLimits:
    max_steps: int
    max_tokens: int
    vision: bool


class TurnEnded(Exception):
    """The turn ends here, with `status` (and an error for the `end` event, if any)."""

    def __init__(self, status: TurnStatus, error: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.error = error


class TurnRunner:
    def __init__(
        self,
        session: Session,
        turn: Turn,
        model: Model,
        limits: TurnLimits,
        budget: CallBudget,
        caller: str,
        key_name: str,
    ) -> None:
        self.session = session
        self.turn = turn
        self.model = model
        self.limits = limits
        self.budget = budget
        self.caller = caller
        """Whose model calls these are (a key's id, or `admin`)."""
        self.key_name = key_name
        """The key's name, for metrics (never its secret)."""
        self.metrics = session.metrics
        self.conversation = session.conversation
        self.cells = 0
        self.tokens = 0
        self._answer_began = False

    def emit(self, name: str, data: dict[str, Any]) -> None:
        self.turn.add(turn_event(name, data, self.session.log.next_event_id()))

    async def run(self, user_message: dict[str, Any]) -> None:
        """Run the turn to its `end` (never raises; a cancellation is a stop)."""
        summary = self.turn.summary
        self.emit(
            "turn", {"turn": summary.turn, "message": summary.message, "files": summary.files}
        )
        self.conversation.messages.append(user_message)
        self.conversation.save()
        status: TurnStatus = "answered"
        error: dict[str, str] | None = None
        try:
            await self._steps()
        except TurnEnded as ended:
            status, error = ended.status, ended.error
        except asyncio.CancelledError:
            status = self.turn.stop_reason or "interrupted"
        except ModelError as exc:
            status, error = "model_error", {"type": exc.type, "message": exc.message}
        except ShuttingDown:  # the gateway stops: its successor has the conversation
            status = "interrupted"
        except GatewayError as exc:
            status, error = "failed", {"type": exc.error_type, "message": exc.message}
        except Exception as exc:  # a bug: the turn ends, said, and the session lives on
            logger.exception("session %s: chat turn %d failed", self.session.id, summary.turn)
            status = "failed"
            error = {"type": "internal_error", "message": f"{type(exc).__name__}: {exc}"}
        finally:
            self._end(status, error)

    def settle(self, task: asyncio.Task[None]) -> None:
        """The task is done: a turn cancelled before it ever ran ends here (`run` never
        began, so its `finally` did not either)."""
        if not self.turn.finished:
            self._end(self.turn.stop_reason or "interrupted", None)

    def _end(self, status: TurnStatus, error: dict[str, str] | None) -> None:
        """The one end of a turn: its `end` event, its summary, its conversation written."""
        summary = self.turn.summary
        self.conversation.answer_pending_calls()
        for cell in summary.cells:
            if cell.status == "running":
                cell.status = "interrupted"
        summary.status = status
        summary.tokens = self.tokens
        end: dict[str, Any] = {
            "turn": summary.turn,
            "status": status,
            "text": summary.text,
            "cells": self.cells,
            "tokens": self.tokens,
        }
        if error is not None:
            end["error"] = error
        self.emit("end", end)
        self.metrics.chat_turns.labels(status, self.key_name).inc()
        self.turn.finish()
        self.conversation.save()
        self.session.touch()
        logger.info(
            "session %s: chat turn %d ended %s (%d cells, %d tokens)",
            self.session.id,
            summary.turn,
            status,
            self.cells,
            self.tokens,
        )

    async def _steps(self) -> None:
        tools = [context.tool(self.session.language)]
        system = context.system_message(self.session.language, self.limits.vision)
        calls = 0
        while True:
            calls += 1
            if calls > self.limits.max_steps + 2:  # refused calls count too
                raise TurnEnded("step_limit")
            wait = self.budget.take(self.caller)
            if wait is not None:
                raise TurnEnded(
                    "call_limit",
                    {
                        "type": "call_limit",
                        "message": f"the key's model calls for the hour are used up; more in "
                        f"{wait:.0f} s",
                    },
                )
            messages = [system, *self.conversation.messages]
            self._answer_began = False
            try:
                answer = await self.model.ask(messages, tools, self._text)
            except ModelError as exc:
                self.metrics.chat_model_calls.labels(exc.type, self.key_name).inc()
                raise
            self.metrics.chat_model_calls.labels("ok", self.key_name).inc()
            used = answer.tokens or _estimate(messages, answer)
            self.tokens += used
            self.metrics.chat_tokens.labels(self.key_name).inc(used)
            self.conversation.messages.append(answer.message())
            self.conversation.save()  # its calls unanswered: a successor answers them
            if not answer.tool_calls:
                return
            shown: list[Rendered] = []
            for call in answer.tool_calls:
                rendered = await self._call(call)
                if rendered is not None:
                    shown.append(rendered)
            if self.limits.vision:
                images = context.images_message(shown)
                if images is not None:
                    self.conversation.messages.append(images)
            self.conversation.save()
            if self.cells >= self.limits.max_steps:
                raise TurnEnded("step_limit")
            if self.tokens >= self.limits.max_tokens:
                raise TurnEnded("token_limit")

    async def _text(self, text: str) -> None:
        summary = self.turn.summary
        if not self._answer_began and summary.text:  # the model's answers, a paragraph each
            summary.text += "\n\n"
        self._answer_began = True
        summary.text += text
        self.emit("text", {"text": text})

    async def _call(self, call: ToolCall) -> Rendered | None:
        """Run one tool call as a cell of the session (or answer why it was not run)."""
        messages = self.conversation.messages
        expected = context.tool_name(self.session.language)
        if call.name != expected:
            why = f"there is no tool {call.name!r}; use {expected}"
            messages.append(context.tool_refusal(call.id, why))
            return None
        code = _code_of(call.arguments)
        if code is None:
            why = 'the arguments must be a JSON object with a "code" string'
            messages.append(context.tool_refusal(call.id, why))
            return None
        if self.cells >= self.limits.max_steps:
            why = f"the turn's limit of {self.limits.max_steps} cells is reached"
            messages.append(context.tool_refusal(call.id, why))
            return None
        self.cells += 1
        execution = self.session.submit(code, None)
        self.conversation.model_cells.add(execution.number)
        # No await since `submit`: this event's id comes before any of the cell's own.
        self.emit("cell", {"cell": self.cells, "execution_id": execution.id, "code": code})
        summary = CellSummary(execution.id, code)
        self.turn.summary.cells.append(summary)
        self.conversation.save()
        try:
            await self._follow(execution)
        finally:
            summary.status = execution.status if execution.finished else "interrupted"
        rendered = context.rendered_cell(execution)
        messages.append(context.tool_result(call.id, rendered))
        return rendered

    async def _follow(self, execution: Execution) -> None:
        """Copy the cell's events into the turn up to its `done`. Stopped meanwhile, the
        cell is interrupted (leaving `follow` does it) and its last events, `done` among
        them, still come into the turn: each cell in a turn's stream ends with its `done`."""
        last: int | None = None
        try:
            async with follow(
                self.session, execution, None, Disconnect.INTERRUPT_UNLESS_DRAINING
            ) as records:
                async for record in records:
                    self.turn.add(record)
                    last = record.id
        except asyncio.CancelledError:
            if not self.session.draining:
                with contextlib.suppress(TimeoutError, GatewayError):
                    async with asyncio.timeout(DONE_WAIT):
                        async for record in execution.records(after=last):
                            self.turn.add(record)
            raise


def _code_of(arguments: str) -> str | None:
    try:
        parsed = json.loads(arguments) if arguments.strip() else None
    except ValueError:
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("code"), str) and parsed["code"].strip():
        return str(parsed["code"])
    return None


def _estimate(messages: list[dict[str, Any]], answer: Answer) -> int:
    """Tokens of a call whose API did not say: about four characters a token."""
    sent = sum(len(json.dumps(m.get("content") or "")) for m in messages)
    got = len(answer.text) + sum(len(c.arguments) for c in answer.tool_calls)
    return (sent + got) // 4 + 1
