"""All configuration, read once from `KG_*` variables and CLI flags into one frozen object.

Every flag has an environment twin: `--pool-size 4` and `KG_POOL_SIZE=4` mean the
same; a flag wins over the variable. Nothing else in the package reads `os.environ`.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import math
import os
import re
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from kernel_gateway.in_proxy.policy import BadPattern, normalize, outside
from kernel_gateway.logs import LogFormat

BackendName = Literal["auto", "docker", "local"]
McpMode = Literal["sessions", "stateless", "off"]
StatelessMode = Literal["auto", "fork", "container"]
DEFAULT_IMAGE = "kernel-gateway-kernel:latest"
DEFAULT_GATEWAY_IMAGE = "kernel-gateway:latest"  # the gateway itself, for cluster mode
LANGUAGE_NAME = re.compile(r"[a-z][a-z0-9_+-]{0,31}")
# A node's name in a cluster: it prefixes the ids of the sessions made there (`<node>.<hex>`).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
FIGURE_FORMATS = frozenset({"png", "retina", "jpeg", "svg", "pdf"})
MIN_MEMORY_LIMIT = 6 * 1024**2  # Docker refuses a smaller --memory
# Smallest allowed value of each integer setting.
INT_MINIMUMS = {
    "pool_size": 0,
    "fork_servers": 1,
    "fork_server_requests": 1,
    "restart_budget": 0,
    "max_file_events": 0,
    "max_inline_file_bytes": 0,
    "max_sessions": 1,
    "max_stateless": 0,
    "max_concurrent_starts": 1,
    "max_queued_executions": 1,
    "max_output_bytes": 1,
    "max_display_bytes": 1,
    "max_body_bytes": 1,
    "max_stateless_body_bytes": 1,
    "max_upload_bytes": 1,
    "pids_limit": 1,
    "replay_executions": 1,
    "replay_bytes": 0,
}
# Seconds (and CPUs) that must be finite and > 0.
POSITIVE_NUMBERS = (
    "exec_timeout",
    "max_exec_timeout",
    "idle_timeout",
    "interrupt_grace",
    "kernel_start_timeout",
    "restart_window",
    "cpu_limit",
    "drain_timeout",
    "hibernated_ttl",
)


ROOT_RUNTIME_DIR = Path("/var/lib/kernel-gateway")


def _patterns(text: str, name: str) -> list[str]:
    try:
        return [normalize(p) for p in text.split(",") if p.strip()]
    except BadPattern as exc:
        raise ValueError(f"{_origin(name)}: {exc}") from None


def default_runtime_dir(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """Where a gateway keeps connection files and session disks unless told otherwise.

    - root: `/var/lib/kernel-gateway`, on disk. Session disks (sparse images) live
      here, and on a tmpfs such as `/run/user/0` they would be memory again; it is
      also a stable place for a later gateway to find what an earlier one left.
    - anyone else: `$XDG_RUNTIME_DIR/kernel-gateway` when that is an absolute path to
      a folder this user owns (`sudo` may keep the invoking user's), else
      `<tmp>/kernel-gateway-<uid>`. Without root, storage is plain folders anyway.

    Either way `RuntimeDir` checks the folder's owner and mode at startup.
    """
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return ROOT_RUNTIME_DIR
    xdg = (environ or {}).get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg):
        try:
            info = os.stat(xdg)
        except OSError:
            pass
        else:
            if stat.S_ISDIR(info.st_mode) and info.st_uid == euid:
                return Path(xdg) / "kernel-gateway"
    return Path(tempfile.gettempdir()) / f"kernel-gateway-{euid}"


FORKED_STATELESS_LIMIT = 64
"""`--max-stateless` by default for forked requests: one waiting for a fork server holds
nothing, and 64 at about 100 requests/s on 2 cores wait at most about 0.6 s."""
CONTAINER_STATELESS_LIMIT = 16
"""`--max-stateless` by default for a request that gets a container of its own (no fork
servers, another language, a network policy): each holds a kernel container, so it is let
in only while fewer than this many stateless requests run."""


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8888
    backend: BackendName = "auto"
    pool_size: int = 2
    max_sessions: int = 32
    max_stateless: int = 0
    """0: by how stateless requests are served (`stateless_limit`)."""
    stateless_mode: StatelessMode = "auto"
    fork_servers: int = 4
    fork_server_requests: int = 5000
    token: str | None = None
    token_file: Path | None = None
    no_auth: bool = False
    image: str = DEFAULT_IMAGE
    languages: str = "auto"
    language_images: str = ""
    language_pool: str = ""
    egress_allow: str = ""
    egress_default: str = ""
    egress_networks: str = "bridge"
    egress_image: str = ""
    exec_timeout: float = 60.0
    max_exec_timeout: float = 3600.0
    idle_timeout: float = 1200.0
    hibernate_after: float = 0.0
    hibernated_ttl: float = 7 * 24 * 3600.0
    interrupt_grace: float = 1.5
    kernel_start_timeout: float = 30.0
    max_concurrent_starts: int = 4
    max_queued_executions: int = 16
    max_output_bytes: int = 1024 * 1024
    max_display_bytes: int = 16 * 1024 * 1024
    max_body_bytes: int = 2 * 1024 * 1024
    max_stateless_body_bytes: int = 32 * 1024 * 1024
    max_upload_bytes: int = 100 * 1024 * 1024
    max_inline_file_bytes: int = 5 * 1024 * 1024
    max_file_events: int = 100
    figure_formats: str = "png"
    figure_dpi: int = 100
    preload: str = "numpy,pandas,matplotlib"
    fork_light_preload: str = "numpy,matplotlib"
    memory_limit: str = "1g"
    cpu_limit: float = 1.0
    pids_limit: int = 256
    network: str = "none"
    runtime: str | None = None
    workspace_size: str = "1g"
    restart_budget: int = 5
    restart_window: float = 300.0
    reconnect_grace: float = 10.0
    replay_executions: int = 20
    replay_bytes: int = 16 * 1024 * 1024
    persist_sessions: bool = False
    drain_timeout: float = 30.0
    adopt_wait: float = 0.0
    runtime_dir: Path = field(default_factory=default_runtime_dir)
    log_level: str = "info"
    log_format: LogFormat = "text"
    mcp: McpMode = "sessions"
    node_name: str | None = None

    def __post_init__(self) -> None:
        """Refuse, at startup, any value that would only fail later (at every launch)."""
        if self.backend not in get_args(BackendName):
            raise ValueError(
                f"{_origin('backend')}: must be one of auto, docker, local (got {self.backend!r})"
            )
        for name in ("memory_limit", "workspace_size"):
            try:
                parse_size(getattr(self, name))
            except ValueError as exc:
                raise ValueError(f"{_origin(name)}: {exc}") from None
        if self.mcp not in get_args(McpMode):
            raise ValueError(
                f"{_origin('mcp')}: must be one of sessions, stateless, off (got {self.mcp!r})"
            )
        if self.stateless_mode not in get_args(StatelessMode):
            raise ValueError(
                f"{_origin('stateless_mode')}: must be one of auto, fork, container "
                f"(got {self.stateless_mode!r})"
            )
        if self.memory_limit_bytes < MIN_MEMORY_LIMIT:
            raise ValueError(
                f"{_origin('memory_limit')}: {self.memory_limit!r} is below Docker's minimum "
                "of 6 MiB (and far below what a kernel needs; the default is 1g)"
            )
        for name, low in INT_MINIMUMS.items():
            if getattr(self, name) < low:
                raise ValueError(f"{_origin(name)}: must be >= {low} (got {getattr(self, name)})")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"{_origin('port')}: must be between 0 and 65535 (got {self.port})")
        for name in POSITIVE_NUMBERS:
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{_origin(name)}: must be a finite number > 0 (got {value})")
        if not (math.isfinite(self.adopt_wait) and self.adopt_wait >= 0):
            raise ValueError(f"{_origin('adopt_wait')}: must be a finite number >= 0")
        if not (math.isfinite(self.reconnect_grace) and self.reconnect_grace >= 0):
            raise ValueError(f"{_origin('reconnect_grace')}: must be a finite number >= 0")
        if not math.isfinite(self.hibernate_after) or self.hibernate_after < 0:
            raise ValueError(
                f"{_origin('hibernate_after')}: must be a finite number >= 0 (0: never)"
            )
        if self.persist_sessions and self.backend == "local":
            raise ValueError(
                f"{_origin('persist_sessions')}: sessions can outlive the gateway only on the "
                "docker backend (a local kernel is the gateway's child process)"
            )
        if self.cpu_limit < 0.01:
            raise ValueError(f"{_origin('cpu_limit')}: must be at least 0.01 (Docker's minimum)")
        if self.exec_timeout > self.max_exec_timeout:
            raise ValueError(
                f"{_origin('exec_timeout')}: {self.exec_timeout} s is above the largest "
                f"timeout a request may ask for, {_origin('max_exec_timeout')} "
                f"({self.max_exec_timeout} s)"
            )
        unknown = set(self.figure_format_list) - FIGURE_FORMATS
        if unknown or not self.figure_format_list:
            raise ValueError(
                f"{_origin('figure_formats')}: must list some of "
                f"{', '.join(sorted(FIGURE_FORMATS))} (got {self.figure_formats!r})"
            )
        light = [m.strip() for m in self.fork_light_preload.split(",") if m.strip()]
        for name, modules in (("preload", self.preload_list), ("fork_light_preload", light)):
            for module in modules:
                if not all(part.isidentifier() for part in module.split(".")):
                    raise ValueError(f"{_origin(name)}: {module!r} is not a module name")
        if self.log_format not in get_args(LogFormat):
            raise ValueError(f"{_origin('log_format')}: must be text or json")
        if not 10 <= self.figure_dpi <= 600:
            raise ValueError(f"{_origin('figure_dpi')}: must be between 10 and 600")
        for name in self.language_list or ():
            if not LANGUAGE_NAME.fullmatch(name):
                raise ValueError(f"{_origin('languages')}: {name!r} is not a language name")
        self.language_pool_sizes  # noqa: B018 - raises ValueError when malformed
        self.egress_default_list  # noqa: B018 - raises ValueError when malformed or too wide
        if self.egress_ceiling and self.backend == "local":
            raise ValueError(
                f"{_origin('egress_allow')}: network policies need the docker backend (the "
                "local backend's kernels cannot be kept from the network)"
            )
        if self.egress_ceiling and self.network != "none":
            raise ValueError(
                f"{_origin('egress_allow')} needs {_origin('network')} none: kernels with a "
                f"network of their own ({self.network}) would not need the proxy"
            )
        if self.node_name is not None and not NODE_NAME.fullmatch(self.node_name):
            raise ValueError(
                f"{_origin('node_name')}: 1-63 letters, digits, '-' or '_', starting with a "
                f"letter or digit (got {self.node_name!r})"
            )

    @property
    def memory_limit_bytes(self) -> int:
        """`memory_limit` in bytes (validated at startup, so this never raises)."""
        return parse_size(self.memory_limit)

    @property
    def workspace_size_bytes(self) -> int:
        """`workspace_size` in bytes (validated at startup, so this never raises)."""
        return parse_size(self.workspace_size)

    def stateless_limit(self, forked: bool) -> int:
        """`--max-stateless`, or its default for the way stateless requests are served."""
        if self.max_stateless:
            return self.max_stateless
        return FORKED_STATELESS_LIMIT if forked else CONTAINER_STATELESS_LIMIT

    @property
    def preload_list(self) -> list[str]:
        return [m.strip() for m in self.preload.split(",") if m.strip()]

    @property
    def fork_light_preload_list(self) -> list[str]:
        """The light template's part of `--preload` (in the order of `--preload`); empty
        when there is no light template (no list given, or it names all of them)."""
        light = {m.strip() for m in self.fork_light_preload.split(",") if m.strip()}
        chosen = [m for m in self.preload_list if m in light]
        return [] if not light or chosen == self.preload_list else chosen

    @property
    def language_list(self) -> list[str] | None:
        """The languages asked for by name, or None for `auto` (every one found)."""
        if self.languages.strip() in ("", "auto"):
            return None
        names = [n.strip().lower() for n in self.languages.split(",") if n.strip()]
        return names if "python" in names else ["python", *names]

    @property
    def language_image_list(self) -> list[str]:
        return [i.strip() for i in self.language_images.split(",") if i.strip()]

    @property
    def egress_ceiling(self) -> list[str]:
        """The domain patterns sessions may be allowed (`--egress-allow`): none by default."""
        return _patterns(self.egress_allow, "egress_allow")

    @property
    def egress_default_list(self) -> list[str]:
        """The allowlist of a session that names none (`--egress-default`), within the
        ceiling."""
        patterns = _patterns(self.egress_default, "egress_default")
        wide = outside(self.egress_ceiling, patterns)
        if wide:
            raise ValueError(
                f"{_origin('egress_default')}: {', '.join(wide)} not within "
                f"{_origin('egress_allow')} ({self.egress_allow or 'empty'})"
            )
        return patterns

    @property
    def egress_network_list(self) -> list[str]:
        """The Docker networks the egress proxy joins (the first is its own)."""
        return [n.strip() for n in self.egress_networks.split(",") if n.strip()] or ["bridge"]

    @property
    def language_pool_sizes(self) -> dict[str, int]:
        """Warm kernels per language other than Python (`--language-pool r=1,bash=2`)."""
        sizes: dict[str, int] = {}
        for item in self.language_pool.split(","):
            if not item.strip():
                continue
            name, sep, count = item.partition("=")
            name = name.strip().lower()
            if not sep or not LANGUAGE_NAME.fullmatch(name) or not count.strip().isdigit():
                raise ValueError(
                    f"{_origin('language_pool')}: expected LANGUAGE=COUNT[,...] such as "
                    f"r=1,javascript=2 (got {item.strip()!r})"
                )
            sizes[name] = int(count)
        if "python" in sizes:
            raise ValueError(
                f"{_origin('language_pool')}: Python's warm kernels are set by "
                f"{_origin('pool_size')}"
            )
        return sizes

    @property
    def figure_format_list(self) -> list[str]:
        return [f.strip() for f in self.figure_formats.split(",") if f.strip()]

    @property
    def auth_required(self) -> bool:
        return self.token is not None

    def check_exposure(self) -> None:
        check_exposure(self.host, self.token, self.no_auth)


def check_exposure(host: str, token: str | None, no_auth: bool) -> None:
    """Refuse to serve code execution (a gateway, or a router in front of gateways) to a
    network without a token, unless told to."""
    if token or no_auth or is_loopback(host):
        return
    raise ValueError(
        f"refusing to listen on {host} without a token: code execution would be open to the "
        "network. Pass --token or --token-file (KG_TOKEN, KG_TOKEN_FILE), or --no-auth if "
        "you really mean it."
    )


def parse_size(text: str) -> int:
    """Bytes from a size: plain bytes, or 512m, 1g, 1G, 1GiB, 1gb, 1024k (binary units)."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
    raw = text
    text = text.strip().lower()
    for suffix in ("ib", "b"):
        if text.endswith(suffix) and text[: -len(suffix)][-1:] in units:
            text = text.removesuffix(suffix)
            break
    try:
        if text and text[-1] in units:
            value = float(text[:-1]) * units[text[-1]]
        else:
            value = float(text.removesuffix("b"))
    except ValueError:
        raise ValueError(f"{raw!r} is not a size (examples: 512m, 1g, 1GiB, 1048576)") from None
    if not (value >= 1 and math.isfinite(value)):
        raise ValueError(f"{raw!r} is not a positive size")
    return int(value)


def _origin(name: str) -> str:
    """How a user sets a field, for error messages: `--memory-limit (KG_MEMORY_LIMIT)`."""
    variable = f"KG_{name.upper()}"
    return f"--{name.replace('_', '-')} ({variable})" if name in _flag_names() else variable


@functools.cache
def _flag_names() -> frozenset[str]:
    parser = argparse.ArgumentParser(add_help=False)
    add_serve_arguments(parser)
    return frozenset(action.dest for action in parser._actions)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def convert(kind: str, raw: str) -> Any:
    """A `KG_*` variable's text as a value of a settings field's type (its annotation)."""
    if kind == "bool":
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"must be a boolean (got {raw!r})")
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    if kind == "Path":
        return Path(raw)
    if kind == "str | None":
        return raw or None
    if kind == "Path | None":
        return Path(raw) if raw else None
    return raw


def env_values(settings_class: Any, environ: Mapping[str, str]) -> dict[str, Any]:
    """The fields of a settings dataclass that `KG_*` variables set, converted."""
    values: dict[str, Any] = {}
    for f in fields(settings_class):
        raw = environ.get(f"KG_{f.name.upper()}")
        if raw is not None:
            try:
                values[f.name] = convert(str(f.type), raw)
            except ValueError as exc:
                raise ValueError(f"KG_{f.name.upper()}: {exc}") from None
    return values


def read_token_file(path: Path) -> str:
    """The token kept in a file (a Docker or Kubernetes secret): its first line, stripped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the token file {path}: {exc}") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token


def resolve_token(values: dict[str, Any]) -> None:
    """`token_file` read into `token` (both given is a mistake: which one is meant?)."""
    if values.get("token_file") is None:
        return
    if values.get("token"):
        raise ValueError(
            "--token (KG_TOKEN) and --token-file (KG_TOKEN_FILE) are both set; give one"
        )
    values["token"] = read_token_file(values["token_file"])


def from_env(environ: Mapping[str, str], **overrides: Any) -> Settings:
    """Settings from `KG_*` variables, with explicit overrides (CLI flags) on top."""
    values = env_values(Settings, environ)
    values.update({k: v for k, v in overrides.items() if v is not None})
    resolve_token(values)
    if "runtime_dir" not in values:
        values["runtime_dir"] = default_runtime_dir(environ)
    return Settings(**values)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags for `serve`; each defaults to None so the KG_* twin can fill it."""
    add = parser.add_argument
    add("--host", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, help="port to listen on (default 8888)")
    add("--backend", choices=get_args(BackendName), help="where kernels run (default auto)")
    add("--pool-size", type=int, help="warm kernels kept ready (default 2)")
    add("--max-sessions", type=int, help="most sessions at once (default 32)")
    add(
        "--max-stateless",
        type=int,
        help="most stateless executions at once, running or waiting (default: "
        f"{FORKED_STATELESS_LIMIT} with fork servers, {CONTAINER_STATELESS_LIMIT} with a "
        "container each)",
    )
    add(
        "--stateless-mode",
        choices=get_args(StatelessMode),
        help="how POST /execute gets a kernel: 'fork' (a fork of a preloaded fork server per "
        "request, docker backend with a root gateway), 'container' (a fresh warm container "
        "per request), 'auto' (fork where it can; the default)",
    )
    add(
        "--fork-servers",
        type=int,
        help="fork-server containers kept for stateless requests (default 4)",
    )
    add(
        "--fork-light-preload",
        help="the part of --preload in the fork servers' light template: a stateless cell "
        "whose imports are all standard or of these is forked from it, cheaper than from the "
        "full one (default numpy,matplotlib; empty for one template)",
    )
    add(
        "--fork-server-requests",
        type=int,
        help="requests one fork-server container serves before it is replaced (default 5000)",
    )
    add("--token", help="require 'Authorization: Bearer TOKEN' on every route but /health")
    add(
        "--token-file",
        type=Path,
        help="read the token from this file's first line (a Docker secret: "
        "/run/secrets/<name>); instead of --token",
    )
    add(
        "--no-auth",
        action="store_const",
        const=True,
        help="allow a non-loopback host without a token",
    )
    add("--image", help=f"kernel image for the docker backend (default {DEFAULT_IMAGE})")
    add(
        "--languages",
        help="languages to serve, comma-separated (python is always served), or auto: "
        "python and every language whose image exists (default auto)",
    )
    add(
        "--language-images",
        help="more kernel images to take languages from (each holds "
        "/opt/kernel/kernelspecs/<language>/kernel.json), comma-separated; they win over "
        "the images build-image makes",
    )
    add(
        "--language-pool",
        help="warm kernels per language other than python, e.g. r=1,javascript=1 (default "
        "none: those start on demand)",
    )
    add(
        "--egress-allow",
        help="domain patterns sessions may be allowed to reach through the egress proxy, "
        "e.g. pypi.org,*.pythonhosted.org (default none: no session reaches any network)",
    )
    add(
        "--egress-default",
        help="the allowlist of a session that asks for none, within --egress-allow (default none)",
    )
    add(
        "--egress-networks",
        help="Docker networks the egress proxy joins, comma-separated (default bridge: "
        "the host's way out)",
    )
    add(
        "--egress-image",
        help="the egress proxy's image (default the kernel image's name with -egress)",
    )
    add("--exec-timeout", type=float, help="default execution timeout, seconds (default 60)")
    add(
        "--idle-timeout",
        type=float,
        help="idle session lifetime, seconds (default 1200); with --hibernate-after, "
        "sessions are hibernated instead",
    )
    add(
        "--hibernate-after",
        type=float,
        help="seconds idle before a session is saved to disk and its kernel stopped "
        "(default 0: never); it resumes by itself on its next call",
    )
    add(
        "--hibernated-ttl",
        type=float,
        help="seconds a hibernated session is kept before it is deleted with its files "
        "(default 604800: 7 days)",
    )
    add("--memory-limit", help="memory per kernel, e.g. 512m, 1g, 1GiB (default 1g)")
    add("--cpu-limit", type=float, help="CPUs per kernel container (default 1.0)")
    add("--pids-limit", type=int, help="processes per kernel container (default 256)")
    add(
        "--network",
        help="Docker network for kernels (default none: no network at all; e.g. bridge to "
        "let code reach the internet, for pip)",
    )
    add("--runtime", help="OCI runtime for kernel containers, e.g. runsc for gVisor")
    add(
        "--workspace-size",
        help="size cap of each session's working directory, e.g. 512m, 1g, 1GiB (default 1g)",
    )
    add(
        "--restart-budget",
        type=int,
        help="kernel deaths a session may have within --restart-window before it is failed (5)",
    )
    add("--restart-window", type=float, help="seconds the restart budget counts over (300)")
    add(
        "--reconnect-grace",
        type=float,
        help="seconds a cell keeps running after its client disconnected, waiting for it to "
        "resume the stream, before it is interrupted (default 10; 0: interrupt at once)",
    )
    add(
        "--replay-executions",
        type=int,
        help="finished executions whose events each session keeps for resuming (default 20)",
    )
    add(
        "--replay-bytes",
        type=int,
        help="bytes of finished executions' events each session keeps (default 16 MiB)",
    )
    add(
        "--persist-sessions",
        action="store_const",
        const=True,
        help="leave sessions' kernels running when the gateway stops (and after a crash), for "
        "the next gateway on this runtime dir to adopt (docker backend; default off)",
    )
    add(
        "--drain-timeout",
        type=float,
        help="with --persist-sessions: seconds a stopping gateway lets running cells finish "
        "before it exits, leaving them to run on (default 30)",
    )
    add(
        "--adopt-wait",
        type=float,
        help="with --persist-sessions: at startup, wait up to this many seconds for a gateway "
        "still running on the same runtime dir to stop, then adopt its sessions (start-first "
        "rolling updates; default 0: start beside it)",
    )
    add("--figure-formats", help="inline chart formats, e.g. png or png,svg (default png)")
    add("--figure-dpi", type=int, help="inline chart resolution (default 100)")
    add(
        "--preload",
        help="modules imported into pooled kernels before hand-out, comma-separated "
        "(default numpy,pandas,matplotlib; empty for none)",
    )
    add("--max-upload-bytes", type=int, help="largest file upload (default 100 MiB)")
    add(
        "--runtime-dir",
        type=Path,
        help="where connection files and workspaces live, a folder only this user may use "
        "(default /var/lib/kernel-gateway as root; else $XDG_RUNTIME_DIR/kernel-gateway, "
        "else $TMPDIR/kernel-gateway-<uid>)",
    )
    add("--log-level", choices=["debug", "info", "warning", "error"], help="(default info)")
    add(
        "--log-format",
        choices=get_args(LogFormat),
        help="text, or json: one JSON object per line with request, session and execution "
        "ids (default text)",
    )
    add(
        "--mcp",
        choices=get_args(McpMode),
        help="the MCP endpoint at /mcp: sessions (each MCP session keeps its own kernel), "
        "stateless (every run_python call gets a fresh kernel), or off (default sessions)",
    )
    add(
        "--node-name",
        help="this gateway's node in a cluster (kernel-gateway route): session ids start "
        "with it, '<node>.<hex>', so a router finds a session's node from its id",
    )


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    names = {f.name for f in fields(Settings)}
    return from_env(environ, **{k: v for k, v in vars(args).items() if k in names})


def describe(settings: Settings) -> Sequence[str]:
    """Settings as log lines, with the token masked."""
    out = []
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.name == "token" and value:
            value = "***"
        out.append(f"{f.name}={value}")
    return out
