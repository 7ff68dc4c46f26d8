"""E2B sandboxes over the gateway's sessions: one session each, with E2B's own lifetime.

A sandbox is a gateway session (its id is the session's, so a cluster router finds its
node) plus what E2B says about it: the template it was made from, its metadata and
environment variables, its access token, its end time (`timeout` seconds after
creation, moved by `set_timeout`, extended by `connect`), and whether it is paused.

The access token is the sandbox's own secret: E2B's SDKs send it as `X-Access-Token`
(envd, `/execute`) or `E2B-Traffic-Access-Token` (everything on the data plane); a
request with another sandbox's token is refused, compared in constant time.

With `--persist-sessions` each sandbox is recorded beside the sessions (in the instance's
runtime folder, 0700; the token with it, as the session records hold theirs), so a sandbox
whose session a later gateway adopts is the same sandbox for E2B: id, token, metadata, end
time, paused or not. Its own context (the session's kernel) keeps its variables; other
contexts are kernels that end with the gateway, and are made again on first use.

A reaper kills sandboxes past their end time. A sandbox whose session went away (the
gateway's idle reaper, a `DELETE /sessions/{id}`) is gone for E2B too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from kernel_gateway.errors import (
    GatewayError,
    SessionLost,
    SessionNotFound,
    SnapshotNotFound,
    TemplateNotFound,
)
from kernel_gateway.kernels.volumes import VolumeMount
from kernel_gateway.protocols.e2b.contexts import (
    LISTED_DEFAULTS,
    Context,
    equip,
    prepare_new_kernels,
    setup_code,
)
from kernel_gateway.protocols.e2b.envd_entries import HOME
from kernel_gateway.protocols.e2b.errors import SandboxError, not_found, status_for
from kernel_gateway.protocols.e2b.sandbox import DEFAULT_TIMEOUT, Sandbox
from kernel_gateway.records import RecordStore
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.session import Session
from kernel_gateway.sessions.snapshots import SavedSessions, Snapshot
from kernel_gateway.tenants.principal import ADMIN, Principal

logger = logging.getLogger(__name__)

TEMPLATES = frozenset({"code-interpreter-v1", "code-interpreter", "base"})
"""E2B template names that mean the gateway's kernel image (the SDKs' defaults)."""
MAX_TIMEOUT = 24 * 3600
ENVD_VERSION = "0.6.4"
"""What the sandboxes claim to run: from 0.4.0 the SDKs send no user by default; 0.6.4 is
the newest the SDKs know of, and its features all work here (design/e2b-wire.md, 4)."""
REAP_EVERY = 1.0


class Sandboxes:
    """Every E2B sandbox of this gateway, by id; kills them at their end time."""

    def __init__(
        self,
        registry: Registry,
        snapshots: SavedSessions,
        store: RecordStore[Sandbox] | None = None,
        commands_running: Callable[[str], bool] | None = None,
    ) -> None:
        """`commands_running(sandbox_id)`: whether the sandbox runs commands now (then it
        is in use, for the gateway's idle reaper, as when a cell runs in any context)."""
        self.registry = registry
        self.snapshots = snapshots
        self._commands_running = commands_running or (lambda _id: False)
        self._by_id: dict[str, Sandbox] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._store = store
        """With `--persist-sessions`: each sandbox's record, for the next gateway."""

    def start(self) -> None:
        """Take the sandboxes a previous gateway recorded whose sessions were adopted
        (the others are gone: their records go too), then start the reaper."""
        if self._store is not None:
            self._store.open()
            for sandbox in self._store.load():
                if self._session(sandbox.id) is None:
                    logger.info("E2B sandbox %s: its session was not adopted", sandbox.id)
                    self._store.delete(sandbox.id)
                    continue
                self._list_defaults(sandbox)
                self._by_id[sandbox.id] = sandbox
                session = self._session(sandbox.id)
                code = setup_code(sandbox.language, sandbox.env, HOME)
                if session is not None and code is not None:
                    prepare_new_kernels(session, code)  # the adopted kernel has them already
        self._reaper = asyncio.ensure_future(self._reap())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        if self._store is not None:
            await self._store.close()

    def _list_defaults(self, sandbox: Sandbox) -> None:
        """The default contexts a new sandbox lists (`LISTED_DEFAULTS`, those this gateway
        has kernels of)."""
        for language in LISTED_DEFAULTS:
            if language in self.registry.pools:
                sandbox.list_default(language)

    def _save(self, sandbox: Sandbox) -> None:
        if self._store is not None:
            self._store.save(sandbox)

    def _forget(self, sandbox_id: str) -> None:
        if self._by_id.pop(sandbox_id, None) is not None and self._store is not None:
            self._store.delete(sandbox_id)

    # -- the control plane --------------------------------------------------------------

    async def create(
        self,
        template: str,
        lifetime: int | None,
        metadata: dict[str, str],
        env: dict[str, str],
        *,
        auto_pause: bool = False,
        auto_resume: bool = False,
        network: list[str] | str | None = None,
        mounts: tuple[VolumeMount, ...] = (),
        owner: Principal,
    ) -> Sandbox:
        """`template`: a built-in name (`TEMPLATES`: the gateway's kernel image), a snapshot
        (its id or name: E2B's snapshots are templates), or a gateway template (`name`,
        `name:tag` or its id). `network`: the domains it may reach (as `POST /sessions`
        takes them: None for the gateway's default, "none", or patterns)."""
        seconds = timeout_seconds(lifetime)
        check_env(env, "'envVars'")
        snapshot = await self._snapshot(template, owner)
        if snapshot is not None:
            try:
                restored = await self.snapshots.start(
                    snapshot.id, network, mounts=mounts, owner=owner
                )
            except GatewayError as exc:
                raise SandboxError(status_for(exc), exc.message, kind=exc.error_type) from exc
            saved = snapshot.extra.get("e2b") or {}
            return await self.around(
                restored.session,
                Sandbox(
                    id=restored.session.id,
                    template=snapshot.id,
                    alias=snapshot.name,
                    language=restored.session.language,
                    token=secrets.token_urlsafe(32),
                    started_at=datetime.now(UTC),
                    end_at=time.time() + seconds,
                    metadata=dict(metadata),
                    env={**dict(saved.get("env") or {}), **env},
                    lifetime=seconds,
                    auto_pause=auto_pause,
                    auto_resume=auto_resume,
                ),
            )
        session = await self._new_session(template, network, mounts, owner)
        ref = session.template
        return await self.around(
            session,
            Sandbox(
                id=session.id,
                template=ref.id if ref is not None else template,
                alias=ref.name if ref is not None else None,
                language=session.language,
                token=secrets.token_urlsafe(32),
                started_at=datetime.now(UTC),
                end_at=time.time() + seconds,
                metadata=dict(metadata),
                env=dict(env),
                lifetime=seconds,
                auto_pause=auto_pause,
                auto_resume=auto_resume,
            ),
        )

    async def around(self, session: Session, sandbox: Sandbox) -> Sandbox:
        """`sandbox`, made of `session` (a new one): recorded, its environment set up; killed
        if that fails."""
        sandbox.volume_mounts = [{"name": m.name, "path": m.target} for m in session.mounts]
        sandbox.add_main_context()
        self._list_defaults(sandbox)
        self._by_id[sandbox.id] = sandbox
        self._save(sandbox)
        if self._store is not None:
            await self._store.flush()  # on disk before the SDK hears of it
        try:
            await equip(session, sandbox.env)
        except SandboxError:
            await self.kill(sandbox.id, ADMIN)
            raise
        return sandbox

    async def _snapshot(self, template: str, owner: Principal) -> Snapshot | None:
        """The snapshot `template` names (its id or name, or `name:default` as E2B writes a
        snapshot's name), if it names one."""
        if template in TEMPLATES:
            return None
        reference = template.removesuffix(":default")
        try:
            return await self.snapshots.get(reference, owner)
        except SnapshotNotFound:
            return None

    async def _new_session(
        self,
        template: str,
        network: list[str] | str | None,
        mounts: tuple[VolumeMount, ...],
        owner: Principal,
    ) -> Session:
        """The session of a new sandbox on `template`: the kernel image for a built-in
        name, else the gateway template's ready build (E2B's 404 for one not there)."""
        builtin = template in TEMPLATES
        if not builtin and self.registry.templates is None:
            raise SandboxError(
                400,
                f"template {template!r} is not available here: this gateway runs its kernel "
                f"image for the templates {', '.join(sorted(TEMPLATES))} (its backend builds "
                "no templates of its own)",
            )
        try:
            ref = None if builtin else template
            return await self.registry.create_session(None, network, ref, mounts, owner=owner)
        except TemplateNotFound as exc:
            raise SandboxError(
                404, f"template {template!r} not found ({exc.message})", kind=exc.error_type
            ) from None
        except GatewayError as exc:
            raise SandboxError(status_for(exc), exc.message, kind=exc.error_type) from exc

    # -- contexts -------------------------------------------------------------------------

    async def create_context(self, sandbox: Sandbox, language: str, cwd: str | None) -> Context:
        """A new kernel of `language` on the sandbox's files, in `cwd` (default /home/user)."""
        cwd = cwd or HOME
        session = await self._start_context(sandbox, language, cwd)
        context = Context(session.id, session.language, cwd, session.id)
        sandbox.contexts[context.id] = context
        return context

    async def _start_context(self, sandbox: Sandbox, language: str, cwd: str) -> Session:
        try:
            # The sandbox's token was checked: counted against its owner's quota.
            session = await self.registry.create_companion(sandbox.id, language, viewer=ADMIN)
        except GatewayError as exc:
            raise SandboxError(status_for(exc), exc.message) from exc
        try:
            await equip(session, sandbox.env, cwd)
        except BaseException:
            await self.registry.close_companion(sandbox.id, session)  # not left holding a kernel
            raise
        return session

    async def default_context(self, sandbox: Sandbox, language: str) -> Context:
        """The context `/execute` uses for `language` when given none: made on first use."""
        async with sandbox.context_lock:
            found = sandbox.contexts.get(sandbox.defaults.get(language, ""))
            if found is None:
                found = await self.create_context(sandbox, language, None)
                sandbox.defaults[language] = found.id
            return found

    async def started_context(self, sandbox: Sandbox, context_id: str) -> Session:
        """The session of context `context_id`, whose kernel is started now if it is a
        listed default context's first use."""
        context = sandbox.contexts.get(context_id)
        if context is not None and context.session_id is None:
            async with sandbox.context_lock:
                context = sandbox.contexts.get(context_id)
                if context is not None and context.session_id is None:
                    session = await self._start_context(sandbox, context.language, context.cwd)
                    if sandbox.contexts.get(context_id) is not context:  # removed meanwhile
                        await self.registry.close_companion(sandbox.id, session)
                        raise SandboxError(404, f"context {context_id!r} not found")
                    context = Context(context.id, context.language, context.cwd, session.id)
                    sandbox.contexts[context_id] = context
        started = self.context_session(sandbox, context_id)
        assert started is not None  # started above
        return started

    def context_session(self, sandbox: Sandbox, context_id: str) -> Session | None:
        """The session of context `context_id` (None: a listed default context whose kernel
        has not started)."""
        context = sandbox.contexts.get(context_id)
        if context is None:
            raise SandboxError(404, f"context {context_id!r} not found")
        if context.session_id is None:
            return None
        if context.session_id == sandbox.id:
            return self.session(sandbox)
        for session in self.registry.companions(sandbox.id):
            if session.id == context.session_id:
                return session
        self._drop_context(sandbox, context_id)
        raise SandboxError(404, f"context {context_id!r} not found")

    async def remove_context(self, sandbox: Sandbox, context_id: str) -> None:
        session = self.context_session(sandbox, context_id)
        if context_id == sandbox.id:
            raise SandboxError(400, "the sandbox's own context cannot be removed (kill it instead)")
        self._drop_context(sandbox, context_id)
        if session is not None:
            await self.registry.close_companion(sandbox.id, session)

    @staticmethod
    def _drop_context(sandbox: Sandbox, context_id: str) -> None:
        sandbox.contexts.pop(context_id, None)
        for language, default in list(sandbox.defaults.items()):
            if default == context_id:
                del sandbox.defaults[language]

    def get(self, sandbox_id: str, viewer: Principal) -> Sandbox:
        """The sandbox, if `viewer` may see it (the API key that made it, or the admin; the
        data plane asks as the admin, then checks the sandbox's own token)."""
        sandbox = self._by_id.get(sandbox_id)
        session = self._session(sandbox_id)
        if sandbox is None or session is None:
            self._forget(sandbox_id)
            raise not_found(sandbox_id)
        if not viewer.sees(session.owner):
            raise not_found(sandbox_id)
        return sandbox

    def owner(self, sandbox: Sandbox) -> str | None:
        """The id of the API key that made it (None: the admin)."""
        session = self._session(sandbox.id)
        return session.owner if session is not None else None

    def has(self, sandbox_id: str) -> bool:
        return sandbox_id in self._by_id

    def session(self, sandbox: Sandbox) -> Session:
        session = self._session(sandbox.id)
        if session is None:
            self._forget(sandbox.id)
            raise not_found(sandbox.id)
        return session

    async def kill(self, sandbox_id: str, viewer: Principal) -> None:
        self.get(sandbox_id, viewer)
        self._forget(sandbox_id)
        with contextlib.suppress(SessionNotFound, SessionLost):
            await self.registry.delete_session(sandbox_id, viewer)

    def set_timeout(self, sandbox_id: str, timeout: int, viewer: Principal) -> None:
        """Its end `timeout` seconds from now; 0 ends it now (E2B's `minimum: 0`): the
        reaper kills or, with `autoPause`, pauses it within `REAP_EVERY`."""
        sandbox = self.get(sandbox_id, viewer)
        sandbox.end_at = time.time() + (0 if timeout == 0 else timeout_seconds(timeout))
        self._save(sandbox)

    async def connect(
        self, sandbox_id: str, lifetime: int | None, viewer: Principal
    ) -> tuple[Sandbox, bool]:
        """The sandbox, resumed if it was paused (the second value says so), its session
        brought back from hibernation; its end time only ever moves later."""
        sandbox = self.get(sandbox_id, viewer)
        resumed = sandbox.paused
        session = self._session(sandbox_id)
        if session is not None and session.hibernated:
            try:
                await session.resume()
            except GatewayError as exc:
                raise SandboxError(
                    503, f"the sandbox could not be resumed: {exc.message}"
                ) from None
        sandbox.paused = False
        if lifetime is not None:
            sandbox.end_at = max(sandbox.end_at, time.time() + timeout_seconds(lifetime))
        self._save(sandbox)
        return sandbox, resumed

    def resume_on_demand(self, sandbox: Sandbox) -> bool:
        """A data-plane call reached a paused sandbox: resume it if it asked for that
        (`autoResume`), for its lifetime again; False if it stays paused."""
        if not sandbox.auto_resume:
            return False
        sandbox.paused = False
        sandbox.end_at = max(sandbox.end_at, time.time() + sandbox.lifetime)
        self._save(sandbox)
        logger.info("E2B sandbox %s resumed by a call to it", sandbox.id)
        return True

    async def pause(self, sandbox_id: str, viewer: Principal) -> None:
        sandbox = self.get(sandbox_id, viewer)
        if sandbox.paused:
            raise SandboxError(409, f"sandbox {sandbox_id!r} is already paused")
        sandbox.paused = True
        self._save(sandbox)
        await self._hibernate(sandbox)

    async def _hibernate(self, sandbox: Sandbox) -> None:
        """A paused sandbox gives back its memory: its session hibernates (its variables and
        files on disk). One with commands or other contexts running, or not a Python
        sandbox, stays paused with its kernel running (they cannot be saved)."""
        session = self._session(sandbox.id)
        if session is None or session.hibernated:
            return
        if self._in_use(sandbox.id) or self.registry.companions(sandbox.id):
            logger.info(
                "E2B sandbox %s paused with its kernel running: it has commands or other contexts",
                sandbox.id,
            )
            return
        try:
            await self.registry.hibernate(sandbox.id, ADMIN)
        except GatewayError as exc:
            logger.info("E2B sandbox %s paused with its kernel running: %s", sandbox.id, exc)

    def all(self) -> Iterator[Sandbox]:
        """Every sandbox, whoever made it (the gateway's own view)."""
        for sandbox_id in list(self._by_id):
            with contextlib.suppress(SandboxError):
                yield self.get(sandbox_id, ADMIN)

    def visible(self, viewer: Principal) -> Iterator[Sandbox]:
        """The sandboxes `viewer` may see."""
        for sandbox_id in list(self._by_id):
            with contextlib.suppress(SandboxError):
                yield self.get(sandbox_id, viewer)

    # -- internals ----------------------------------------------------------------------

    def _session(self, sandbox_id: str) -> Session | None:
        try:
            return self.registry.get(sandbox_id, ADMIN)
        except (SessionNotFound, SessionLost):
            return None

    def touch(self, sandbox: Sandbox) -> None:
        """A data-plane call reached the sandbox: it is in use."""
        session = self._session(sandbox.id)
        if session is not None:
            session.touch()

    def _in_use(self, sandbox_id: str) -> bool:
        return self._commands_running(sandbox_id) or any(
            c.busy for c in self.registry.companions(sandbox_id)
        )

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_EVERY)
            for sandbox_id in list(self._by_id):
                session = self._session(sandbox_id)
                if session is None:
                    self._forget(sandbox_id)  # its session was deleted or reaped by the gateway
                elif self._in_use(sandbox_id):
                    session.touch()  # in use: not idle for the gateway's idle reaper
            for sandbox in [s for s in self._by_id.values() if s.end_at <= time.time()]:
                # Acted on one at a time, each checked again: a kill takes seconds, and a
                # set_timeout, connect or kill may come meanwhile.
                if self._by_id.get(sandbox.id) is not sandbox:
                    continue
                if sandbox.paused or sandbox.end_at > time.time():
                    continue
                if sandbox.auto_pause:
                    logger.info("E2B sandbox %s reached its timeout; pausing it", sandbox.id)
                    sandbox.paused = True
                    self._save(sandbox)
                    await self._hibernate(sandbox)
                    continue
                logger.info("E2B sandbox %s reached its timeout; killing it", sandbox.id)
                try:
                    await self.kill(sandbox.id, ADMIN)
                except SandboxError:
                    pass
                except Exception:
                    logger.exception("killing E2B sandbox %s failed", sandbox.id)


def check_env(env: dict[str, str], what: str) -> None:
    """Environment variables a process can have, or a 400 naming the first that cannot."""
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise SandboxError(400, f"{what}: {name!r} cannot be an environment variable")


def timeout_seconds(timeout: int | None) -> int:
    seconds = DEFAULT_TIMEOUT if timeout is None else timeout
    if not 0 < seconds <= MAX_TIMEOUT:
        raise SandboxError(400, f"timeout must be between 1 and {MAX_TIMEOUT} seconds")
    return seconds
