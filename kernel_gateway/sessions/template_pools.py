"""Kernels of templates: a warm pool per template build in use, made on first use.

A template's build is a language on another image (`Templates.language_of`), so its
kernels come from a `WarmPool` like any language's: started on demand, and one kept warm
once the template is used, while the templates' warm kernels together stay within
`--pool-size` (the default image's pool is sized apart). Sessions name a template by
reference (`analytics`, `analytics:v2`, an id); their records keep the build
(`template_id/build_id`), so a restarted gateway relaunches their kernels from the
same image.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kernel_gateway.errors import TemplateConflict, TemplateNotFound
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.sessions.persistence import SessionRecord
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.tasks import TaskSet
from kernel_gateway.templates.model import Build, Template, TemplateRef
from kernel_gateway.templates.service import Templates
from kernel_gateway.tenants.principal import ADMIN, Principal

logger = logging.getLogger(__name__)


class TemplatePools:
    def __init__(
        self,
        templates: Templates | None,
        warm: WarmPool,
        settings: Settings,
        sessions: Callable[[], list[Session]],
    ) -> None:
        self.templates = templates
        self._warm = warm
        self._settings = settings
        self._sessions = sessions
        self._pools: dict[str, WarmPool] = {}
        """By build id."""
        self._used: dict[str, float] = {}
        """When each build's pool was last asked for a kernel (monotonic)."""
        self._tasks = TaskSet()
        if templates is not None:
            templates.in_use = self.sessions_on
            templates.warm = self.warm_kernels
            templates.before_delete = self._forget

    def for_reference(
        self, reference: str, language: str | None, viewer: Principal
    ) -> tuple[WarmPool, TemplateRef]:
        """The pool of the build `reference` means (among the templates `viewer` may use),
        or the error for a template that is unknown, not ready, or of another language
        than `language`."""
        if self.templates is None:
            raise TemplateNotFound(
                f"no template {reference!r}: this gateway's {self._warm.backend.name} backend "
                "runs no templates (they need the docker backend)"
            )
        template, build = self.templates.resolve(reference, viewer)
        pool = self._pool(build)
        if language is not None:
            wanted = self._warm.backend.languages.get_or_raise(language).name
            if wanted != pool.language.name:
                raise TemplateConflict(
                    f"template {template.name!r} runs {pool.language.name}, not {wanted}"
                )
        self._used[build.id] = time.monotonic()
        self._keep_warm(pool)
        template.spawn_count += 1
        template.last_spawned_at = time.time()
        self.templates.save_later(template)
        return pool, TemplateRef.of(template, build)

    def recorded(self, record: SessionRecord) -> tuple[WarmPool | None, TemplateRef | None]:
        """The pool and template a recorded session ran on (None: its language's own)."""
        if record.template is None or self.templates is None:
            return None, None
        template_id, _, build_id = record.template.partition("/")
        template = self.templates.find(template_id, ADMIN)  # by id, as it was recorded
        build = template.build(build_id) if template is not None else None
        if template is None or build is None or build.image is None:
            logger.warning(
                "session %s ran on template build %s, which is gone: a kernel that dies is "
                "replaced from its language's image",
                record.id,
                record.template,
            )
            return None, None
        return self._pool(build), TemplateRef.of(template, build)

    def for_session(self, owner: Session, language: str | None) -> WarmPool | None:
        """The pool of `owner`'s template for another kernel of its (E2B's contexts), when
        it runs on one and `language` is its template's (or None); else None."""
        if owner.template is None or self.templates is None:
            return None
        template = self.templates.find(owner.template.id, ADMIN)  # the one it runs
        build = template.build(owner.template.build_id) if template is not None else None
        if build is None or build.image is None:
            return None
        pool = self._pool(build)
        if language is not None:
            wanted = self._warm.backend.languages.get_or_raise(language).name
            if wanted != pool.language.name:
                return None
        return pool

    def warm_kernels(self, template: Template) -> int:
        return sum(
            pool.ready for b in template.builds if (pool := self._pools.get(b.id)) is not None
        )

    def sessions_on(self, template: Template) -> int:
        return sum(
            1 for s in self._sessions() if s.template is not None and s.template.id == template.id
        )

    def _pool(self, build: Build) -> WarmPool:
        assert self.templates is not None
        pool = self._pools.get(build.id)
        if pool is None:
            pool = self._warm.sibling(self.templates.language_of(build))
            self._pools[build.id] = pool
            pool.start()
        return pool

    def _keep_warm(self, pool: WarmPool) -> None:
        warm = sum(p.size for p in self._pools.values())
        if pool.size == 0 and warm < self._settings.pool_size:
            pool.size = 1
            pool.start()
        if not self._tasks:
            self._tasks.spawn(self._cool_down(), name="template pools")

    async def _cool_down(self) -> None:
        """Stop the warm kernel of each template unused for --template-pool-idle."""
        idle = self._settings.template_pool_idle
        while any(_holds(p) for p in self._pools.values()):
            await asyncio.sleep(min(idle / 4, 30.0))
            now = time.monotonic()
            for build_id, pool in list(self._pools.items()):
                if not _holds(pool) or now - self._used.get(build_id, now) < idle:
                    continue
                if pool.size:
                    logger.info(
                        "template build %s unused for %.0f s: no warm kernel", build_id, idle
                    )
                if pool.size or pool.ready:  # a kernel that was starting at the resize too
                    await pool.resize(0)

    async def _forget(self, template: Template) -> None:
        """A template is deleted: its builds' pools go (no session runs on it)."""
        for build in template.builds:
            pool = self._pools.pop(build.id, None)
            self._used.pop(build.id, None)
            if pool is not None:
                await pool.close()

    async def close(self) -> None:
        self._tasks.cancel()
        for pool in self._pools.values():
            await pool.close()
        self._pools.clear()


def _holds(pool: WarmPool) -> bool:
    """Whether `pool` keeps, or is starting, a kernel (one started before it was resized to
    none arrives after: the next round removes it)."""
    return bool(pool.size or pool.ready or pool.stats()["starting"])
