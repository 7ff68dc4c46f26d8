"""Sessions' metrics over fake kernels (a sample at once, one per 5-second bucket, CPU as a
share of the session's CPUs, time bounds), and what E2B's extras compute without a server:
signed file URLs' signatures (checked against E2B's own SDK) and network updates."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kernel_gateway.kernels.backends.base import Usage
from kernel_gateway.protocols.e2b.errors import SandboxError
from kernel_gateway.protocols.e2b.sandbox import Sandbox
from kernel_gateway.protocols.e2b.sandboxes_api import network_update
from kernel_gateway.protocols.e2b.signed_files import signature, signed_sandbox
from kernel_gateway.sessions import usage as usage_module
from kernel_gateway.sessions.usage import UsageSampler
from kernel_gateway.tenants.principal import ADMIN
from tests.support.fake_kernel import FakeKernelProcess, fake_registry


async def test_a_session_is_sampled_at_once_then_once_per_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readings = iter([1.0, 1.5, 2.0, 4.0])  # CPU seconds, one per reading

    async def usage(self: FakeKernelProcess) -> Usage:
        return Usage(next(readings), 100 * 2**20, 512 * 2**20, 7 * 2**20)

    monkeypatch.setattr(FakeKernelProcess, "usage", usage)
    monkeypatch.setattr(usage_module, "FIRST_SPAN", 0.5)
    async with fake_registry(tmp_path, cpu_limit=2.0) as (registry, _):
        session = await registry.create_session(owner=ADMIN)
        sampler = UsageSampler(registry.settings, registry.sessions)
        (first,) = await sampler.samples(session)  # two readings, half a second apart
        assert first.cpu_count == 2
        assert 30 < first.cpu_used_pct <= 50  # 0.5 s of CPU in about 0.5 s, of 2 CPUs
        assert (first.mem_used, first.mem_total, first.mem_cache) == (
            100 * 2**20,
            512 * 2**20,
            7 * 2**20,
        )
        assert 0 < first.disk_used <= first.disk_total
        assert first.at % 5 == 0 and first.at <= time.time()
        monkeypatch.setattr(time, "time", lambda: first.at + 1.0)
        await sampler._sample(session)  # the same bucket: replaced, not added
        (again,) = await sampler.samples(session)
        assert again.at == first.at and again.cpu_used_pct != first.cpu_used_pct
        monkeypatch.setattr(time, "time", lambda: first.at + 5.0)
        await sampler._sample(session)
        both = await sampler.samples(session)
        assert [s.at for s in both] == [first.at, first.at + 5]
        assert await sampler.samples(session, start=first.at + 1) == both[1:]
        assert await sampler.samples(session, end=first.at) == both[:1]
        json = both[1].to_json()
        assert json["timestamp"].endswith("Z") and json["cpu_count"] == 2


async def test_a_backend_that_cannot_tell_gives_no_samples(tmp_path: Path) -> None:
    async with fake_registry(tmp_path) as (registry, _):
        session = await registry.create_session(owner=ADMIN)
        sampler = UsageSampler(registry.settings, registry.sessions)
        assert await sampler.samples(session) == []


def test_signatures_are_e2bs_and_name_their_sandbox() -> None:
    sdk = pytest.importorskip("e2b.sandbox.signature")
    for expiration in (None, 1_900_000_000):
        seconds = None if expiration is None else expiration - int(time.time())
        theirs = sdk.get_signature("a/b.txt", "read", "user", "tok-1", seconds)
        ours = signature("a/b.txt", "read", "user", "tok-1", theirs["expiration"])
        assert ours == theirs["signature"]
    sandboxes = [_sandbox(f"s{i}", f"tok-{i}") for i in range(3)]
    given = signature("x", "write", "", "tok-2", None)
    assert signed_sandbox(sandboxes, "x", "write", "", given, None) is sandboxes[2]
    for path, operation, expiration in (
        ("y", "write", None),
        ("x", "read", None),
        ("x", "write", 5),
    ):
        assert signed_sandbox(sandboxes, path, operation, "", given, expiration) is None


def test_e2b_network_updates_are_the_gateways_policies() -> None:
    assert network_update({"allowOut": ["a.test"]}) == ["a.test"]
    assert network_update({"allowOut": ["a.test"], "denyOut": ["0.0.0.0/0"]}) == ["a.test"]
    assert network_update({"denyOut": ["0.0.0.0/0"]}) == "none"
    assert network_update({"allowOut": []}) == "none"
    assert network_update({}) is None  # cleared: the gateway's default
    assert network_update({"denyOut": ["10.0.0.0/8"]}) is None
    for bad in ({"allowOut": "a.test"}, {"allowOut": [1]}, {"denyOut": "x"}):
        with pytest.raises(SandboxError) as caught:
            network_update(bad)
        assert caught.value.status == 400


def _sandbox(sandbox_id: str, token: str) -> Sandbox:
    from datetime import UTC, datetime

    return Sandbox(sandbox_id, "base", token, datetime.now(UTC), time.time() + 60)
