"""The ASGI application: routes, auth, error handlers, and a lifespan that owns the sessions."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import zmq.asyncio
from starlette.applications import Starlette

from kernel_gateway import logs
from kernel_gateway.chat.service import Chat
from kernel_gateway.errors import BackendUnavailable
from kernel_gateway.http.auth import Authenticator
from kernel_gateway.http.errors import exception_handlers
from kernel_gateway.http.middleware import front_middleware
from kernel_gateway.kernels.backends import AUTO, load_backend
from kernel_gateway.kernels.backends.base import Backend
from kernel_gateway.kernels.pools.fork import fork_pool
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.kernels.volumes import Volumes
from kernel_gateway.metrics import Metrics
from kernel_gateway.protocols.e2b.app import E2BService
from kernel_gateway.protocols.jupyter.kernels import JupyterKernels
from kernel_gateway.protocols.mcp.lazy import LazyMcp
from kernel_gateway.server.openapi import build
from kernel_gateway.server.protocols import protocol_state
from kernel_gateway.server.routes import routes
from kernel_gateway.sessions.durable import DurableSessions
from kernel_gateway.sessions.gauges import RegistryGauges
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.snapshots import SavedSessions, SnapshotStore
from kernel_gateway.sessions.usage import UsageSampler
from kernel_gateway.settings import Settings
from kernel_gateway.templates.builtin import start_builtin
from kernel_gateway.templates.service import Templates
from kernel_gateway.tenants.keys import KeyStore
from kernel_gateway.tenants.principal import ADMIN
from kernel_gateway.tenants.secrets import SecretStore
from kernel_gateway.tenants.usage import UsageCollector
from kernel_gateway.types import JSON

if TYPE_CHECKING:  # its module loads the Docker SDK: imported when egress is on
    from kernel_gateway.kernels.egress.proxy import EgressProxy

logger = logging.getLogger("kernel_gateway")


class State(TypedDict):
    registry: Registry
    templates: Templates | None
    settings: Settings
    metrics: Metrics
    jupyter: JupyterKernels
    mcp: LazyMcp | None
    e2b: E2BService
    snapshots: SavedSessions
    volumes: Volumes
    usage: UsageSampler
    keys: KeyStore
    auth: Authenticator
    chat: Chat
    secrets: SecretStore
    openapi: Callable[[], JSON]


async def select_backend(settings: Settings, runtime: RuntimeDir) -> Backend:
    """The backend named in settings, started; `auto` tries each of `AUTO` in turn.

    So `auto` is docker when an engine answers and the image exists, else local.
    A backend's module is imported only when it is tried.
    """
    names = AUTO if settings.backend == "auto" else (settings.backend,)
    for name, fallback in zip(names, (*names[1:], None), strict=True):
        try:
            backend = load_backend(name)(settings, runtime)
            try:
                await backend.start()
            except BackendUnavailable:
                await backend.close()
                raise
            return backend
        except BackendUnavailable as exc:
            if fallback is None:
                raise
            logger.warning(
                "%s backend unavailable (%s); falling back to %s", name, exc.message, fallback
            )
    raise AssertionError("no backend to try")


def create_app(settings: Settings) -> Starlette:
    # Made before the lifespan runs: the server's signal handler calls its
    # `stop_requested` (uvicorn runs the lifespan's shutdown only after it has waited
    # for open connections, and the drain must start at the signal).
    durable = DurableSessions(settings)
    metrics = Metrics()
    keys = KeyStore(settings.runtime_dir / "keys.sqlite3")
    auth = Authenticator(settings.token, keys)
    metrics.register(UsageCollector(keys.usage_by_name))  # each key's, read at scrape time

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        started = time.monotonic()
        runtime = await durable.open_runtime()
        context = zmq.asyncio.Context()
        backend: Backend | None = None
        egress: EgressProxy | None = None
        gauges: RegistryGauges | None = None
        templates: Templates | None = None
        usage: UsageSampler | None = None
        chat: Chat | None = None
        unname: Callable[[], None] | None = None
        try:
            await asyncio.to_thread(keys.open)
            backend = await select_backend(settings, runtime)
            backend_ready = time.monotonic()
            logger.info("backend: %s; isolation: %s", backend.name, backend.isolation)
            if backend.startup_warning is not None:
                logger.warning("%s", backend.startup_warning)
            logger.info(
                "languages: %s",
                ", ".join(f"{n} {lang.version}".strip() for n, lang in backend.languages.items()),
            )
            warm = WarmPool(settings, backend, runtime, context, metrics)
            others = [
                WarmPool(settings, backend, runtime, context, metrics, language=language)
                for language in backend.languages.values()
                if not language.builtin
            ]
            forks = fork_pool(settings, backend, runtime, warm, context, metrics)
            if settings.egress_needed:  # its module loads the Docker SDK: only when asked for
                from kernel_gateway.kernels.egress.proxy import start_egress

                egress = await start_egress(settings, backend, runtime)
            secrets = SecretStore(runtime.root / "secrets.json", settings.secrets_key_file)
            await asyncio.to_thread(secrets.open)
            if egress is not None:
                await asyncio.to_thread(give_secrets, egress, secrets, settings, runtime.root)
            if backend.images is not None:
                templates = Templates(settings, backend, runtime, context)
                await asyncio.to_thread(templates.open)
                await templates.sweep()
                templates.egress = egress
            start_builtin(templates, settings.builtin_template_list, backend.name)
            registry = Registry(
                settings,
                warm,
                runtime.instance,
                forks,
                others,
                egress,
                templates,
                principals=keys.principal,
                usage=keys,
            )
            volumes = Volumes(
                runtime.root / "volumes",
                capped=backend.disks_capped,
                owner=backend.workspace_owner,
                max_volumes=settings.max_volumes,
                node=settings.node_name or None,
            )
            await volumes.open()  # before adoption: adopted sessions' volumes are mounted
            unname = logs.name_keys(functools.partial(owner_name, registry, keys))
            await durable.start(backend, runtime, registry)
            registry.start()
            gauges = RegistryGauges(registry)
            metrics.register(gauges)
            logger.info(
                "ready in %.2f s (backend %.2f s%s)",
                time.monotonic() - started,
                backend_ready - started,
                f", adopting {time.monotonic() - backend_ready:.2f} s" if runtime.adopted else "",
            )
            records = runtime.path if settings.persist_sessions else None
            languages = registry.languages
            snapshots = SavedSessions(registry, SnapshotStore(runtime.root / "snapshots"))
            await asyncio.to_thread(snapshots.store.open)
            usage = UsageSampler(settings, registry.sessions, sink=keys)
            registry.quotas.disk_held = usage.disk_held
            usage.start()
            chat = Chat(settings, runtime.path / "chats" if settings.persist_sessions else None)
            await chat.open(registry.sessions())
            async with protocol_state(
                settings, registry, snapshots, usage, volumes, auth, records, secrets
            ) as protocols:
                document = functools.cache(functools.partial(build, settings, list(languages)))
                yield {
                    "registry": registry,
                    "templates": templates,
                    "settings": settings,
                    "metrics": metrics,
                    "snapshots": snapshots,
                    "volumes": volumes,
                    "usage": usage,
                    "keys": keys,
                    "auth": auth,
                    "chat": chat,
                    "secrets": secrets,
                    "openapi": document,
                    **protocols,
                }
        finally:
            if chat is not None:
                await chat.close()  # turns end `interrupted`; conversations written
            if usage is not None:
                await usage.close()
            if unname is not None:
                unname()
            if gauges is not None:
                metrics.unregister(gauges)
            left = await durable.stop()  # kernels left running for the next gateway
            if templates is not None:
                await templates.close()  # running builds fail: nothing half-made is named
            if egress is not None:
                await egress.close()
            if backend is not None:
                await (backend.detach() if left else backend.close())
            context.destroy(linger=0)
            runtime.close(keep=left > 0)
            try:
                await keys.save_usage()
            except Exception:
                logger.exception("writing the API keys' usage failed")
            await asyncio.to_thread(keys.close)
            durable.log_stopped(left)

    app = Starlette(
        routes=routes,
        middleware=front_middleware(metrics, auth, settings.host),
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.lifecycle = durable  # its stop_requested is the server's on_stop (cli/main.py)
    return app


def give_secrets(egress: EgressProxy, secrets: SecretStore, settings: Settings, root: Path) -> None:
    """The egress proxy's relays get the secrets, the CA they show sandboxes (made once per
    runtime dir), and the CAs they trust besides the system's (`--egress-ca-file`)."""
    if not secrets.enabled:
        return
    from kernel_gateway.kernels.egress.authority import Authority

    egress.secrets = secrets
    egress.authority = Authority(root / "egress-ca")
    if settings.egress_ca_file is not None:
        egress.upstream_tls.load_verify_locations(cafile=str(settings.egress_ca_file))


def owner_name(registry: Registry, keys: KeyStore, session_id: str) -> str | None:
    """The name of the key that owns session `session_id` (`admin`), for log lines about it."""
    session = next((s for s in registry.sessions() if s.id == session_id), None)
    if session is None:
        return None
    return ADMIN.name if session.owner is None else keys.name_of(session.owner)
