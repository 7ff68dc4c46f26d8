"""Templates' warm pools sized by demand (sessions/template_pools.py), on fake kernels: as
many warm as were asked for in the last minute, within --pool-size for all templates,
none once unused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
import zmq.asyncio

from kernel_gateway.kernels.images import ImageBuilder
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.sessions.template_pools import DEMAND_WINDOW, TemplatePools, share
from kernel_gateway.settings import Settings
from kernel_gateway.templates.model import BuildState
from kernel_gateway.templates.service import Templates
from kernel_gateway.tenants.principal import ADMIN
from tests.support.fake_kernel import FakeBackend, until

IDLE = 600.0


def test_share_gives_each_pool_one_before_any_gets_a_second() -> None:
    assert share({"a": 5, "b": 1, "c": 2}, 3) == {"a": 1, "b": 1, "c": 1}
    assert share({"a": 5, "b": 1, "c": 2}, 5) == {"a": 2, "b": 1, "c": 2}
    assert share({"a": 5, "b": 1}, 10) == {"a": 5, "b": 1}
    # More pools than kernels: those that want most first, then in order.
    assert share({"a": 1, "b": 3, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}
    assert share({"a": 0, "b": 2}, 2) == {"a": 0, "b": 2}
    assert share({"a": 4}, 0) == {"a": 0}
    assert share({}, 3) == {}


class TemplateBackend(FakeBackend):
    """Fake kernels, and templates whose builds are made ready by the test (no image)."""

    @property
    def images(self) -> ImageBuilder | None:
        return cast(ImageBuilder, object())


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Fixture:
    pools: TemplatePools
    templates: Templates
    clock: Clock

    def make(self, name: str) -> None:
        """A template `name` with a ready build."""
        template = self.templates.create(name, exist_ok=False, owner=ADMIN)
        build = self.templates.new_build(template)
        build.state, build.image, build.language = BuildState.READY, f"img-{name}", "python"
        template.assign(["default"], build.id)

    def ask(self, name: str, times: int = 1) -> WarmPool:
        """A session on `name`, `times` over: the pool its kernels come from."""
        for _ in range(times):
            pool, _ = self.pools.for_reference(name, None, ADMIN)
        return pool


@pytest.fixture
async def fx(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Fixture]:
    settings = Settings(
        backend="docker",  # only named: the backend is the fake one
        pool_size=getattr(request, "param", 3),
        preload="",
        runtime_dir=tmp_path,
        template_pool_idle=IDLE,
    )
    runtime = RuntimeDir(tmp_path)
    runtime.open()
    backend = TemplateBackend()
    context = zmq.asyncio.Context()
    templates = Templates(settings, backend, runtime, context)
    templates.open()
    clock = Clock()
    default = WarmPool(settings, backend, runtime, context)
    pools = TemplatePools(templates, default, settings, list, clock=clock)
    try:
        yield Fixture(pools, templates, clock)
    finally:
        await pools.close()
        await templates.close()
        await backend.close()
        context.destroy(linger=0)
        runtime.close()


async def test_a_templates_pool_follows_its_demand_and_shrinks_to_none(fx: Fixture) -> None:
    fx.make("a")
    fx.make("b")
    a = fx.ask("a")
    assert a.size == 1  # used once: one warm for the next
    await until(lambda: a.ready == 1)
    fx.clock.now += 5
    a = fx.ask("a", 4)
    assert a.size == 3  # five asked for in the last minute: all of --pool-size (3)
    await until(lambda: a.ready == 3)
    # Another template in use takes its share of the three at once.
    b = fx.ask("b")
    assert (a.size, b.size) == (2, 1)
    await until(lambda: (a.ready, b.ready) == (2, 1))
    assert sum(p.ready for p in (a, b)) <= 3
    # A minute on, nobody asked: each keeps one while in use.
    fx.clock.now += DEMAND_WINDOW
    fx.pools.rebalance()
    assert (a.size, b.size) == (1, 1)
    await until(lambda: (a.ready, b.ready) == (1, 1))
    # `b` is used again, `a` not: past --template-pool-idle, `a` keeps none.
    fx.clock.now += IDLE - DEMAND_WINDOW - 1
    fx.ask("b", 2)
    fx.clock.now += 1
    fx.pools.rebalance()
    assert (a.size, b.size) == (0, 2)
    await until(lambda: (a.ready, b.ready) == (0, 2))
    fx.clock.now += IDLE
    fx.pools.rebalance()
    assert (a.size, b.size) == (0, 0)
    await until(lambda: (a.ready, b.ready) == (0, 0))


@pytest.mark.parametrize("fx", [0], indirect=True)  # --pool-size 0
async def test_no_template_keeps_a_kernel_warm_with_a_pool_size_of_zero(fx: Fixture) -> None:
    fx.make("a")
    a = fx.ask("a", 3)
    build = fx.templates.resolve("a", ADMIN)[1]
    assert a.size == 0 and fx.pools.targets() == {build.id: 0}
    assert fx.pools.wanted(build.id) == 3  # wanted, but none is kept
