"""The gateway's templates: made, built, found, followed and removed here.

    Templates
    ├── store      one record per template (`<runtime-dir>/templates/records/`)
    ├── files      the COPY steps' uploads (`files.py`)
    ├── logs       each build's log, in memory while it runs, on disk after
    └── builds     one task per running build (`build.py`), on the backend's images

Records and uploads live in the runtime folder's root, not an instance's, so they
survive restarts; a build that was running when its gateway stopped is marked failed
when the next one starts (its half-made images carry no name and are not used).
A template's kernels run its ready build's image, as a `Language` whose image is that
(`language_of`): the session layer starts them like any other language's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq.asyncio

from kernel_gateway.errors import (
    BackendUnavailable,
    Forbidden,
    GatewayError,
    InvalidRequest,
    KernelUnavailable,
    TemplateConflict,
    TemplateNotFound,
    TooManyTemplates,
)
from kernel_gateway.kernels.backends.base import Backend
from kernel_gateway.kernels.images import ImageBuilder, ImageInfo, StepFailed
from kernel_gateway.kernels.languages import PYTHON, Language
from kernel_gateway.kernels.pools.start_commands import run_start_commands
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.kernels.storage import SessionStorage
from kernel_gateway.kernels.wheels import wheel_target
from kernel_gateway.records import RecordStore
from kernel_gateway.settings import Settings
from kernel_gateway.tasks import TaskSet
from kernel_gateway.templates.build import (
    LABEL_TEMPLATE,
    BuildFailed,
    PipThroughHost,
    Plan,
    run_build,
)
from kernel_gateway.templates.build_logs import BuildLogs, Level, LogEntry
from kernel_gateway.templates.build_network import build_egress
from kernel_gateway.templates.builtin import PYTHON311_BASES, python311
from kernel_gateway.templates.files import FileStore
from kernel_gateway.templates.image_ops import remove_image, version_in
from kernel_gateway.templates.model import (
    DEFAULT_TAG,
    Build,
    BuildSpec,
    BuildState,
    Template,
    check_build_id,
    check_name,
    check_tag,
    check_template_id,
    split_reference,
)
from kernel_gateway.templates.sweep import sweep
from kernel_gateway.tenants.principal import ADMIN, Principal, acting_for

if TYPE_CHECKING:  # the proxy's module loads the Docker SDK
    from kernel_gateway.kernels.egress.proxy import EgressProxy

logger = logging.getLogger(__name__)

REPOSITORY = "kernel-gateway-template"
PYTHON_BASES = frozenset(
    {"python", "base", "e2bdev/base", "e2bdev/code-interpreter", "code-interpreter-v1",
     "code-interpreter"}
)  # fmt: skip
"""Names that mean the gateway's Python image (E2B's `from_base_image()` is
`e2bdev/base`; its `base` and `code-interpreter-v1` templates)."""
SAVE_DELAY = 5.0
"""Seconds a template's use counts may wait before they are written."""


class Templates:
    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        runtime: RuntimeDir,
        context: zmq.asyncio.Context,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self._runtime = runtime
        self._context = context
        root = runtime.root / "templates"
        self.files = FileStore(root / "files", settings.template_upload_max_bytes)
        self._logs_dir = root / "logs"
        self._seeds_dir = root / "seeds"
        self._store: RecordStore[Template] = RecordStore(root / "records", Template.from_json)
        self._root = root
        self._by_id: dict[str, Template] = {}
        self.build_logs = BuildLogs(self._logs_dir)
        self._tasks = TaskSet()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._unsaved: set[str] = set()
        self.in_use: Callable[[Template], int] = lambda template: 0
        """How many sessions run on `template`: set by the session registry."""
        self.warm: Callable[[Template], int] = lambda template: 0
        """How many of `template`'s kernels are warm (ready for a session): the registry's."""
        self.before_delete: Callable[[Template], Awaitable[None]] = _nothing
        """Stops what runs from `template`'s images (its warm kernels): set by the registry."""
        self.egress: EgressProxy | None = None
        """The gateway's egress proxy, if it runs: builds reach `--build-egress-allow`
        through it (build_network.py)."""

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def images(self) -> ImageBuilder | None:
        return self.backend.images

    def open(self) -> None:
        """Load the templates an earlier gateway kept (none: the folder is made only once
        there is something to keep)."""
        if not self._root.exists():
            return
        self._make_folders()
        self.files.open()  # uploads a stopped gateway cut short: removed
        for template in self._store.load():
            for build in template.builds:
                if not build.state.finished:
                    build.state = BuildState.ERROR
                    build.reason = "the gateway stopped while this build ran"
                    build.finished_at = time.time()
                    self._store.save(template)
            self._by_id[template.id] = template

    async def sweep(self) -> int:
        """Remove template images no record names (see `sweep.py`): at startup, before
        any build."""
        images = self.images
        if images is None:
            return 0
        named = {b.image for t in self._by_id.values() for b in t.builds if b.image}
        return await sweep(images, self._runtime, named)

    def _make_folders(self) -> None:
        self._root.mkdir(mode=0o700, exist_ok=True)
        self._logs_dir.mkdir(mode=0o700, exist_ok=True)
        self._seeds_dir.mkdir(mode=0o700, exist_ok=True)
        self._store.open()

    async def close(self) -> None:
        for template_id in list(self._unsaved):
            if (template := self._by_id.get(template_id)) is not None:
                self._save_now(template)
        self._tasks.cancel()
        for task in list(self._running.values()):
            with contextlib.suppress(BaseException):
                await task
        await self._store.close()

    # -- finding ----------------------------------------------------------------------------

    def all(self, viewer: Principal) -> list[Template]:
        """The templates `viewer` may use (its own and the admin's), oldest first."""
        found = [t for t in self._by_id.values() if t.usable_by(viewer)]
        return sorted(found, key=lambda t: t.created_at)

    def find(self, name_or_id: str, viewer: Principal) -> Template | None:
        """By id, else by name: `viewer`'s own first, then the admin's (names are each
        owner's own)."""
        found = self._by_id.get(name_or_id)
        if found is not None and found.usable_by(viewer):
            return found
        named = [t for t in self._by_id.values() if t.name == name_or_id and t.usable_by(viewer)]
        return min(named, key=lambda t: (t.owner != viewer.owner, t.created_at), default=None)

    def get(self, name_or_id: str, viewer: Principal) -> Template:
        found = self.find(name_or_id, viewer)
        if found is None:
            raise TemplateNotFound(f"no template {name_or_id!r}")
        return found

    def writable(self, template: Template, viewer: Principal) -> Template:
        """`template`, if `viewer` may build, tag or delete it (its owner or the admin)."""
        if not viewer.sees(template.owner):
            raise Forbidden(
                f"template {template.name!r} is the operator's, shared with every key: only "
                "the admin token may change it"
            )
        return template

    def resolve(self, reference: str, viewer: Principal) -> tuple[Template, Build]:
        """`name`, `name:tag` or a template id → the ready build it means."""
        name, tag = split_reference(reference)
        template = self.get(name, viewer)
        if tag is None or tag == DEFAULT_TAG and DEFAULT_TAG not in template.tags:
            build = template.ready
        else:
            build_id = template.tags.get(tag)
            if build_id is None:
                raise TemplateNotFound(f"template {name!r} has no tag {tag!r}")
            build = template.build(build_id)
        if build is None or build.state is not BuildState.READY:
            running = template.building
            why = "its first build is still running" if running else "it has no ready build"
            raise TemplateConflict(f"template {reference!r} cannot start kernels: {why}")
        return template, build

    def language_of(self, build: Build) -> Language:
        """The language a build's kernels are: its base's, on its image, at its image's
        version (the gateway's own Python is 3.13; a build on `python3.11` is not)."""
        assert build.image is not None and build.language is not None
        language = self.backend.languages.get_or_raise(build.language)
        seed = self._seed_path(build) if build.seeded else None
        spec = build.spec
        return dataclasses.replace(
            language,
            version=self._version_of(build, language),
            image=build.image,
            seed=seed,
            start_cmd=spec.start_cmd if spec is not None else None,
            ready_cmd=spec.ready_cmd if spec is not None else None,
        )

    def _version_of(self, build: Build, language: Language) -> str:
        """`build.language_version`; for a build recorded without it (an older gateway's),
        its base's where the base is still known, else the language's."""
        if build.language_version is not None:
            return build.language_version
        if build.spec is not None:
            with contextlib.suppress(GatewayError):
                return self._base_language(build.spec.base, ADMIN).version
        return language.version

    def _seed_path(self, build: Build) -> Path:
        return self._seeds_dir / f"{build.id}.tar"

    # -- making and building ----------------------------------------------------------------

    def create(
        self,
        name: str,
        *,
        exist_ok: bool,
        owner: Principal,
        template_id: str | None = None,
    ) -> Template:
        """`owner`'s template called `name` (a new one; with `exist_ok`, the existing one).
        A new one takes the id `template_id` if given (a router gives a template one id on
        every node): an id another template has, as its id or name, is a conflict."""
        check_name(name)
        found = next(
            (t for t in self._by_id.values() if t.name == name and t.owner == owner.owner), None
        )
        if found is not None:
            if exist_ok:
                return found
            raise TemplateConflict(
                f"a template called {name!r} exists; build it again with "
                f"POST /templates/{name}/builds, or delete it first"
            )
        asked = check_template_id(template_id) if template_id is not None else None
        if asked is not None and any(asked in (t.id, t.name) for t in self._by_id.values()):
            raise TemplateConflict(f"another template has the id {template_id!r}")
        if self.images is None:
            raise BackendUnavailable(f"the {self.backend.name} backend cannot build templates")
        if len(self._by_id) >= self.settings.max_templates:
            raise TooManyTemplates(
                f"this gateway keeps at most {self.settings.max_templates} templates "
                "(--max-templates); delete one first"
            )
        self._make_folders()
        template = Template.new(name, template_id, owner.owner)
        self._by_id[template.id] = template
        self._store.save(template)
        return template

    def new_build(
        self,
        template: Template,
        tags: list[str] | None = None,
        *,
        cpu_count: int | None = None,
        memory_mb: int | None = None,
        build_id: str | None = None,
    ) -> Build:
        """A build waiting for its steps (E2B's first call); `tags` are given to it once
        it is ready (none: `default`). Its id is `build_id` if given (a router gives a build
        one id on every node): one any template's build has is a conflict."""
        for tag in tags or []:
            check_tag(tag)
        if build_id is not None and any(
            t.build(check_build_id(build_id)) is not None for t in self._by_id.values()
        ):
            raise TemplateConflict(f"a build with the id {build_id!r} exists")
        running = template.building
        if running is not None and running.state is BuildState.BUILDING:
            raise TemplateConflict(
                f"template {template.name!r} is building already (build {running.id})"
            )
        if running is not None:  # asked for and never started: superseded
            self._fail(template, running, "superseded by a newer build", None)
        build = Build.new(cpu_count=cpu_count, memory_mb=memory_mb, build_id=build_id)
        build.tags_when_ready = list(tags or [DEFAULT_TAG])
        template.builds.append(build)
        template.updated_at = time.time()
        self._store.save(template)
        self.build_logs.start(build.id)
        return build

    def discard(self, template: Template, build: Build) -> None:
        """Forget a build that never started (its request was refused)."""
        if build.state is BuildState.WAITING and build in template.builds:
            template.builds.remove(build)
            self.build_logs.forget(build.id)
            self._store.save(template)

    def start(self, template: Template, build: Build, spec: BuildSpec) -> None:
        """Run `build` of `spec` in the background (logs and state as it goes)."""
        if build.state is not BuildState.WAITING:
            raise TemplateConflict(f"build {build.id} was started already ({build.state})")
        owner = acting_for(template.owner)  # a base template is one its owner may use
        self._resolve_base(spec.base, owner)  # an unknown base is the request's error, now
        base_language = self._base_language(spec.base, owner)
        build.language = base_language.name
        build.language_version = base_language.version or None  # the image's, once built
        build.spec = spec
        build.state = BuildState.BUILDING
        build.started_at = time.time()
        self._store.save(template)
        task = self._tasks.spawn(self._build(template, build, spec), name=f"build {build.id}")
        self._running[build.id] = task
        task.add_done_callback(lambda _: self._running.pop(build.id, None))

    async def _build(self, template: Template, build: Build, spec: BuildSpec) -> None:
        images = self.images
        assert images is not None
        owner = acting_for(template.owner)
        base, kernel_base = self._resolve_base(spec.base, owner)
        try:
            base_info = await images.inspect(base)
            kernel_info = await images.inspect(kernel_base)
            if base_info is None or kernel_info is None:
                raise BuildFailed(f"the base image {base} is not on this gateway", 0)
            plan = Plan(
                template_id=template.id,
                build_id=build.id,
                base=base_info,
                kernel_base=kernel_base,
                steps=spec.steps,
                time_limit=self.settings.template_build_timeout,
                max_size=self.settings.template_max_size_bytes,
                force=spec.force,
                labels={LABEL_TEMPLATE: template.id},
                pip=self._pip_through_host(base_info, self._base_language(spec.base, owner)),
            )
            log = self.build_logs.logger(build.id)
            async with contextlib.AsyncExitStack() as network:
                if self.egress is not None and self.settings.build_egress_list:
                    plan.egress = await network.enter_async_context(
                        build_egress(
                            self.egress,
                            self.settings.build_egress_list,
                            build.id,
                            self._runtime.new_kernel_dir()[1],
                            lambda line: log("warn", line, None),
                        )
                    )
                final = await run_build(plan, images, self.files, log, self._checker(spec, owner))
            assert build.language is not None
            version = await version_in(images, final.id, build.language)
            build.language_version = version or build.language_version
            ref = f"{REPOSITORY}:{template.id}-{build.id[:8]}"
            try:
                build.seeded = await self._keep_seed(images, final.id, build)
                await images.tag(final.id, ref)
            except BaseException:
                await asyncio.shield(images.remove(final.id))
                raise
        except BuildFailed as exc:
            self._fail(template, build, exc.message, exc.step)
            return
        except StepFailed as exc:
            self._fail(template, build, exc.message, None)
            return
        except asyncio.CancelledError:
            self._fail(template, build, "the build was cancelled", None)
            raise
        except Exception as exc:
            logger.exception("template build %s failed", build.id)
            self._fail(template, build, f"internal error: {exc}", None)
            return
        build.image = ref
        build.size = final.size
        build.state = BuildState.READY
        build.finished_at = time.time()
        template.assign(build.tags_when_ready, build.id)
        self._log(build, "info", f"Build finished: {ref} ({final.size / 2**20:.0f} MiB)", None)
        self._store.save(template)
        await self.build_logs.persist(build.id)

    async def _keep_seed(self, images: ImageBuilder, image: str, build: Build) -> bool:
        """Keep the image's working directory (what COPY and RUN put in /home/user) for new
        sessions, which get a folder of their own there: True if it holds any file."""
        seed = self._seed_path(build)
        limit = self.settings.workspace_size_bytes
        kernel = await images.inspect(image)
        folder = kernel.workdir if kernel is not None else "/home/user"
        count = await images.archive(image, folder, seed, limit)
        if count <= 1:  # nothing, or the folder alone
            seed.unlink(missing_ok=True)
            return False
        self._log(build, "info", f"{count - 1} files in {folder} kept for new sessions", None)
        return True

    def _pip_through_host(self, base: ImageInfo, language: Language) -> PipThroughHost | None:
        """How `pip install` steps get wheels (for the Python of a base of `language`):
        through the host (the default), or None."""
        if self.settings.template_pip != "host":
            return None
        if language.name != PYTHON:  # the other languages' images are built FROM Python's
            language = self.backend.languages[PYTHON]
        python = ".".join(language.version.split(".")[:2]) or "3"
        try:
            target = wheel_target(base.arch, python)
        except ValueError:
            return None

        def folder() -> Path:
            return self._runtime.new_kernel_dir()[1]

        return PipThroughHost(target, folder)

    def _fail(self, template: Template, build: Build, message: str, step: int | None) -> None:
        build.state = BuildState.ERROR
        build.reason = message
        build.failed_step = step
        build.finished_at = time.time()
        self._log(build, "error", f"Build failed: {message}", step)
        self._store.save(template)
        self._tasks.spawn(self.build_logs.persist(build.id))

    def _checker(
        self, spec: BuildSpec, owner: Principal
    ) -> Callable[[str, Callable[[str], None]], Any]:
        base_language = self._base_language(spec.base, owner)

        async def check(image: str, log: Callable[[str], None]) -> None:
            language = dataclasses.replace(base_language, image=image)  # no commands: below
            pool = WarmPool(
                self.settings, self.backend, self._runtime, self._context, language=language
            )
            pool.size = 0
            root = self._runtime.new_workspace()
            storage = SessionStorage(root)
            try:
                storage = await self.backend.prepare_storage(root)
                kernel = await pool.launch(storage)
                try:
                    log(f"The kernel answered ({language.name})")
                    await run_start_commands(
                        kernel.process,
                        spec.start_cmd,
                        spec.ready_cmd,
                        self.settings.kernel_start_timeout,
                        log,
                    )
                finally:
                    await kernel.close()
            except KernelUnavailable as exc:
                raise StepFailed(exc.message) from exc
            finally:
                await pool.remove_storage(storage)

        return check

    # -- bases ------------------------------------------------------------------------------

    def base_image(self, base: str, viewer: Principal) -> str:
        """The image a build on `base` starts from (InvalidRequest: not a base of ours)."""
        return self._resolve_base(base, viewer)[0]

    def _resolve_base(self, base: str, viewer: Principal) -> tuple[str, str]:
        """(image to build on, image whose kernel files the result keeps); InvalidRequest
        for a base that is not the gateway's."""
        kind, _, name = base.partition(":")
        if kind == "template":
            parent, build = self.resolve(name, viewer)
            assert build.image is not None and build.spec is not None
            return build.image, self._resolve_base(build.spec.base, ADMIN)[1]
        language = self._base_language(base, viewer)
        image = language.image or self.settings.image
        return image, image

    def _base_language(self, base: str, viewer: Principal) -> Language:
        kind, _, name = base.partition(":")
        if kind == "template":
            _, build = self.resolve(name, viewer)
            assert build.spec is not None
            return self._base_language(build.spec.base, ADMIN)
        image = name.removesuffix(":latest")
        languages = self.backend.languages
        if image in PYTHON_BASES:
            return languages[PYTHON]
        if image in PYTHON311_BASES:  # the built-in kernel on the 3.11 image (builtin.py)
            return python311(languages[PYTHON], self.settings.image)
        if image in languages:
            return languages[image]
        raise InvalidRequest(
            f"base image {name!r} is not one of this gateway's: templates build FROM "
            "`python` (E2B's `e2bdev/base`), `python3.11`, a language ("
            + ", ".join(sorted(languages))
            + ") or another template; a public registry image cannot be used"
        )

    # -- removing ---------------------------------------------------------------------------

    async def delete(self, template: Template) -> None:
        running = template.building
        if running is not None and running.state is BuildState.BUILDING:
            raise TemplateConflict(
                f"template {template.name!r} is building (build {running.id}); delete it once "
                "the build ends"
            )
        sessions = self.in_use(template)
        if sessions:
            raise TemplateConflict(
                f"template {template.name!r} is in use by {sessions} session(s); delete them first"
            )
        await self.before_delete(template)
        self._by_id.pop(template.id, None)
        self._store.delete(template.id)
        images = self.images
        for build in template.builds:
            if build.image and images is not None:
                await remove_image(images, build.image)
            self.build_logs.forget(build.id)
            self._seed_path(build).unlink(missing_ok=True)
        if not self._by_id:
            await self._store.flush()
            await asyncio.to_thread(self._remove_folders)

    def _remove_folders(self) -> None:
        """No template left: nothing kept (uploaded files go too, unless one is arriving)."""
        if any(self.files.folder.glob("*.part")):
            return
        shutil.rmtree(self._root, ignore_errors=True)

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` in the background until `close` (the shipped templates' builds)."""
        self._tasks.spawn(work, name=name)

    def save(self, template: Template) -> None:
        self._store.save(template)

    def save_later(self, template: Template) -> None:
        """Save `template` within a few seconds (its use counts: not on every session)."""
        if template.id in self._unsaved:
            return
        self._unsaved.add(template.id)
        asyncio.get_running_loop().call_later(SAVE_DELAY, self._save_now, template)

    def _save_now(self, template: Template) -> None:
        self._unsaved.discard(template.id)
        if self._by_id.get(template.id) is template:
            self._store.save(template)

    # -- logs -------------------------------------------------------------------------------

    def _log(self, build: Build, level: Level, message: str, step: int | None) -> None:
        self.build_logs.add(build.id, level, message, step)

    def logs(self, build: Build, offset: int = 0, limit: int = 100) -> list[LogEntry]:
        return self.build_logs.read(build.id, offset, limit)

    def follow(self, build: Build, offset: int = 0) -> AsyncIterator[LogEntry]:
        """Each log entry from `offset` on, as it comes, until the build finished."""
        return self.build_logs.follow(build.id, lambda: build.state.finished, offset)


async def _nothing(template: Template) -> None:
    pass
