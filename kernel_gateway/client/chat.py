"""The chat's calls of a session (docs/chat.md), for both clients: `session.chat(...)`
collects a turn, `session.chat_stream(...)` yields its events as they come.

Mixins of `Session` and `AsyncSession`; what they use of a session (its client, the calls
`BaseSession` builds) is named by a Protocol.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from kernel_gateway.client._base import Call, chat_body
from kernel_gateway.client.models import ChatEvent, ChatReply, ChatText

if TYPE_CHECKING:
    from kernel_gateway.client._async import AsyncClient
    from kernel_gateway.client._sync import Client


class _Calls(Protocol):
    @property
    def _chat_path(self) -> str: ...
    def _chat_history(self) -> Call[dict[str, Any]]: ...
    def _stop_chat(self) -> Call[bool]: ...
    def _forget_chat(self) -> Call[None]: ...


class _Session(_Calls, Protocol):
    @property
    def client(self) -> Client: ...


class _AsyncSession(_Calls, Protocol):
    @property
    def client(self) -> AsyncClient: ...


class ChatCalls:
    """The chat of a `Session`."""

    def chat_stream(
        self: _Session, message: str, *, files: Sequence[str] | None = None
    ) -> Iterator[ChatEvent]:
        """Ask the session's chat in words (docs/chat.md): the turn's events as they come
        (the model's `ChatText`, each `ChatCell` then that cell's events), `ChatEnd` last."""
        return self.client._stream(self._chat_path, chat_body(message, files), chat=True)

    def chat(
        self: _Session,
        message: str,
        *,
        files: Sequence[str] | None = None,
        on_text: Callable[[str], object] | None = None,
        on_event: Callable[[ChatEvent], object] | None = None,
    ) -> ChatReply:
        """Ask the session's chat and collect the turn (`on_text` gets the model's words as
        they come). A model that failed is `reply.status == "model_error"`, not an
        exception: the session is fine."""
        reply = ChatReply()
        for event in ChatCalls.chat_stream(self, message, files=files):
            reply.add(event)
            if on_event is not None:
                on_event(event)
            if on_text is not None and isinstance(event, ChatText):
                on_text(event.text)
        return reply

    def chat_history(self: _Session) -> dict[str, Any]:
        """The conversation: `{"running", "turns": [...]}`."""
        return self.client._send(self._chat_history())

    def stop_chat(self: _Session) -> bool:
        """Stop the running turn (its cell interrupted); False when none ran."""
        return self.client._send(self._stop_chat())

    def forget_chat(self: _Session) -> None:
        """Forget the conversation (the variables stay)."""
        self.client._send(self._forget_chat())


class AsyncChatCalls:
    """The chat of an `AsyncSession`."""

    def chat_stream(
        self: _AsyncSession, message: str, *, files: Sequence[str] | None = None
    ) -> AsyncIterator[ChatEvent]:
        """Ask the session's chat in words (docs/chat.md): the turn's events as they come
        (the model's `ChatText`, each `ChatCell` then that cell's events), `ChatEnd` last."""
        return self.client._stream(self._chat_path, chat_body(message, files), chat=True)

    async def chat(
        self: _AsyncSession,
        message: str,
        *,
        files: Sequence[str] | None = None,
        on_text: Callable[[str], object] | None = None,
        on_event: Callable[[ChatEvent], object] | None = None,
    ) -> ChatReply:
        """Ask the session's chat and collect the turn (`on_text` gets the model's words as
        they come). A model that failed is `reply.status == "model_error"`, not an
        exception: the session is fine."""
        reply = ChatReply()
        async for event in AsyncChatCalls.chat_stream(self, message, files=files):
            reply.add(event)
            if on_event is not None:
                on_event(event)
            if on_text is not None and isinstance(event, ChatText):
                on_text(event.text)
        return reply

    async def chat_history(self: _AsyncSession) -> dict[str, Any]:
        """The conversation: `{"running", "turns": [...]}`."""
        return await self.client._send(self._chat_history())

    async def stop_chat(self: _AsyncSession) -> bool:
        """Stop the running turn (its cell interrupted); False when none ran."""
        return await self.client._send(self._stop_chat())

    async def forget_chat(self: _AsyncSession) -> None:
        """Forget the conversation (the variables stay)."""
        await self.client._send(self._forget_chat())
