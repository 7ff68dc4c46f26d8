"""Kernels of templates: a warm pool per template build in use, sized by its demand.

A template's build is a language on another image (`Templates.language_of`), so its
kernels come from a `WarmPool` like any language's, made on first use. Each pool keeps as
many kernels warm as its build was asked for in the last `DEMAND_WINDOW` (at least one
while it is in use; none once unused for `--template-pool-idle`), and the templates' warm
kernels together stay within `--pool-size` (`share`: each pool in use gets one before any
gets another; the default image's pool is sized apart). Sessions name a template by
reference (`analytics`, `analytics:v2`, an id); their records keep the build
(`template_id/build_id`), so a restarted gateway relaunches their kernels from the
same image.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

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

DEMAND_WINDOW = 60.0
"""Seconds of asks that size a template's warm pool: one warm kernel for each kernel its
build was asked for in that time."""


class TemplatePools:
    def __init__(
        self,
        templates: Templates | None,
        warm: WarmPool,
        settings: Settings,
        sessions: Callable[[], list[Session]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.templates = templates
        self._warm = warm
        self._settings = settings
        self._sessions = sessions
        self._clock = clock
        self._pools: dict[str, WarmPool] = {}
        """By build id."""
        self._asked: dict[str, deque[float]] = {}
        """When each build's pool was asked for a kernel (`clock`), the last first among
        those of the last `DEMAND_WINDOW` (the newest is kept past it)."""
        self._tasks = TaskSet()
        self._resizes = TaskSet()
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
        self._asked.setdefault(build.id, deque()).append(self._clock())
        self.rebalance()
        if not self._tasks:
            self._tasks.spawn(self._cool_down(), name="template pools")
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

    def wanted(self, build_id: str) -> int:
        """The warm kernels `build_id`'s pool wants: one for each kernel asked for in the
        last `DEMAND_WINDOW`, at least one while used within `--template-pool-idle`, none
        after that."""
        asked = self._asked.get(build_id)
        if not asked:
            return 0
        now = self._clock()
        while len(asked) > 1 and now - asked[0] >= DEMAND_WINDOW:
            asked.popleft()
        if now - asked[-1] >= self._settings.template_pool_idle:
            return 0
        return max(1, sum(1 for t in asked if now - t < DEMAND_WINDOW))

    def targets(self) -> dict[str, int]:
        """Each build's warm kernels from now on: what it wants, within `--pool-size` for
        all of them."""
        return share({b: self.wanted(b) for b in self._pools}, self._settings.pool_size)

    def rebalance(self) -> None:
        """Size each pool to its target: one that grows starts kernels now; one that
        shrinks stops its extra warm kernels in the background."""
        for build_id, target in self.targets().items():
            pool = self._pools[build_id]
            if target > pool.size:
                pool.size = target
                pool.start()
            elif target < pool.size or pool.ready > target:
                if target == 0 and pool.size:
                    logger.info("template build %s unused: no warm kernel", build_id)
                pool.size = target  # no kernel is started past it from now on
                self._resizes.spawn(pool.resize(target), name=f"template pool {build_id}")

    async def _cool_down(self) -> None:
        """Follow each pool's demand as it fades, until none keeps or wants a kernel."""
        tick = min(self._settings.template_pool_idle, DEMAND_WINDOW) / 4
        while any(_holds(p) or self.wanted(b) for b, p in self._pools.items()):
            await asyncio.sleep(min(tick, 30.0))
            self.rebalance()

    async def _forget(self, template: Template) -> None:
        """A template is deleted: its builds' pools go (no session runs on it)."""
        for build in template.builds:
            pool = self._pools.pop(build.id, None)
            self._asked.pop(build.id, None)
            if pool is not None:
                await pool.close()
        self.rebalance()  # what its pools held may go to others

    async def close(self) -> None:
        self._tasks.cancel()
        self._resizes.cancel()
        for pool in self._pools.values():
            await pool.close()
        self._pools.clear()


def _holds(pool: WarmPool) -> bool:
    """Whether `pool` keeps, or is starting, a kernel (one started before it was resized to
    none arrives after: the next round removes it)."""
    return bool(pool.size or pool.ready or pool.stats()["starting"])


def share(wants: Mapping[str, int], budget: int) -> dict[str, int]:
    """`budget` warm kernels shared among pools wanting `wants` (by key): one at a time to
    each pool that wants more, those that want most first (then in `wants`' order), so
    every pool in use gets one before any gets a second."""
    given = dict.fromkeys(wants, 0)
    order = sorted(wants, key=lambda key: -wants[key])
    while budget > 0:
        takers = [key for key in order if given[key] < wants[key]]
        if not takers:
            break
        for key in takers[:budget]:
            given[key] += 1
        budget -= min(budget, len(takers))
    return given
