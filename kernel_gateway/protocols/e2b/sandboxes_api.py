"""E2B's control plane (no sandbox headers, `X-API-KEY`): sandboxes made, listed, timed,
paused, resumed and killed, answered in E2B's shapes (`{"code", "message"}` errors)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kernel_gateway.errors import GatewayError
from kernel_gateway.http.auth import principal_of
from kernel_gateway.http.bodies import query_seconds
from kernel_gateway.in_proxy.policy import BadPattern, normalize, protected
from kernel_gateway.kernels.egress.interception import PLACEHOLDERS, Rule
from kernel_gateway.kernels.volumes import VolumeMount
from kernel_gateway.protocols.e2b.errors import SandboxError, status_for
from kernel_gateway.protocols.e2b.replies import (
    ALL_METHODS,
    ControlHandler,
    Handler,
    e2b_error,
    guarded,
    json_body,
)
from kernel_gateway.protocols.e2b.sandbox import Sandbox
from kernel_gateway.protocols.e2b.sandboxes import ENVD_VERSION
from kernel_gateway.sessions import network_policy
from kernel_gateway.sessions.usage import Sample
from kernel_gateway.settings import Settings
from kernel_gateway.tenants.principal import ADMIN, Principal
from kernel_gateway.tenants.secrets import E2B_PLACEHOLDER

if TYPE_CHECKING:
    from kernel_gateway.protocols.e2b.app import E2BService


def control_routes(service: E2BService) -> list[Route]:
    """The sandboxes' routes, then a 501 for every other control-plane call (so the
    templates' routes, `templates_api.py`, go before these)."""

    def guard(handler: ControlHandler) -> Handler:
        return guarded(service, handler)

    return [
        Route("/sandboxes", guard(create), methods=["POST"]),
        Route("/v2/sandboxes", guard(create), methods=["POST"]),
        Route("/sandboxes", guard(list_sandboxes), methods=["GET"]),
        Route("/v2/sandboxes", guard(list_sandboxes), methods=["GET"]),
        Route("/sandboxes/metrics", guard(all_metrics), methods=["GET"]),
        Route("/sandboxes/{id}", guard(get_sandbox), methods=["GET"]),
        Route("/sandboxes/{id}", guard(kill), methods=["DELETE"]),
        Route("/sandboxes/{id}/timeout", guard(set_timeout), methods=["POST"]),
        Route("/sandboxes/{id}/connect", guard(connect), methods=["POST"]),
        Route("/v2/sandboxes/{id}/connect", guard(connect), methods=["POST"]),
        Route("/sandboxes/{id}/resume", guard(connect), methods=["POST"]),
        Route("/sandboxes/{id}/pause", guard(pause), methods=["POST"]),
        Route("/sandboxes/{id}/metrics", guard(metrics), methods=["GET"]),
        Route("/sandboxes/{id}/network", guard(change_network), methods=["PUT"]),
        Route("/{rest:path}", guard(unsupported), methods=ALL_METHODS),
    ]


def _string_map(body: dict[str, Any], name: str) -> dict[str, str]:
    value = body.get(name) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SandboxError(400, f"'{name}' must be an object of strings")
    return dict(value)


def integer(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SandboxError(400, f"'{name}' must be a number of seconds")
    return int(value)


def sandbox_json(sandbox: Sandbox) -> dict[str, Any]:
    """What create and connect answer (E2B's `Sandbox`)."""
    return {
        "sandboxID": sandbox.id,
        "templateID": sandbox.template,
        "alias": sandbox.alias or sandbox.template,
        "clientID": "kernel-gateway",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sandbox.token,
        "trafficAccessToken": sandbox.token,
        "domain": None,
    }


def detail_json(sandbox: Sandbox, settings: Settings) -> dict[str, Any]:
    """What get and list answer (E2B's `SandboxDetail` / `ListedSandbox`)."""

    def rfc3339(moment: datetime) -> str:
        return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")

    return {
        "sandboxID": sandbox.id,
        "templateID": sandbox.template,
        "alias": sandbox.alias or sandbox.template,
        "clientID": "kernel-gateway",
        "startedAt": rfc3339(sandbox.started_at),
        "endAt": rfc3339(datetime.fromtimestamp(sandbox.end_at, UTC)),
        "envdVersion": ENVD_VERSION,
        "cpuCount": max(1, math.ceil(settings.cpu_limit)),
        "memoryMB": settings.memory_limit_bytes // 2**20,
        "diskSizeMB": settings.workspace_size_bytes // 2**20,
        "state": sandbox.state,
        "metadata": sandbox.metadata,
        "envdAccessToken": sandbox.token,
        "volumeMounts": sandbox.volume_mounts,
    }


async def create(request: Request, service: E2BService) -> Response:
    body = await json_body(request)
    template = body.get("templateID") or "base"
    if not isinstance(template, str):
        raise SandboxError(400, "'templateID' must be a string")
    _refuse_what_is_not_here(body)
    auto_resume = body.get("autoResume") or {}
    lifecycle = body.get("lifecycle") or {}
    if not isinstance(auto_resume, dict) or not isinstance(lifecycle, dict):
        raise SandboxError(400, "'autoResume' and 'lifecycle' must be objects")
    rules, named = _rules(body), _env_secrets(body)  # refused before anything is made
    sandbox = await service.sandboxes.create(
        template,
        integer(body, "timeout"),
        _string_map(body, "metadata"),
        _string_map(body, "envVars"),
        auto_pause=body.get("autoPause") is True or lifecycle.get("onTimeout") == "pause",
        auto_resume=auto_resume.get("enabled") is True or lifecycle.get("autoResume") is True,
        network=_network(body),
        mounts=await _volume_mounts(body, service, principal_of(request)),
        owner=principal_of(request),
    )
    if rules or named:
        session = service.registry.get(sandbox.id, ADMIN)
        try:
            await network_policy.use_secrets(
                session, named, service.secrets, E2B_PLACEHOLDER, rules
            )
        except BaseException:
            await service.sandboxes.kill(sandbox.id, ADMIN)
            raise
    return JSONResponse(sandbox_json(sandbox), status_code=201)


HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^`|~-]{1,128}")


def _rules(body: dict[str, Any]) -> tuple[Rule, ...]:
    """E2B's `network.rules` (`{host: [{"transform": {"headers": {name: value}}}]}`) as the
    egress relay's header rules; the secrets their values name may go to those hosts."""
    network = body.get("network") or {}
    rules = network.get("rules") if isinstance(network, dict) else None
    if rules is None:
        return ()
    if not isinstance(rules, dict):
        raise SandboxError(400, "'network.rules' must map hosts to lists of rules")
    found = []
    for host, entries in rules.items():
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise SandboxError(400, f"'network.rules.{host}' must be a list of rules")
        headers: dict[str, str] = {}
        for entry in entries:
            transform = entry.get("transform") or {}
            asked = transform.get("headers") or {} if isinstance(transform, dict) else None
            if not isinstance(asked, dict):
                raise SandboxError(400, f"'network.rules.{host}': 'transform.headers' is a map")
            for name, value in asked.items():
                if not HEADER_NAME.fullmatch(str(name)) or not isinstance(value, str):
                    raise SandboxError(400, f"'network.rules.{host}': a bad header {name!r}")
                if protected(str(name)):
                    raise SandboxError(400, f"'network.rules.{host}': {name} cannot be set")
                if any(c in value for c in "\r\n\0"):
                    raise SandboxError(400, f"'network.rules.{host}': {name} holds CR, LF or NUL")
                headers[str(name)] = value
        try:
            pattern = normalize(str(host))
        except BadPattern as exc:
            raise SandboxError(400, f"'network.rules': {exc}") from None
        if headers:
            found.append(Rule(pattern, tuple(headers.items())))
    return tuple(found)


def _env_secrets(body: dict[str, Any]) -> list[str]:
    """The secrets the sandbox's `envVars` name (`${e2b.secrets.NAME}`): its code may send
    them where its rules send them."""
    env = body.get("envVars") or {}
    values = env.values() if isinstance(env, dict) else []
    return sorted(
        {
            (m.group(1) or m.group(2)).decode()
            for v in values
            if isinstance(v, str)
            for m in PLACEHOLDERS.finditer(v.encode())
        }
    )


async def _volume_mounts(
    body: dict[str, Any], service: E2BService, viewer: Principal
) -> tuple[VolumeMount, ...]:
    """E2B's `volumeMounts` (`[{"name", "path"}]`) as the gateway's mounts (docs/volumes.md)."""
    asked = body.get("volumeMounts") or []
    if not isinstance(asked, list) or not all(
        isinstance(m, dict) and isinstance(m.get("name"), str) and isinstance(m.get("path"), str)
        for m in asked
    ):
        raise SandboxError(400, "'volumeMounts' must be a list of {name, path}")
    if len({m["name"] for m in asked}) != len(asked):
        raise SandboxError(400, "'volumeMounts' names a volume twice")
    try:
        return await service.volumes.mounts({m["name"]: m["path"] for m in asked}, viewer)
    except GatewayError as exc:
        raise SandboxError(status_for(exc), exc.message, kind=exc.error_type) from exc


def _network(body: dict[str, Any]) -> list[str] | str | None:
    """E2B's network options as the gateway's policy (docs/network.md):

    - `network.allowOut` (domain names): exactly those, within the gateway's ceiling;
    - `allow_internet_access: false`: none;
    - neither (or `allow_internet_access: true`, which e2b before 2.51 sends for every
      sandbox): the gateway's default (`--egress-default`; none unless the operator set one).
    """
    network = body.get("network")
    if network is not None and not isinstance(network, dict):
        raise SandboxError(400, "'network' must be an object")
    allow_out = (network or {}).get("allowOut")
    if allow_out is not None:
        if not isinstance(allow_out, list) or not all(isinstance(a, str) for a in allow_out):
            raise SandboxError(400, "'network.allowOut' must be a list of domain names")
        return allow_out or "none"
    if body.get("allow_internet_access") is False:
        return "none"
    return None


ALL_TRAFFIC = "0.0.0.0/0"


def network_update(body: dict[str, Any]) -> list[str] | str | None:
    """E2B's `SandboxNetworkUpdateConfig` as the gateway's policy: `allowOut`, exactly those
    (domain names; an address or CIDR is refused, as the gateway allows names only);
    `denyOut` with `0.0.0.0/0` and no `allowOut`, none; neither, the gateway's default. The
    gateway's sandboxes never reach an address by itself, so other `denyOut` entries hold
    already."""
    allow_out = body.get("allowOut")
    deny_out = body.get("denyOut") or []
    if allow_out is not None and (
        not isinstance(allow_out, list) or not all(isinstance(a, str) for a in allow_out)
    ):
        raise SandboxError(400, "'allowOut' must be a list of domain names")
    if not isinstance(deny_out, list) or not all(isinstance(d, str) for d in deny_out):
        raise SandboxError(400, "'denyOut' must be a list of addresses or CIDR blocks")
    if allow_out:
        return list(allow_out)
    if ALL_TRAFFIC in deny_out or allow_out == []:
        return "none"
    return None


async def change_network(request: Request, service: E2BService) -> Response:
    sandbox = service.sandboxes.get(request.path_params["id"], principal_of(request))
    session = service.sandboxes.session(sandbox)
    asked = network_update(await json_body(request))
    registry = service.registry
    await network_policy.change(
        session, asked, service.settings, registry.egress, registry.warm.metrics
    )
    return Response(status_code=204)


def _refuse_what_is_not_here(body: dict[str, Any]) -> None:
    """A create asking for what this gateway's sandboxes cannot have: a clear 400, never a
    sandbox that silently lacks it."""
    if body.get("mcp"):
        raise SandboxError(
            400, "MCP servers in a sandbox ('mcp') are not supported by this gateway"
        )


async def get_sandbox(request: Request, service: E2BService) -> Response:
    sandbox = service.sandboxes.get(request.path_params["id"], principal_of(request))
    return JSONResponse(detail_json(sandbox, service.settings))


async def kill(request: Request, service: E2BService) -> Response:
    await service.sandboxes.kill(request.path_params["id"], principal_of(request))
    return Response(status_code=204)


async def set_timeout(request: Request, service: E2BService) -> Response:
    timeout = integer(await json_body(request), "timeout")
    if timeout is None:
        raise SandboxError(400, "'timeout' is required")
    service.sandboxes.set_timeout(request.path_params["id"], timeout, principal_of(request))
    return Response(status_code=204)


async def connect(request: Request, service: E2BService) -> Response:
    body = await json_body(request)
    sandbox_id = request.path_params["id"]
    sandbox, resumed = await service.sandboxes.connect(
        sandbox_id, integer(body, "timeout"), principal_of(request)
    )
    return JSONResponse(sandbox_json(sandbox), status_code=201 if resumed else 200)


async def pause(request: Request, service: E2BService) -> Response:
    await service.sandboxes.pause(request.path_params["id"], principal_of(request))
    return Response(status_code=204)


async def metrics(request: Request, service: E2BService) -> Response:
    """E2B's `SandboxMetric` list from `start` to `end` (Unix seconds), oldest first."""
    sandbox = service.sandboxes.get(request.path_params["id"], principal_of(request))
    session = service.sandboxes.session(sandbox)
    try:
        bounds = [query_seconds(request, name) for name in ("start", "end")]
    except GatewayError as exc:  # E2B's error shape, and the 400 its SDKs expect
        raise SandboxError(400, exc.message) from None
    found = await service.usage.samples(session, *bounds)
    return JSONResponse([metric_json(s) for s in found])


async def all_metrics(request: Request, service: E2BService) -> Response:
    """`?sandbox_ids=a,b`: each one's latest `SandboxMetric` (those with none left out)."""
    wanted = [i for i in (request.query_params.get("sandbox_ids") or "").split(",") if i]
    if not wanted or len(wanted) > 100:
        raise SandboxError(400, "'sandbox_ids' must name 1 to 100 sandboxes")
    out: dict[str, Any] = {}
    for sandbox_id in dict.fromkeys(wanted):
        try:
            sandbox = service.sandboxes.get(sandbox_id, principal_of(request))
            session = service.sandboxes.session(sandbox)
        except SandboxError:
            continue
        found = await service.usage.samples(session)
        if found:
            out[sandbox_id] = metric_json(found[-1])
    return JSONResponse({"sandboxes": out})


def metric_json(sample: Sample) -> dict[str, Any]:
    """E2B's `SandboxMetric`."""
    shown = sample.to_json()
    return {
        "timestamp": shown["timestamp"],
        "timestampUnix": sample.at,
        "cpuCount": sample.cpu_count,
        "cpuUsedPct": sample.cpu_used_pct,
        "memUsed": sample.mem_used,
        "memTotal": sample.mem_total,
        "memCache": sample.mem_cache,
        "diskUsed": sample.disk_used,
        "diskTotal": sample.disk_total,
    }


async def list_sandboxes(request: Request, service: E2BService) -> Response:
    """E2B's listing: `metadata` (`k=v&...`, each URL-encoded), `state` (comma-separated),
    `template` (an id or alias), `startedAfter` (RFC 3339, inclusive), `order` (by start
    time: `desc`, the default, newest first, or `asc`), paged by `limit` and `nextToken`
    (the id that starts the next page, `X-Next-Token`); `X-Total-Running` counts them all."""
    from urllib.parse import parse_qsl, unquote

    query = request.query_params
    states = {s for s in (query.get("state") or "").split(",") if s}
    wanted_metadata = {unquote(k): unquote(v) for k, v in parse_qsl(query.get("metadata") or "")}
    template = query.get("template")
    after = _moment(query.get("startedAfter"), "startedAfter")
    order = query.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise SandboxError(400, "'order' must be asc or desc")
    everyone = list(service.sandboxes.visible(principal_of(request)))
    found = [
        s
        for s in everyone
        if (not states or s.state in states)
        and all(s.metadata.get(k) == v for k, v in wanted_metadata.items())
        and (template is None or template in (s.template, s.alias))
        and (after is None or s.started_at >= after)
    ]
    found.sort(key=lambda s: (s.started_at, s.id), reverse=order == "desc")
    try:
        limit = int(query.get("limit") or 100)
    except ValueError:
        raise SandboxError(400, "'limit' must be a number") from None
    if not 1 <= limit <= 100:
        raise SandboxError(400, "'limit' must be between 1 and 100")
    start = 0
    token = query.get("nextToken")
    if token:
        ids = [s.id for s in found]
        if token not in ids:
            raise SandboxError(400, "'nextToken' does not name a sandbox of this listing")
        start = ids.index(token)
    page = found[start : start + limit]
    headers = {"X-Total-Running": str(sum(1 for s in everyone if s.state == "running"))}
    if start + limit < len(found):
        headers["X-Next-Token"] = found[start + limit].id
    return JSONResponse([detail_json(s, service.settings) for s in page], headers=headers)


def _moment(value: str | None, name: str) -> datetime | None:
    """An RFC 3339 time (`Z` or an offset; one without is taken as UTC)."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SandboxError(400, f"'{name}' must be an RFC 3339 time") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


async def unsupported(request: Request, service: E2BService) -> Response:
    return e2b_error(
        501, f"{request.method} {request.url.path} is not supported by this gateway's E2B API"
    )
