"""The gateway's settings (`kernel-gateway serve`): each declared once, below.

A declaration gives the flag, the variable, the help, the page's text, the bounds and
the default (see `declare`); `__post_init__` adds the rules that tie fields together.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from kernel_gateway.in_proxy.policy import outside
from kernel_gateway.logs import LogFormat
from kernel_gateway.settings import values
from kernel_gateway.settings.declare import (
    add_arguments,
    check_fields,
    env_values,
    flag_values,
    origin,
    setting,
)
from kernel_gateway.settings.runtime_dir import default_runtime_dir

BackendName = Literal["auto", "docker", "local"]
McpMode = Literal["sessions", "stateless", "off"]
StatelessMode = Literal["auto", "fork", "container"]
DEFAULT_IMAGE = "kernel-gateway-kernel:latest"
DEFAULT_GATEWAY_IMAGE = "kernel-gateway:latest"  # the gateway itself, for cluster mode
FORKED_STATELESS_LIMIT = 64
"""`--max-stateless` by default for forked requests: one waiting for a fork server holds
nothing, and 64 at about 100 requests/s on 2 cores wait at most about 0.6 s."""
CONTAINER_STATELESS_LIMIT = 16
"""`--max-stateless` by default for a request that gets a container of its own (no fork
servers, another language, a network policy): each holds a kernel container, so it is let
in only while fewer than this many stateless requests run."""


@dataclass(frozen=True)
class Settings:
    # -- listening ---------------------------------------------------------------------
    host: str = setting(
        "127.0.0.1",
        "address to listen on",
        doc="address to listen on; a non-loopback address needs `--token` or `--no-auth`",
    )
    port: int = setting(8888, "port to listen on", minimum=0, maximum=65535)
    backend: BackendName = setting(
        "auto",
        "where kernels run",
        doc="`docker`, `local`, or `auto`: docker when an engine answers and the image "
        "exists, else local",
        choices=get_args(BackendName),
    )
    # -- how many ----------------------------------------------------------------------
    pool_size: int = setting(2, "warm kernels kept ready", minimum=0)
    max_sessions: int = setting(
        32,
        "most sessions at once",
        doc="running sessions at once (hibernated ones do not count); beyond it "
        "`POST /sessions` gets 429",
        minimum=1,
    )
    max_stateless: int = setting(
        0,
        "most stateless executions at once, running or waiting (0: by how they are served)",
        doc="stateless executions at once (running or waiting for a fork server); beyond it "
        "`POST /execute` gets 429. A request waiting for a fork server holds nothing "
        f"({FORKED_STATELESS_LIMIT} wait at most about 0.6 s on 2 cores); one that gets a "
        "container of its own (no fork servers, another language, a network policy) holds "
        f"it, so by default it is let in only while fewer than {CONTAINER_STATELESS_LIMIT} "
        "run",
        default_doc=f"`{FORKED_STATELESS_LIMIT}` for forked requests, "
        f"`{CONTAINER_STATELESS_LIMIT}` for one that gets a container of its own",
        minimum=0,
    )
    stateless_mode: StatelessMode = setting(
        "auto",
        "how POST /execute gets a kernel: 'fork' (a fork of a preloaded fork server per "
        "request, docker backend with a root gateway), 'container' (a fresh warm container "
        "per request), 'auto' (fork where it can)",
        doc="how `POST /execute` gets its kernel: `fork` (forked from a preloaded fork "
        "server; docker backend, root gateway), `container` (a fresh warm container per "
        "request, the earlier design), `auto` (fork where it can, else container) — see "
        "[Stateless execution](stateless.md)",
        choices=get_args(StatelessMode),
    )
    fork_servers: int = setting(
        4,
        "fork-server containers kept for stateless requests",
        doc="fork-server containers kept for stateless requests (each serves one request at "
        "a time; about 150 MiB each). On 2 cores, 2 to 8 servers all reach the same "
        "throughput (the CPU is the limit); 4 leave room for requests that run longer than "
        "a few milliseconds. A request that waits 0.5 s for a server gets one started for "
        "it, let go after 30 s idle",
        minimum=1,
    )
    fork_server_cpu_shares: int = setting(
        64,
        "CPU weight of a fork-server container against a session kernel's 1024",
        doc="CPU weight of each fork-server container against a session kernel's (Docker's "
        "1024): it matters only when the CPU is busy, and then stateless executions yield "
        "to sessions' cells, so one API key's stateless flood moves another key's session "
        "little (see [Performance](performance.md)); 1024 weighs them alike",
        minimum=2,
        maximum=262144,
    )
    fork_light_preload: str = setting(
        "numpy,matplotlib",
        "the part of --preload in the fork servers' light template: a stateless cell whose "
        "imports are all standard or of these is forked from it, cheaper than from the full "
        "one (empty for one template)",
        doc="the part of `--preload` in each fork server's **light template**: a stateless "
        "cell whose imports (as its text shows them) are all standard or of these is forked "
        "from it instead of from the full template (all of `--preload`), about 1.2× cheaper "
        "a request with the default preload; a wrong guess costs time, never a result. "
        "Empty, or naming all of `--preload`: one template — see "
        "[Stateless execution](stateless.md)",
        check=values.module_names,
    )
    fork_server_requests: int = setting(
        5000,
        "requests one fork-server container serves before it is replaced",
        doc="requests a fork-server container serves before it is replaced by a fresh one. "
        "The per-request cleanup is what separates two requests; the replacement bounds how "
        "long anything it could miss stays (at full load on 2 cores a container lives about "
        "two minutes). A replacement costs about 1.5 s of CPU: at 1000 that was 13-23% of "
        "sustained stateless throughput (c8 168 against 194 requests/s without "
        "replacements, same machine and hour), at 5000 about 3%",
        minimum=1,
    )
    # -- who may call ------------------------------------------------------------------
    token: str | None = setting(
        None,
        "require 'Authorization: Bearer TOKEN' on every route but /health",
        doc="require `Authorization: Bearer <token>` on every route except `GET /health`",
    )
    token_file: Path | None = setting(
        None,
        "read the token from this file's first line (a Docker secret: /run/secrets/<name>); "
        "instead of --token",
        doc="read the token from a file's first line instead (a Docker secret, "
        "`/run/secrets/<name>`); giving both is an error",
    )
    no_auth: bool = setting(
        False,
        "allow a non-loopback host without a token",
        doc="allow a non-loopback `--host` without a token",
    )
    # -- kernels: images and languages -------------------------------------------------
    image: str = setting(
        DEFAULT_IMAGE,
        "kernel image for the docker backend",
        doc="kernel image (docker backend): Python's; the other languages' images are named "
        "after it (`…-r`, `…-deno`, `…-bash`, `…-java`; see [Languages](languages.md))",
    )
    languages: str = setting(
        "auto",
        "languages to serve, comma-separated (python is always served), or auto: python and "
        "every language whose image exists",
        doc="languages to serve, comma-separated (`python` always is): `auto` serves Python "
        "and every language whose image exists; naming one whose image is missing stops "
        "`serve` with a message saying how to build it",
        check=values.language_names,
    )
    language_images: str = setting(
        "",
        "more kernel images to take languages from (each holds "
        "/opt/kernel/kernelspecs/<language>/kernel.json), comma-separated; they win over the "
        "images build-image makes",
        doc="more kernel images to take languages from, comma-separated; each holds "
        "`/opt/kernel/kernelspecs/<language>/kernel.json` (a Jupyter kernelspec). They win "
        "over the images `build-image` makes",
    )
    language_pool: str = setting(
        "",
        "warm kernels per language other than python, e.g. r=1,javascript=1 (none: those "
        "start on demand)",
        doc="warm kernels per language other than Python, e.g. `r=1,javascript=2`; without "
        "it those languages' kernels start when asked for (0.6-2.6 s: "
        "[Performance](performance.md#languages)). Each language's pool starts up to "
        "`--max-concurrent-starts` (4) kernels at once, on its own",
        check=values.language_pool,
    )
    # -- templates ---------------------------------------------------------------------
    max_templates: int = setting(
        50,
        "most templates this gateway keeps",
        doc="templates kept at once (each with its builds); beyond it `POST /templates` "
        "gets 429 until one is deleted",
        minimum=0,
    )
    template_max_size: str = setting(
        "8g",
        "size cap of one template's image, e.g. 4g",
        doc="a template image over this size fails its build (and is removed)",
        check=values.parse_size,
    )
    template_build_timeout: float = setting(
        1800.0,
        "seconds one template build may take, all steps together",
        doc="time a build may take, its steps and its readiness check together; past it "
        "the running step is killed and the build fails",
        positive=True,
    )
    template_pool_idle: float = setting(
        600.0,
        "seconds a template may go unused before its warm kernels are stopped",
        doc="a template in use keeps as many kernels warm as were asked of it in the last "
        "minute, at least one (within `--pool-size` for all templates); unused this long, "
        "it keeps none",
        positive=True,
    )
    template_pip: str = setting(
        "host",
        "where a template's `pip install` steps fetch wheels: host or container",
        doc="`host`: the gateway's host downloads the wheels (`pip download`, for the image's "
        "Python) and the step installs them with no index, for when containers cannot reach "
        "the index; `container`: the step runs as written",
        choices=("host", "container"),
    )
    template_upload_max: str = setting(
        "1g",
        "size cap of one uploaded file archive of a template's COPY step",
        doc="largest file archive a COPY step may upload (E2B's `copy`, or the files of "
        "`POST /templates`)",
        check=values.parse_size,
    )
    builtin_templates: str = setting(
        "",
        "shipped templates to build at startup, comma-separated, e.g. python-classic",
        doc="shipped templates to build at startup, in the background, comma-separated "
        "(`python-classic`: pandas 1.5, NumPy 1.26 on Python 3.11); one built already is "
        "kept, one whose base image is missing is logged and skipped "
        "([Templates](templates.md#classic-stack)). Docker backend",
        check=values.items,
    )
    # -- the network -------------------------------------------------------------------
    egress_allow: str = setting(
        "",
        "domain patterns sessions may be allowed to reach through the egress proxy, e.g. "
        "pypi.org,*.pythonhosted.org (none: no session reaches any network)",
        doc="domain patterns sessions may be allowed to reach, comma-separated "
        "(`pypi.org,*.example.org`): the ceiling of every session's `network.allow`; a "
        "pattern outside it gets 403 `network_not_allowed`. Empty: no session can reach any "
        "network and no proxy runs. Needs the docker backend and `--network none` "
        "([Network](network.md))",
        check=values.domain_patterns,
    )
    build_egress_allow: str = setting(
        "",
        "domain patterns template builds' RUN steps may reach through the egress proxy, "
        "e.g. pypi.org,files.pythonhosted.org,deb.debian.org (none: builds have no network)",
        doc="domain patterns a template build's `RUN` steps may reach through the egress "
        "proxy, comma-separated (`pypi.org,files.pythonhosted.org,deb.debian.org`): "
        "`pip install` with `--template-pip container`, `apt-get`, `curl`, `git`. Separate "
        "from `--egress-allow` (what sessions may reach); either starts the proxy. Empty: a "
        "build has no network ([Templates](templates.md#network-during-a-build))",
        check=values.domain_patterns,
    )
    egress_default: str = setting(
        "",
        "the allowlist of a session that asks for none, within --egress-allow",
        doc="the allowlist of a session that asks for none (within `--egress-allow`)",
        check=values.domain_patterns,
    )
    egress_networks: str = setting(
        "bridge",
        "Docker networks the egress proxy joins, comma-separated (bridge: the host's way out)",
        doc="Docker networks the egress proxy's container joins, comma-separated (the first "
        "is its own): its way out",
    )
    egress_image: str = setting(
        "",
        "the egress proxy's image",
        doc="the egress proxy's image (squid and socat; `build-image` makes it)",
        default_doc="the kernel image's name + `-egress`",
    )
    # -- time --------------------------------------------------------------------------
    exec_timeout: float = setting(
        60.0,
        "default execution timeout, seconds",
        doc="seconds a cell may run when the request gives no `timeout` (at most "
        "`--max-exec-timeout`)",
        positive=True,
    )
    max_exec_timeout: float = setting(
        3600.0,
        "the largest timeout a request may ask for, seconds",
        doc="the largest `timeout` a request may ask for, in seconds; `--exec-timeout` may "
        "not be above it",
        positive=True,
    )
    interrupt_grace: float = setting(
        1.5,
        "seconds a timed-out cell's kernel has to stop after its interrupt before it is restarted",
        doc="seconds between the interrupt of a cell past its timeout and the restart of a "
        "kernel that did not stop (an abandoned cell gets twice this)",
        positive=True,
    )
    idle_timeout: float = setting(
        1200.0,
        "idle session lifetime, seconds; with --hibernate-after, sessions are hibernated instead",
        doc="seconds before an idle session is removed (with `--hibernate-after`, only "
        "sessions that cannot hibernate)",
        positive=True,
    )
    hibernate_after: float = setting(
        0.0,
        "seconds idle before a session is saved to disk and its kernel stopped; it resumes by "
        "itself on its next call",
        doc="seconds idle before a Python session is hibernated: its variables saved to disk, "
        "its kernel stopped; it resumes by itself on its next call "
        "([Hibernation](hibernation.md))",
        default_doc="`0` (never)",
        finite=True,
        minimum=0,
    )
    snapshot_timeout: float = setting(
        60.0,
        "seconds a session's variables and files may take to be saved (hibernation, "
        "snapshots, forks) before it gives up",
        doc="seconds a kernel may take to write its variables when its session hibernates, "
        "is snapshotted or forked (and its files, for a snapshot or fork); past it the save "
        "stops, the session runs on as it was, and the answer is 503 `hibernation_failed` "
        "naming the value that would not save ([Hibernation](hibernation.md))",
        positive=True,
    )
    max_snapshots: int = setting(
        100,
        "most snapshots this gateway keeps",
        doc="snapshots kept at once (`POST /sessions/{id}/snapshots`); beyond it a new one "
        "gets 429 `too_many_snapshots` until one is deleted ([Snapshots](snapshots.md))",
        minimum=0,
    )
    max_volumes: int = setting(
        100,
        "most volumes this gateway keeps",
        doc="volumes kept at once (`POST /volumes`); beyond it a new one gets 429 "
        "`too_many_volumes` until one is deleted ([Volumes](volumes.md))",
        minimum=0,
    )
    volume_size: str = setting(
        "1g",
        "size cap of a volume made without a size of its own, e.g. 512m, 1g",
        doc="a new volume's size cap when its request names none (same size spellings as "
        "`--workspace-size`; [Volumes](volumes.md))",
        check=values.parse_size,
    )
    max_volume_size: str = setting(
        "10g",
        "largest size cap a volume may ask for",
        doc="the largest `size` a volume may ask for; a larger one is refused with 400 "
        "([Volumes](volumes.md))",
        check=values.parse_size,
    )
    hibernated_ttl: float = setting(
        7 * 24 * 3600.0,
        "seconds a hibernated session is kept before it is deleted with its files",
        doc="seconds idle before a hibernated session is deleted with its snapshot and files; "
        "then 410 `session_lost`",
        default_doc="`604800` (7 days)",
        positive=True,
    )
    kernel_start_timeout: float = setting(
        30.0,
        "seconds a kernel may take to start (and run the preload)",
        doc="seconds a kernel may take to start and run `--preload` before it is given up",
        positive=True,
    )
    max_concurrent_starts: int = setting(
        4,
        "kernels started at once, per pool",
        doc="kernels a pool starts at once (each language's pool, and the fork servers, on "
        "their own)",
        minimum=1,
    )
    # -- a kernel's resources ----------------------------------------------------------
    memory_limit: str = setting(
        "1g",
        "memory per kernel, e.g. 512m, 1g, 1GiB",
        doc="memory per kernel container, swap disabled; sizes are bytes or `k`/`m`/`g`/`t` "
        "(binary), in any case, optionally with `b` or `iB`: `512m`, `1G`, `1GiB`",
        check=values.memory_size,
    )
    cpu_limit: float = setting(
        1.0,
        "CPUs per kernel container",
        doc="CPUs per kernel container (at least 0.01, Docker's minimum)",
        finite=True,
        minimum=0.01,
    )
    pids_limit: int = setting(
        256,
        "processes per kernel container",
        doc="processes/threads per kernel container",
        minimum=1,
    )
    figure_formats: str = setting(
        "png",
        "inline chart formats, e.g. png or png,svg",
        doc="inline chart formats: any of `png`, `svg`, `jpeg`, `retina`, `pdf`, comma-separated",
        check=values.figure_formats,
    )
    figure_dpi: int = setting(100, "inline chart resolution", minimum=10, maximum=600)
    # -- sizes of requests and results -------------------------------------------------
    max_upload_bytes: int = setting(100 * 1024 * 1024, "largest file upload", minimum=1)
    max_body_bytes: int = setting(
        2 * 1024 * 1024,
        "largest JSON request body",
        doc="largest JSON request body (but those of `POST /execute` and `/mcp`: "
        "`--max-stateless-body-bytes`)",
        minimum=1,
    )
    max_stateless_body_bytes: int = setting(
        32 * 1024 * 1024,
        "largest POST /execute or /mcp body",
        doc="largest `POST /execute` or `/mcp` body",
        minimum=1,
    )
    max_queued_executions: int = setting(
        16,
        "executions a session holds waiting behind the running one",
        doc="executions a session holds waiting behind the running one; beyond it the next "
        "gets 429",
        minimum=1,
    )
    max_output_bytes: int = setting(
        1024 * 1024,
        "bytes of stdout and stderr an execution streams",
        doc="bytes of stdout and stderr an execution streams; the rest is cut, with a note",
        minimum=1,
    )
    max_display_bytes: int = setting(
        16 * 1024 * 1024,
        "largest display (a chart, a table) an execution streams",
        doc="largest display (a chart, a table) an execution streams; a larger one is "
        "replaced by a note",
        minimum=1,
    )
    max_inline_file_bytes: int = setting(
        5 * 1024 * 1024,
        "largest file whose bytes a file event carries",
        doc="largest file whose bytes a `file` event carries (images, and every file of a "
        "stateless run); larger ones are fetched with `GET /files`",
        minimum=0,
    )
    max_file_events: int = setting(
        100,
        "changed files one cell reports",
        doc="changed files one cell reports as `file` events; the rest are counted in a note",
        minimum=0,
    )
    # -- kernel start-up ---------------------------------------------------------------
    preload: str = setting(
        "numpy,pandas,matplotlib",
        "modules imported into pooled kernels before hand-out, comma-separated (empty for none)",
        doc="modules imported into pooled kernels before hand-out (silently, no names left "
        "behind); empty for none",
        check=values.module_names,
    )
    network: str = setting(
        "none",
        "Docker network for kernels (none: no network at all; e.g. bridge to let code reach "
        "the internet, for pip)",
        doc="Docker network for kernel containers; `bridge` lets code reach the internet "
        "(e.g. for pip)",
    )
    runtime: str | None = setting(
        None,
        "OCI runtime for kernel containers, e.g. runsc for gVisor",
        doc="OCI runtime for kernel containers: `runsc` runs them under gVisor",
        default_doc="runc (Docker's)",
    )
    workspace_size: str = setting(
        "1g",
        "size cap of each session's working directory, e.g. 512m, 1g, 1GiB",
        doc="one disk cap per session, shared by its working directory, `/tmp` and home "
        "(same size spellings; see [Storage](storage.md))",
        check=values.parse_size,
    )
    # -- when kernels die, clients leave, gateways restart -----------------------------
    restart_budget: int = setting(
        5,
        "kernel deaths a session may have within --restart-window before it is failed",
        doc="kernel deaths a session may have within `--restart-window` before it is marked failed",
        minimum=0,
    )
    restart_window: float = setting(300.0, "seconds the restart budget counts over", positive=True)
    reconnect_grace: float = setting(
        10.0,
        "seconds a cell keeps running after its client disconnected, waiting for it to "
        "resume the stream, before it is interrupted (0: interrupt at once)",
        doc="seconds a cell keeps running after its last client disconnected, waiting for a "
        "resume; `0` interrupts at once",
        finite=True,
        minimum=0,
    )
    replay_executions: int = setting(
        20,
        "finished executions whose events each session keeps for resuming",
        doc="finished executions per session whose events are kept for resuming",
        minimum=1,
    )
    replay_bytes: int = setting(
        16 * 1024 * 1024,
        "bytes of finished executions' events each session keeps",
        doc="bytes of finished executions' events kept per session",
        minimum=0,
    )
    persist_sessions: bool = setting(
        False,
        "leave sessions' kernels running when the gateway stops (and after a crash), for the "
        "next gateway on this runtime dir to adopt (docker backend)",
        doc="sessions outlive the gateway: kernels keep running when it stops or crashes, and "
        "the next gateway on the same runtime dir adopts them (docker backend; see "
        "[Durable sessions](durable-sessions.md))",
    )
    keep_alive_timeout: float = setting(
        120.0,
        "seconds an idle HTTP connection stays open for the client's next request",
        doc="seconds an idle keep-alive connection stays open: longer than clients keep one in "
        "their pools (reqwest and hyper, as in E2B's Python SDK: 90 s), so that no request is "
        "sent on a connection the gateway is closing that very moment",
        positive=True,
    )
    drain_timeout: float = setting(
        30.0,
        "with --persist-sessions: seconds a stopping gateway lets running cells finish before "
        "it exits, leaving them to run on",
        doc="with `--persist-sessions`: seconds a stopping gateway lets running cells finish "
        "(and their streams end with `done`) before it exits, leaving the rest running",
        positive=True,
    )
    adopt_wait: float = setting(
        0.0,
        "with --persist-sessions: at startup, wait up to this many seconds for a gateway still "
        "running on the same runtime dir to stop, then adopt its sessions (start-first "
        "rolling updates; 0: start beside it)",
        doc="with `--persist-sessions`: at startup, wait up to this many seconds for a "
        "gateway still running on the same runtime dir to stop, then adopt its sessions "
        "(start-first rolling updates, as in `deploy/stack.yml`); 0: start beside it",
        finite=True,
        minimum=0,
    )
    runtime_dir: Path = setting(
        factory=default_runtime_dir,
        help="where connection files and workspaces live, a folder only this user may use",
        doc="connection files and session workspaces; mode 0700, and refused at startup "
        "(exit status 2) if it is a symlink, not yours, or writable by others",
        default_doc="root: `/var/lib/kernel-gateway` (on disk, for the session disks); "
        "others: `$XDG_RUNTIME_DIR/kernel-gateway`, else `$TMPDIR/kernel-gateway-<uid>`",
    )
    # -- logs, cluster, MCP ------------------------------------------------------------
    log_level: str = setting(
        "info",
        "how much is logged",
        doc="`debug`, `info`, `warning` or `error`; `info` logs one line per request "
        "(method, route template, status, duration, request id)",
        choices=values.LOG_LEVELS,
        check=values.log_level,
    )
    log_format: LogFormat = setting(
        "text",
        "text, or json: one JSON object per line with request, session and execution ids",
        doc="`json`: one JSON object per line, with request, session and execution ids (see "
        "[Operating](operating.md))",
        choices=get_args(LogFormat),
    )
    node_name: str | None = setting(
        None,
        "this gateway's node in a cluster (kernel-gateway route): session ids start with it, "
        "'<node>.<hex>', so a router finds a session's node from its id",
        doc="this gateway's node in a [cluster](cluster.md): session ids become "
        "`<node>.<32 hex>` and `/health` reports `node`; 1-63 letters, digits, `-`, `_`",
        check=values.node_name,
    )
    mcp: McpMode = setting(
        "sessions",
        "the MCP endpoint at /mcp: sessions (each MCP session keeps its own kernel), "
        "stateless (every run_python call gets a fresh kernel), or off",
        doc="the [MCP endpoint](mcp.md) at `/mcp`: `sessions` (a sandbox per MCP session, or "
        "kept by handle), `stateless` (a fresh kernel per call), or `off`",
        choices=get_args(McpMode),
    )
    mcp_templates: bool = setting(
        False,
        "let MCP clients start sandboxes on templates (a template argument on the tools)",
        doc="the [MCP](mcp.md) tools take a `template` (a sandbox on one of the gateway's "
        "[templates](templates.md)); off, their schemas do not offer it. Docker backend",
    )
    secrets_key_file: Path | None = setting(
        None,
        "the key secrets are sealed with at rest (a file of random bytes); unset, no secrets",
        doc="the key the [secrets](secrets.md) are sealed with at rest (AES-256-GCM; the "
        "file's bytes, hashed): a file of at least 16 random bytes the operator keeps. "
        "Unset, the secrets routes answer 501",
    )
    egress_ca_file: Path | None = setting(
        None,
        "more CAs (PEM) the egress relay trusts for the hosts it opens HTTPS to (secrets)",
        doc="more CAs (a PEM file) trusted, besides the system's, for the hosts the egress "
        "relay opens HTTPS to for sessions that use [secrets](secrets.md) (a company CA)",
    )
    # -- the chat: a model writes the code ------------------------------------------------
    llm_url: str | None = setting(
        None,
        "an OpenAI-compatible chat-completions API with tool calling, for the chat "
        "(e.g. http://127.0.0.1:11434/v1); unset, there is no chat",
        doc="base URL of an OpenAI-compatible API with tool calling (`…/v1`: the gateway "
        "posts to `…/v1/chat/completions`): Ollama, vLLM, llama.cpp or a hosted one. Set, "
        "sessions have a [chat](chat.md); unset, the chat routes answer 501",
        check=values.http_url,
    )
    llm_model: str | None = setting(
        None,
        "the model the chat asks (its name at --llm-url)",
        doc="the model the [chat](chat.md) asks, by its name at `--llm-url`",
    )
    llm_key_file: Path | None = setting(
        None,
        "read the model API's key from this file's first line (it stays on the gateway)",
        doc="the model API's key, read from a file's first line (a Docker secret); sent only "
        "to `--llm-url`, never to a browser or a kernel",
    )
    llm_timeout: float = setting(
        120.0,
        "seconds one model call may take, first byte to last",
        doc="seconds one model call may take; past it the turn ends `model_error`",
        positive=True,
        finite=True,
    )
    llm_vision: bool = setting(
        False,
        "send the charts a cell shows to the model as images (models that take images)",
        doc="send the charts a cell shows to the model as images, not only their names "
        "(only for models that take images)",
    )
    chat_max_steps: int = setting(
        8,
        "cells the model may run in one chat turn",
        doc="cells the model may run in one [chat](chat.md) turn; then the turn ends `step_limit`",
        minimum=1,
        maximum=100,
    )
    chat_max_tokens: int = setting(
        60000,
        "tokens one chat turn may use, as the model reports them",
        doc="tokens one chat turn may use, as the model reports them (estimated from the "
        "text when it does not); then the turn ends `token_limit`",
        minimum=1000,
    )
    chat_calls_per_hour: int = setting(
        600,
        "model calls each API key (and the admin) may make in any hour (0: no limit)",
        doc="model calls per API key (and for the admin) in any hour, on this gateway; past "
        "it a new turn gets 429 and a running one ends `call_limit`. `0`: no limit",
        minimum=0,
    )

    def __post_init__(self) -> None:
        """Refuse, at startup, any value that would only fail later (at every launch): each
        field's declared bounds, then the rules between fields."""
        check_fields(self)
        if self.persist_sessions and self.backend == "local":
            raise ValueError(
                f"{origin('persist_sessions')}: sessions can outlive the gateway only on the "
                "docker backend (a local kernel is the gateway's child process)"
            )
        if self.exec_timeout > self.max_exec_timeout:
            raise ValueError(
                f"{origin('exec_timeout')}: {self.exec_timeout} s is above the largest "
                f"timeout a request may ask for, {origin('max_exec_timeout')} "
                f"({self.max_exec_timeout} s)"
            )
        self.egress_default_list  # noqa: B018 - raises ValueError when wider than the ceiling
        if self.egress_ceiling and self.backend == "local":
            raise ValueError(
                f"{origin('egress_allow')}: network policies need the docker backend (the "
                "local backend's kernels cannot be kept from the network)"
            )
        if self.build_egress_list and self.backend == "local":
            raise ValueError(
                f"{origin('build_egress_allow')}: templates are built on the docker backend"
            )
        if (self.llm_url is None) != (self.llm_model is None):
            raise ValueError(
                f"{origin('llm_url')} and {origin('llm_model')} go together: the chat needs "
                "both the API and the model to ask there"
            )
        if self.llm_key_file is not None and self.llm_url is None:
            raise ValueError(f"{origin('llm_key_file')} without {origin('llm_url')}")
        if self.egress_ceiling and self.network != "none":
            raise ValueError(
                f"{origin('egress_allow')} needs {origin('network')} none: kernels with a "
                f"network of their own ({self.network}) would not need the proxy"
            )

    @property
    def memory_limit_bytes(self) -> int:
        """`memory_limit` in bytes (validated at startup, so this never raises)."""
        return values.parse_size(self.memory_limit)

    @property
    def template_max_size_bytes(self) -> int:
        return values.parse_size(self.template_max_size)

    @property
    def template_upload_max_bytes(self) -> int:
        return values.parse_size(self.template_upload_max)

    @property
    def workspace_size_bytes(self) -> int:
        """`workspace_size` in bytes (validated at startup, so this never raises)."""
        return values.parse_size(self.workspace_size)

    @property
    def volume_size_bytes(self) -> int:
        return values.parse_size(self.volume_size)

    @property
    def max_volume_size_bytes(self) -> int:
        return values.parse_size(self.max_volume_size)

    def stateless_limit(self, forked: bool) -> int:
        """`--max-stateless`, or its default for the way stateless requests are served."""
        if self.max_stateless:
            return self.max_stateless
        return FORKED_STATELESS_LIMIT if forked else CONTAINER_STATELESS_LIMIT

    @property
    def preload_list(self) -> list[str]:
        return values.items(self.preload)

    @property
    def fork_light_preload_list(self) -> list[str]:
        """The light template's part of `--preload` (in the order of `--preload`); empty
        when there is no light template (no list given, or it names all of them)."""
        light = set(values.items(self.fork_light_preload))
        chosen = [m for m in self.preload_list if m in light]
        return [] if not light or chosen == self.preload_list else chosen

    @property
    def language_list(self) -> list[str] | None:
        """The languages asked for by name, or None for `auto` (every one found)."""
        return values.language_names(self.languages)

    @property
    def builtin_template_list(self) -> list[str]:
        return values.items(self.builtin_templates)

    @property
    def language_image_list(self) -> list[str]:
        return values.items(self.language_images)

    @property
    def egress_ceiling(self) -> list[str]:
        """The domain patterns sessions may be allowed (`--egress-allow`): none by default."""
        return values.domain_patterns(self.egress_allow)

    @property
    def build_egress_list(self) -> list[str]:
        """The domain patterns builds may reach (`--build-egress-allow`): none by default."""
        return values.domain_patterns(self.build_egress_allow)

    @property
    def egress_needed(self) -> bool:
        """Whether the egress proxy runs: sessions or builds may reach some domains."""
        return bool(self.egress_ceiling or self.build_egress_list)

    @property
    def egress_default_list(self) -> list[str]:
        """The allowlist of a session that names none (`--egress-default`), within the
        ceiling."""
        patterns = values.domain_patterns(self.egress_default)
        wide = outside(self.egress_ceiling, patterns)
        if wide:
            raise ValueError(
                f"{origin('egress_default')}: {', '.join(wide)} not within "
                f"{origin('egress_allow')} ({self.egress_allow or 'empty'})"
            )
        return patterns

    @property
    def egress_network_list(self) -> list[str]:
        """The Docker networks the egress proxy joins (the first is its own)."""
        return values.items(self.egress_networks) or ["bridge"]

    @property
    def language_pool_sizes(self) -> dict[str, int]:
        """Warm kernels per language other than Python (`--language-pool r=1,bash=2`)."""
        return values.language_pool(self.language_pool)

    @property
    def figure_format_list(self) -> list[str]:
        return values.items(self.figure_formats)

    @property
    def auth_required(self) -> bool:
        return self.token is not None

    def check_exposure(self) -> None:
        values.check_exposure(self.host, self.token, self.no_auth)


def from_env(environ: Mapping[str, str], **overrides: Any) -> Settings:
    """Settings from `KG_*` variables, with explicit overrides (CLI flags) on top."""
    found = env_values(Settings, environ)
    found.update({k: v for k, v in overrides.items() if v is not None})
    values.resolve_token(found)
    if "runtime_dir" not in found:
        found["runtime_dir"] = default_runtime_dir(environ)
    return Settings(**found)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags for `serve`; each defaults to None so the KG_* twin can fill it."""
    add_arguments(parser, Settings)


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    return from_env(environ, **flag_values(Settings, args))
