"""An E2B sandbox as E2B sees it: its template, metadata, environment, access token,
lifetime and contexts (a gateway session underneath, by the same id); its record."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kernel_gateway.protocols.e2b.contexts import Context
from kernel_gateway.protocols.e2b.envd_entries import HOME

DEFAULT_TIMEOUT = 300
RECORD_FORMAT = 1


@dataclass
class Sandbox:
    id: str
    template: str
    """Its `templateID`: a built-in name (`base`), or the id of the gateway template it
    runs."""
    token: str
    started_at: datetime
    end_at: float
    """Wall-clock time the sandbox is killed at (unless moved)."""
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    paused: bool = False
    lifetime: int = 300
    """The `timeout` it was made with: how far an automatic resume moves its end."""
    auto_pause: bool = False
    """`autoPause`: at its end time it is paused, not killed."""
    auto_resume: bool = False
    """`autoResume`: a data-plane call to it while paused resumes it."""
    contexts: dict[str, Context] = field(default_factory=dict)
    """By id; the first is the sandbox's own kernel (its session's)."""
    defaults: dict[str, str] = field(default_factory=dict)
    """Language -> the id of the context `/execute` uses for it when given no context."""
    context_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    alias: str | None = None
    """The name of the gateway template it runs (None: `template` is a built-in name)."""
    language: str = "python"
    """Its own context's language (its template's)."""
    volume_mounts: list[dict[str, str]] = field(default_factory=list)
    """E2B's `volumeMounts`: `{"name", "path"}` each."""

    @property
    def state(self) -> str:
        return "paused" if self.paused else "running"

    def to_json(self) -> dict[str, Any]:
        """What a later gateway needs (with `--persist-sessions`): contexts other than the
        sandbox's own are kernels that do not outlive the gateway, so they are not kept."""
        return {
            "format": RECORD_FORMAT,
            "id": self.id,
            "template": self.template,
            "token": self.token,
            "started_at": self.started_at.isoformat(),
            "end_at": self.end_at,
            "metadata": self.metadata,
            "env": self.env,
            "paused": self.paused,
            "lifetime": self.lifetime,
            "auto_pause": self.auto_pause,
            "auto_resume": self.auto_resume,
            "alias": self.alias,
            "language": self.language,
            "volume_mounts": self.volume_mounts,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sandbox:
        if data.get("format") != RECORD_FORMAT:
            raise ValueError(f"unknown sandbox record format {data.get('format')!r}")
        sandbox = cls(
            id=str(data["id"]),
            template=str(data["template"]),
            token=str(data["token"]),
            started_at=datetime.fromisoformat(str(data["started_at"])),
            end_at=float(data["end_at"]),
            metadata={str(k): str(v) for k, v in dict(data["metadata"]).items()},
            env={str(k): str(v) for k, v in dict(data["env"]).items()},
            paused=bool(data["paused"]),
            lifetime=int(data.get("lifetime", DEFAULT_TIMEOUT)),
            auto_pause=bool(data.get("auto_pause", False)),
            auto_resume=bool(data.get("auto_resume", False)),
            alias=data.get("alias"),
            language=str(data.get("language") or "python"),
            volume_mounts=[
                {str(k): str(v) for k, v in m.items()} for m in data.get("volume_mounts", [])
            ],
        )
        sandbox.add_main_context()
        return sandbox

    def add_main_context(self) -> None:
        """Its own context: its session's kernel, the default one for its language."""
        main = Context(self.id, self.language, HOME, self.id)
        self.contexts[main.id] = main
        self.defaults[self.language] = main.id

    def list_default(self, language: str) -> None:
        """`language`'s default context, listed now and started on its first use. Its id is
        made from the sandbox's and the language, so it stays the same across a restart of
        the gateway (where the kernel of a started one is made again, as every default
        context's is)."""
        if language not in self.defaults:
            made = hashlib.sha256(f"{self.id}/{language}".encode()).hexdigest()[:32]
            pending = Context(made, language, HOME, None)
            self.contexts[pending.id] = pending
            self.defaults[language] = pending.id

    def accepts(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.token.encode())
