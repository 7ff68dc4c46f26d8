"""Warm kernels kept ready, each on its own prepared storage.

Taking a kernel never waits on a start when a warm one is ready. Refills run
in the background, several at once, and callers who found the pool empty are
served first by whichever start finishes next, so a drained pool recovers as
fast as the backend can start kernels. Storage is prepared here, off the path
that hands kernels out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq.asyncio

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.backends.base import (
    Backend,
    KernelProcess,
    SessionStorage,
    mounts_under,
)
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.languages import BUILTIN_PYTHON, Language
from kernel_gateway.kernels.pools.refill import Refill
from kernel_gateway.kernels.pools.start_commands import run_start_commands
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.kernels.storage import unpack_seed
from kernel_gateway.kernels.volumes import VolumeMount
from kernel_gateway.metrics import Metrics
from kernel_gateway.settings import Settings
from kernel_gateway.shapes.responses import WarmPoolStats

logger = logging.getLogger(__name__)


class _PoolLease:
    """What every lease of a warm pool answers alike: relaunchable, files owned by the
    backend's kernel user."""

    pool: WarmPool

    @property
    def relaunchable(self) -> bool:
        return True

    @property
    def files_owner(self) -> tuple[int, int] | None:
        return self.pool.backend.workspace_owner


@dataclass
class WarmKernel(_PoolLease):
    """A kernel of the warm pool on storage of its own; as a `Lease`: released by removing
    the storage."""

    kernel: Kernel
    storage: SessionStorage
    pool: WarmPool = field(repr=False)

    async def release(self) -> None:
        await self.pool.remove_storage(self.storage)


@dataclass
class KernelLess(_PoolLease):
    """A hibernated session's storage, adopted from a predecessor with no kernel running (it
    resumes onto it); as a `Lease`: released by removing the storage."""

    storage: SessionStorage
    pool: WarmPool = field(repr=False)

    @property
    def kernel(self) -> Kernel:
        raise KernelUnavailable("a hibernated session has no kernel until it resumes")

    async def release(self) -> None:
        await self.pool.remove_storage(self.storage)


@dataclass
class SharedKernel(_PoolLease):
    """A kernel on another lease's storage (an E2B context beside its sandbox's kernel); as a
    `Lease`: released by nothing (the storage is its owner's)."""

    kernel: Kernel
    storage: SessionStorage
    pool: WarmPool = field(repr=False)

    async def release(self) -> None:
        pass  # the storage stays: it is the owner's


class WarmPool:
    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        runtime: RuntimeDir,
        context: zmq.asyncio.Context,
        metrics: Metrics | None = None,
        language: Language = BUILTIN_PYTHON,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.backend = backend
        self.language = language
        self._runtime = runtime
        self._context = context
        # Python's warm kernels: --pool-size; another language's: --language-pool (default
        # none: each of its kernels starts when asked for).
        self.size = (
            settings.pool_size
            if language.builtin
            else settings.language_pool_sizes.get(language.name, 0)
        )
        self._refill: Refill[WarmKernel] = Refill(
            "kernel" if language.builtin else f"{language.name} kernel",
            self._start_one,
            lambda: self.size + len(self._refill.waiters),
            settings.max_concurrent_starts,
            on_ready=self._watch_ready,
        )
        self.kernels_started = 0
        # The preloads are Python imports, for the gateway's own Python kernel only.
        self._preload_code = preload_code(settings.preload_list) if language.builtin else ""

    def sibling(self, language: Language) -> WarmPool:
        """A pool of `language` (a template's) beside this one, keeping no kernel warm
        until its `size` is raised."""
        pool = WarmPool(
            self.settings, self.backend, self._runtime, self._context, self.metrics, language
        )
        pool.size = 0
        return pool

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._refill.fill()

    async def close(self) -> None:
        # Cancelled starts finish their cleanup before the backend removes containers.
        warm = await self._refill.close()
        await asyncio.gather(*(self.discard(w) for w in warm), return_exceptions=True)

    async def resize(self, size: int) -> None:
        """Keep `size` kernels warm from now on; warm ones beyond it are removed."""
        self.size = size
        extra = []
        while len(self._refill.ready) > size:
            extra.append(self._refill.ready.pop())
        await asyncio.gather(*(self.discard(w) for w in extra), return_exceptions=True)
        self._refill.fill()

    @property
    def ready(self) -> int:
        """Warm kernels ready to be handed out now."""
        return len(self._refill.ready)

    def stats(self) -> WarmPoolStats:
        return {
            "warm": len(self._refill.ready),
            "starting": self._refill.starting,
            "target": self.size,
            "kernels_started": self.kernels_started,
        }

    # -- kernels -----------------------------------------------------------------------------

    async def remove_storage(self, storage: SessionStorage) -> None:
        try:
            await self.backend.release_storage(storage)
        finally:
            if await asyncio.to_thread(_still_mounted, storage.root):
                # Never delete through a mount: it may be another session's disk carried
                # here (a failed unmount); left for the next start's reclaim.
                logger.error("storage at %s is still mounted; not removed", storage.root)
            else:
                await asyncio.to_thread(shutil.rmtree, storage.root, True)

    @property
    def workspaces(self) -> Path:
        """The folder holding every session's storage root."""
        return self._runtime.path / "w"

    async def unclaimed_storage(self, keep: set[str]) -> list[SessionStorage]:
        """Every storage root in `workspaces` whose name is not in `keep`.

        For a gateway that adopted its predecessor's sessions: the disks of its warm
        and stateless kernels, and of sessions that could not be adopted.
        """

        def names() -> set[str]:
            return {p.name.removesuffix(".img") for p in self.workspaces.iterdir()}

        return [
            SessionStorage(self.workspaces / n)
            for n in sorted(await asyncio.to_thread(names) - keep)
        ]

    async def remove_storages(self, storages: list[SessionStorage]) -> None:
        await asyncio.gather(*(self.remove_storage(s) for s in storages))

    def connect(self, process: KernelProcess) -> Kernel:
        """A connection to a kernel that already runs (one a predecessor left)."""
        return Kernel(process, self._context)

    def lease(self, kernel: Kernel, storage: SessionStorage) -> WarmKernel:
        """A kernel adopted from a predecessor, on its storage, held as this pool's."""
        return WarmKernel(kernel, storage, self)

    async def acquire(self) -> WarmKernel:
        """A ready kernel: a warm one at once, else the next one to finish starting."""
        ready = self._refill.ready
        while ready:
            warm = ready.popleft()
            if not warm.kernel.exited.done():
                self._refill.fill()
                return warm
            self._refill.tasks.spawn(self.discard(warm))
        return await self._refill.wait(self.settings.kernel_start_timeout)

    async def launch_on(self, storage: SessionStorage) -> SharedKernel:
        """A fresh kernel of this pool's language on `storage`, which another lease holds."""
        return SharedKernel(await self.launch(storage), storage, self)

    async def launch(self, storage: SessionStorage) -> Kernel:
        """Start a kernel on `storage`, wait until it answers, and preload modules.

        Raises only KernelUnavailable (the backend maps its own failures; anything
        else that goes wrong while connecting is mapped here), so whoever replaces
        kernels handles exactly one exception.
        """
        began = time.monotonic()
        try:
            kernel = await self._launch(storage)
        except KernelUnavailable:
            self.metrics.kernel_start_failed()
            raise
        self.metrics.kernel_started(time.monotonic() - began)
        return kernel

    async def _launch(self, storage: SessionStorage) -> Kernel:
        process = await self.backend.launch(storage, self.language)
        try:
            kernel = Kernel(process, self._context)
        except BaseException as exc:
            await process.cleanup()
            _raise_unavailable(exc)
            raise
        try:
            await kernel.wait_ready(self.settings.kernel_start_timeout)
            if self.language.start_cmd or self.language.ready_cmd:
                await run_start_commands(
                    process,
                    self.language.start_cmd,
                    self.language.ready_cmd,
                    self.settings.kernel_start_timeout,
                )
            if self._preload_code and not await kernel.run_silent(
                self._preload_code, self.settings.kernel_start_timeout
            ):
                logger.warning(
                    "preloading %s failed in kernel %s", self.settings.preload, kernel.id
                )
        except BaseException as exc:
            await kernel.close()
            _raise_unavailable(exc)
            raise
        self.kernels_started += 1
        return kernel

    async def acquire_mounting(self, mounts: tuple[VolumeMount, ...]) -> WarmKernel:
        """A kernel started for one session on new storage whose kernels mount `mounts`
        (volumes): warm kernels mount none, and a container's mounts are fixed at its start."""
        return await self._new_kernel(mounts)

    async def _new_kernel(self, mounts: tuple[VolumeMount, ...] = ()) -> WarmKernel:
        storage: SessionStorage | None = None
        try:
            root = self._runtime.new_workspace()
            storage = SessionStorage(root)
            storage = dataclasses.replace(await self.backend.prepare_storage(root), mounts=mounts)
            if self.language.seed is not None:
                await self._seed(storage, self.language.seed)
            kernel = await self.launch(storage)
        except BaseException:
            if storage is not None:
                await asyncio.shield(self.remove_storage(storage))
            raise
        return WarmKernel(kernel, storage, self)

    async def _start_one(self) -> WarmKernel | None:
        warm = await self._new_kernel()
        if self._refill.closed:
            await self.discard(warm)
            return None
        return warm

    async def _seed(self, storage: SessionStorage, seed: Path) -> None:
        """A template's files, into a new session's working directory."""
        try:
            await asyncio.to_thread(unpack_seed, seed, storage.files, self.backend.workspace_owner)
        except (OSError, tarfile.TarError) as exc:
            raise KernelUnavailable(
                f"could not put the template's files in the session's folder: {exc}"
            ) from exc

    def _watch_ready(self, warm: WarmKernel) -> None:
        warm.kernel.exited.add_done_callback(lambda _: self._on_warm_exit(warm))

    def _on_warm_exit(self, warm: WarmKernel) -> None:
        if warm in self._refill.ready:
            self._refill.ready.remove(warm)
            logger.warning("a warm kernel died before use; replacing it")
            exit_info = warm.kernel.exit_info
            self.metrics.kernel_died(exit_info.reason if exit_info else "killed")
            self._refill.tasks.spawn(self.discard(warm))
            self._refill.fill()

    async def discard(self, warm: WarmKernel) -> None:
        try:
            await warm.kernel.close()
        finally:
            await self.remove_storage(warm.storage)


def _still_mounted(root: Path) -> bool:
    return os.path.ismount(root) or bool(mounts_under(root))


def _raise_unavailable(exc: BaseException) -> None:
    """Raise KernelUnavailable for any failure to bring a kernel up; else return."""
    if isinstance(exc, Exception) and not isinstance(exc, KernelUnavailable):
        raise KernelUnavailable(f"the kernel did not start: {exc}", retry_after=5) from exc


def preload_code(modules: list[str]) -> str:
    """Import `modules` (and warm matplotlib's renderer) without leaving a name behind.

    A first chart otherwise pays for importing pyplot, loading fonts and a first
    render: half a second or more. Everything happens inside a function that is
    deleted at once, so the user's namespace stays exactly as a fresh kernel's.
    """
    if not modules:
        return ""
    lines = [
        "def __kg_preload():",
        "    import importlib",
        f"    for name in {modules!r}:",
        "        try:",
        "            importlib.import_module(name)",
        "        except Exception:",
        "            pass",
    ]
    if "matplotlib" in modules:
        lines += [
            "    import io",
            "    import matplotlib.pyplot as plt",
            "    fig = plt.figure()",
            "    plt.plot([0, 1])",
            "    fig.savefig(io.BytesIO(), format='png', bbox_inches='tight')",
            "    plt.close(fig)",
        ]
    if "pandas" in modules:  # a first table shown imports pandas' formatters (about 3 ms)
        lines += [
            "    try:",
            "        import pandas",
            "        frame = pandas.DataFrame({'a': [1.5, 2]})",
            "        frame._repr_html_()",
            "        frame.describe().to_string()",
            "    except Exception:",
            "        pass",
        ]
    lines += ["try:", "    __kg_preload()", "finally:", "    del __kg_preload"]
    return "\n".join(lines)
