"""The egress proxy: squid from Debian, in a container of this gateway's own, and the
policy file that tells it what each session may reach.

    <runtime>/<instance>/egress/conf/    squid.conf, error pages, policy.json (read-only
                                         in the container)
    <runtime>/<instance>/egress/run/     squid.sock: socat in the container joins it to
                                         squid's 127.0.0.1:3128

The container is on the networks `--egress-network` names (Docker's default bridge unless
told otherwise): it alone reaches out. Kernels never do: they have no network, only their
relay (`relay.py`), which reaches squid through `squid.sock`; squid's port is on the
container's own loopback, where nothing else can reach it. The container runs as the
kernels' user with no capabilities, a read-only root and a memory cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import ssl
import time
from pathlib import Path
from typing import Any

import docker.errors
import docker.types

from kernel_gateway.errors import BackendUnavailable, KernelUnavailable
from kernel_gateway.kernels.backends.base import Backend
from kernel_gateway.kernels.backends.docker import DockerBackend
from kernel_gateway.kernels.backends.labels import container_labels
from kernel_gateway.kernels.egress import squid_conf
from kernel_gateway.kernels.egress.authority import Authority
from kernel_gateway.kernels.egress.images import egress_image
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.settings import Settings
from kernel_gateway.tenants.secrets import SecretStore

logger = logging.getLogger(__name__)

SQUID_PORT = 3128
INSIDE = "/egress"
HELPER = f"{INSIDE}/conf/policy.py"
PYTHON = "/usr/bin/python3"
READY_SECONDS = 60.0
MEMORY_LIMIT = 256 * 2**20
PIDS_LIMIT = 4096  # socat forks per connection: 32 per session (relay.MAX_CONNECTIONS) and more


class EgressProxy:
    """Starts, feeds and stops this gateway's squid container."""

    def __init__(
        self, backend: DockerBackend, folder: Path, image: str, networks: list[str]
    ) -> None:
        self._backend = backend
        self.folder = folder
        self._image = image
        self._networks = networks or ["bridge"]
        self._sessions: dict[str, dict[str, Any]] = {}
        self._write_lock = asyncio.Lock()
        self.secrets: SecretStore | None = None
        """The gateway's secrets, for the relays of sessions that use some."""
        self.authority: Authority | None = None
        """The CA those relays show sandboxes (made with the secret store)."""
        self.upstream_tls = ssl.create_default_context()
        """How those relays verify the real hosts: the system's CAs (and --egress-ca-file)."""
        self.upstream_tls.set_alpn_protocols(["http/1.1"])
        instance = backend.runtime.instance
        self.name = f"kg-egress-{instance}"

    @property
    def socket(self) -> Path:
        """Where a relay reaches squid."""
        return self.folder / "run" / "squid.sock"

    # -- life -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Write squid's files, start its container, and wait until it answers."""
        started = time.monotonic()
        await asyncio.to_thread(self._write_files)
        await self._backend.call(self._remove)
        try:
            await self._backend.call(self._create)
        except docker.errors.ImageNotFound:
            raise KernelUnavailable(
                f"the egress proxy's image {self._image} is missing (run `kernel-gateway "
                "build-image`)"
            ) from None
        except docker.errors.DockerException as exc:
            raise KernelUnavailable(f"the egress proxy did not start: {exc}") from exc
        await self._wait_ready()
        logger.info(
            "egress proxy %s ready in %.2f s (networks: %s)",
            self.name,
            time.monotonic() - started,
            ", ".join(self._networks),
        )

    async def close(self) -> None:
        await self._backend.call(self._remove)
        await asyncio.to_thread(shutil.rmtree, self.folder, True)

    # -- the policy ---------------------------------------------------------------------------

    async def allow(self, session_id: str, secret: str, patterns: list[str]) -> None:
        """Session `session_id`, authenticated by `secret`, may reach `patterns` (on disk
        when this returns: squid reads the file on its next check)."""
        digest = hashlib.sha256(secret.encode()).hexdigest()
        self._sessions[session_id] = {"secret_sha256": digest, "allow": list(patterns)}
        await self._write_policy()

    async def forget(self, session_id: str) -> None:
        if self._sessions.pop(session_id, None) is not None:
            await self._write_policy()

    async def _write_policy(self) -> None:
        async with self._write_lock:  # in order: the last state wins
            text = json.dumps({"sessions": self._sessions})
            await asyncio.to_thread(_replace, self.folder / "conf" / "policy.json", text)

    # -- runs on threads ----------------------------------------------------------------------

    def _write_files(self) -> None:
        from kernel_gateway import in_proxy

        conf, run, errors = self.folder / "conf", self.folder / "run", self.folder / "conf" / "e"
        for path in (self.folder, conf, run, errors):
            path.mkdir(mode=0o700, exist_ok=True)
        shutil.copyfile(Path(in_proxy.__file__).parent / "policy.py", conf / "policy.py")
        (conf / "squid.conf").write_text(
            squid_conf.render(
                port=SQUID_PORT,
                policy=f"{INSIDE}/conf/policy.json",
                helper=HELPER,
                errors=f"{INSIDE}/conf/e",
                python=PYTHON,
            )
        )
        for name, text in squid_conf.ERROR_PAGES.items():
            (errors / name).write_text(squid_conf.error_page(text))
        _replace(conf / "policy.json", json.dumps({"sessions": self._sessions}))
        owner = self._backend.owner
        for path in (self.folder, conf, run, errors, *conf.iterdir(), *errors.iterdir()):
            if owner is not None:
                os.chown(path, *owner)
            path.chmod(0o700 if path.is_dir() else 0o600)
        self.socket.unlink(missing_ok=True)

    def _create(self) -> None:
        api = self._backend.client.api
        runtime = self._backend.runtime
        # Either one ending ends the container, which Docker starts again (restart policy).
        command = (
            f"socat UNIX-LISTEN:{INSIDE}/run/squid.sock,fork,mode=666,unlink-early "
            f"TCP:127.0.0.1:{SQUID_PORT} & squid -N -f {INSIDE}/conf/squid.conf & "
            "wait -n; exit 1"
        )
        host_config = api.create_host_config(
            binds={
                str(self.folder / "conf"): {"bind": f"{INSIDE}/conf", "mode": "ro"},
                str(self.folder / "run"): {"bind": f"{INSIDE}/run", "mode": "rw"},
            },
            network_mode=self._networks[0],
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            init=True,
            read_only=True,
            tmpfs={"/tmp": "rw,size=64m", "/var/spool/squid": "rw,size=1m"},
            mem_limit=MEMORY_LIMIT,
            memswap_limit=MEMORY_LIMIT,
            pids_limit=PIDS_LIMIT,
            restart_policy={"Name": "on-failure"},
            log_config=docker.types.LogConfig(
                type="json-file", config={"max-size": "1m", "max-file": "1"}
            ),
        )
        container = api.create_container(
            name=self.name,
            image=self._image,
            command=["/bin/bash", "-c", command],
            user=self._backend.user,
            labels=container_labels(runtime, "egress"),
            host_config=host_config,
        )
        try:
            for network in self._networks[1:]:
                api.connect_container_to_network(container["Id"], network)
            api.start(container["Id"])
        except BaseException:
            with contextlib.suppress(docker.errors.DockerException):
                api.remove_container(container["Id"], force=True)
            raise

    def _remove(self) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self._backend.client.api.remove_container(self.name, force=True)

    def _logs(self) -> str:
        try:
            raw: bytes = self._backend.client.api.logs(self.name, tail=20)
        except docker.errors.DockerException:
            return ""
        return raw.decode(errors="replace")

    async def _wait_ready(self) -> None:
        """squid answers through the socket (a request without credentials: 407)."""
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(str(self.socket))
                try:
                    writer.write(b"CONNECT ready.invalid:443 HTTP/1.1\r\n\r\n")
                    answer = await asyncio.wait_for(reader.readline(), 5)
                finally:
                    writer.close()
                if answer.startswith(b"HTTP/1.1 407"):
                    return
            except (OSError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                logs = await self._backend.call(self._logs)
                raise KernelUnavailable(
                    f"the egress proxy did not answer within {READY_SECONDS:.0f} s: {logs[-2000:]}"
                )
            await asyncio.sleep(0.1)


def _replace(path: Path, text: str) -> None:
    """Write `path` atomically (squid's helper reads it at any moment)."""
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(temporary, path)


async def start_egress(
    settings: Settings, backend: Backend, runtime: RuntimeDir
) -> EgressProxy | None:
    """This gateway's egress proxy, started, when `--egress-allow` (sessions) or
    `--build-egress-allow` (template builds) allows some domains."""
    if not settings.egress_needed:
        return None
    if not isinstance(backend, DockerBackend):
        flag = "--egress-allow" if settings.egress_ceiling else "--build-egress-allow"
        raise BackendUnavailable(
            f"{flag} needs the docker backend (no Docker engine answered): kernels "
            "of the local backend cannot be kept from the network"
        )
    image = settings.egress_image or egress_image(settings.image)
    proxy = EgressProxy(backend, runtime.path / "egress", image, settings.egress_network_list)
    try:
        await proxy.start()
    except KernelUnavailable as exc:
        await proxy.close()
        raise BackendUnavailable(exc.message) from exc
    return proxy
