"""The Docker engine's side of a template build (see `kernels/images.py`).

Every step runs in a container labelled with this instance and the role `build`, so a
gateway that died mid-build leaves nothing a successor does not remove. A RUN container
is a kernel's, but for the root filesystem (writable: that is the step's point) and the
user (the step's): same runtime (gVisor when kernels use it), memory, CPU and process
limits, no network, no capabilities beyond those a package manager needs as root, and
no new privileges. Intermediate images carry the labels the orchestrator asks for (its
cache keys); only final images get a name.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import tarfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import docker.types
import requests.exceptions

from kernel_gateway.kernels.backends.labels import LABEL_INSTANCE, LABEL_ROLE, container_labels
from kernel_gateway.kernels.images import ImageBuilder, ImageInfo, ListedImage, StepFailed
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.settings import Settings

if TYPE_CHECKING:
    from kernel_gateway.kernels.backends.docker import DockerBackend

logger = logging.getLogger(__name__)

BUILD_CAPABILITIES = [
    "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETFCAP",
]  # fmt: skip
"""What `apt-get install` and `chown` need as root in a build container (apt drops to
its `_apt` user); nothing that reaches beyond the container (no NET_*, SYS_*, MKNOD)."""
OUTPUT_CHUNK = 64 * 1024
MAX_LINE = 8 * 1024

ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


class DockerImages(ImageBuilder):
    def __init__(self, backend: DockerBackend, settings: Settings, runtime: RuntimeDir) -> None:
        self._backend = backend
        self._settings = settings
        self._runtime = runtime

    @property
    def _api(self) -> docker.APIClient:
        return self._backend.client.api

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._backend.call(fn, *args, **kwargs)
        except ENGINE_ERRORS as exc:
            raise StepFailed(f"{what}: {engine_message(exc)}") from exc

    async def inspect(self, ref: str) -> ImageInfo | None:
        try:
            data = await self._backend.call(self._api.inspect_image, ref)
        except docker.errors.ImageNotFound:
            return None
        except ENGINE_ERRORS as exc:
            raise StepFailed(f"could not read the image {ref}: {engine_message(exc)}") from exc
        config = data.get("Config") or {}
        env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
        return ImageInfo(
            id=data["Id"],
            user=config.get("User") or "root",
            workdir=config.get("WorkingDir") or "/",
            env=env,
            cmd=tuple(config.get("Cmd") or ()),
            entrypoint=tuple(config.get("Entrypoint") or ()),
            labels=dict(config.get("Labels") or {}),
            size=int(data.get("Size") or 0),
            arch=str(data.get("Architecture") or "amd64"),
        )

    def _host_config(self, *, run: bool) -> dict[str, Any]:
        s = self._settings
        host_config: dict[str, Any] = self._api.create_host_config(
            network_mode="none",
            cap_drop=["ALL"],
            cap_add=BUILD_CAPABILITIES if run else None,
            security_opt=["no-new-privileges:true"],
            init=run,
            mem_limit=s.memory_limit_bytes,
            memswap_limit=s.memory_limit_bytes,
            nano_cpus=int(s.cpu_limit * 1e9),
            pids_limit=s.pids_limit,
            log_config=docker.types.LogConfig(
                type="json-file", config={"max-size": "10m", "max-file": "1"}
            ),
        )
        if s.runtime and run:
            host_config["Runtime"] = s.runtime
        return host_config

    async def _create(self, image: str, **kwargs: Any) -> str:
        created = await self._call(
            "could not create a build container",
            self._api.create_container,
            image,
            labels=container_labels(self._runtime, "build"),
            **kwargs,
        )
        return str(created["Id"])

    async def _remove_container(self, container: str) -> None:
        try:
            await asyncio.shield(
                self._backend.call(self._api.remove_container, container, force=True)
            )
        except ENGINE_ERRORS as exc:
            logger.warning("could not remove the build container %s: %s", container[:12], exc)

    async def _commit(self, container: str, changes: list[str], labels: Mapping[str, str]) -> str:
        label_changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in labels.items()]
        committed = await self._call(
            "could not save the step's image",
            self._api.commit,
            container,
            changes=[*changes, *label_changes],
        )
        return str(committed["Id"])

    async def run(
        self,
        parent: str,
        command: str,
        *,
        user: str,
        workdir: str,
        time_limit: float,
        on_output: Callable[[str], None],
        labels: Mapping[str, str],
        mounts: Mapping[str, str] | None = None,
    ) -> str:
        host_config = self._host_config(run=True)
        if mounts:
            host_config["Binds"] = [f"{host}:{inside}:ro" for host, inside in mounts.items()]
        container = await self._create(
            parent,
            command=["/bin/bash", "-c", command],
            entrypoint=[],
            user=user,
            working_dir=workdir,
            host_config=host_config,
        )
        try:
            try:
                await self._backend.call(self._api.start, container)
            except docker.errors.APIError as exc:
                raise StepFailed(engine_message(exc)) from exc
            except ENGINE_ERRORS as exc:
                raise StepFailed(f"could not start the step: {engine_message(exc)}") from exc
            # Its log from the start (the engine keeps it, capped), followed to its end.
            stream = await self._call(
                "could not read the step's output",
                self._api.logs,
                container,
                stream=True,
                follow=True,
            )
            reader = asyncio.ensure_future(self._stream_output(stream, on_output))
            try:
                try:
                    result = await asyncio.wait_for(
                        self._call("the step's container", self._api.wait, container), time_limit
                    )
                except TimeoutError:
                    await self._remove_container(container)
                    raise StepFailed(f"the step ran out of time ({time_limit:.0f} s)") from None
            finally:
                await asyncio.wait([reader], timeout=5)
                reader.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(stream.close)
            code = int(result.get("StatusCode", -1))
            if code != 0:
                raise StepFailed(f"exited with code {code}", exit_code=code)
            return await self._commit(container, [], labels)
        finally:
            await self._remove_container(container)

    async def _stream_output(self, stream: Any, on_output: Callable[[str], None]) -> None:
        """Each line the container writes, to `on_output` on the loop (read on a thread)."""
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def read() -> None:
            pending = b""
            try:
                for chunk in _chunks(stream):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        text = line[:MAX_LINE].decode(errors="replace").rstrip("\r")
                        loop.call_soon_threadsafe(on_output, text)
                    if len(pending) > MAX_LINE:
                        text = pending[:MAX_LINE].decode(errors="replace")
                        loop.call_soon_threadsafe(on_output, text)
                        pending = b""
                if pending:
                    loop.call_soon_threadsafe(on_output, pending.decode(errors="replace"))
            except ENGINE_ERRORS as exc:
                logger.debug("reading a build step's output stopped: %s", exc)
            finally:
                loop.call_soon_threadsafe(done.set)

        threading.Thread(target=read, name="build-output", daemon=True).start()
        await done.wait()

    async def apply(
        self,
        parent: str,
        *,
        changes: list[str],
        labels: Mapping[str, str],
        archive: bytes | None = None,
        copy_from: tuple[str, str] | None = None,
    ) -> str:
        container = await self._create(
            parent, command=["true"], host_config=self._host_config(run=False)
        )
        try:
            if copy_from is not None:
                source_image, path = copy_from
                await self._copy_from(source_image, path, container)
            if archive is not None:
                ok = await self._call(
                    "could not put the files into the image",
                    self._api.put_archive,
                    container,
                    "/",
                    archive,
                )
                if not ok:
                    raise StepFailed("the engine refused the files")
            return await self._commit(container, changes, labels)
        finally:
            await self._remove_container(container)

    async def _copy_from(self, image: str, path: str, container: str) -> None:
        source = await self._create(
            image, command=["true"], host_config=self._host_config(run=False)
        )
        try:

            def copy() -> None:
                stream, _ = self._api.get_archive(source, path)
                data = b"".join(stream)
                parent = path.rstrip("/").rsplit("/", 1)[0] or "/"
                if not self._api.put_archive(container, parent, data):
                    raise StepFailed(f"could not restore {path}")

            await self._call(f"could not copy {path} from {image}", copy)
        finally:
            await self._remove_container(source)

    async def read_file(self, image: str, path: str, limit: int = 1 << 20) -> bytes | None:
        container = await self._create(
            image, command=["true"], host_config=self._host_config(run=False)
        )
        try:

            def read() -> bytes | None:
                try:
                    stream, stat = self._api.get_archive(container, path)
                except docker.errors.NotFound:
                    return None
                if int(stat.get("size", 0)) > limit:
                    return None
                data = b"".join(stream)
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    member = tar.next()
                    if member is None or not member.isfile():
                        return None
                    extracted = tar.extractfile(member)
                    return extracted.read(limit) if extracted is not None else None

            result: bytes | None = await self._call(f"could not read {path}", read)
            return result
        finally:
            await self._remove_container(container)

    async def archive(self, image: str, path: str, dest: Path, limit: int) -> int:
        container = await self._create(
            image, command=["true"], host_config=self._host_config(run=False)
        )
        try:

            def write() -> int:
                try:
                    stream, _ = self._api.get_archive(container, path)
                except docker.errors.NotFound:
                    return 0
                size = 0
                try:
                    with dest.open("wb") as out:
                        for chunk in stream:
                            size += len(chunk)
                            if size > limit:
                                raise StepFailed(f"{path} holds more than {limit} bytes")
                            out.write(chunk)
                    with tarfile.open(dest) as tar:
                        return len(tar.getmembers())
                except BaseException:
                    dest.unlink(missing_ok=True)
                    raise

            count: int = await self._call(f"could not read {path}", write)
            return count
        finally:
            await self._remove_container(container)

    async def find(self, labels: Mapping[str, str]) -> str | None:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        found = await self._call(
            "could not list images", self._api.images, filters=filters, quiet=True, all=True
        )
        return str(found[0]) if found else None

    async def listed(self, label: str) -> list[ListedImage]:
        found = await self._call(
            "could not list images", self._api.images, filters={"label": label}
        )
        return [
            ListedImage(
                id=str(item["Id"]),
                tags=tuple(t for t in item.get("RepoTags") or () if t != "<none>:<none>"),
                labels=dict(item.get("Labels") or {}),
            )
            for item in found
        ]

    async def tag(self, image: str, ref: str) -> None:
        repository, _, tag = ref.rpartition(":")
        await self._call(f"could not name the image {ref}", self._api.tag, image, repository, tag)

    async def remove(self, ref: str) -> bool:
        try:
            await self._backend.call(self._api.remove_image, ref)
            return True
        except docker.errors.ImageNotFound:
            return False
        except ENGINE_ERRORS as exc:
            logger.warning("could not remove the image %s: %s", ref, engine_message(exc))
            return False

    async def cleanup(self) -> int:
        """This instance's build containers (none outlive a step but after a crash;
        other instances' are removed with their instance, see docker.py)."""
        filters = {"label": [f"{LABEL_ROLE}=build", f"{LABEL_INSTANCE}={self._runtime.instance}"]}
        try:
            found = await self._backend.call(
                self._api.containers, all=True, filters=filters, quiet=True
            )
        except ENGINE_ERRORS:
            return 0
        for item in found:
            await self._remove_container(item["Id"])
        return len(found)


def _chunks(stream: Any) -> Iterator[bytes]:
    for chunk in stream:
        if isinstance(chunk, bytes):
            yield chunk


def engine_message(exc: BaseException) -> str:
    if isinstance(exc, docker.errors.APIError):
        explanation = exc.explanation
        if isinstance(explanation, bytes):
            explanation = explanation.decode(errors="replace")
        return str(explanation or exc)
    return str(exc) or type(exc).__name__
