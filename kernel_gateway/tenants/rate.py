"""Requests a minute per API key: a token bucket each, refilled continuously.

A key with `requests_per_minute = n` may send a burst of `n` requests, then one every
60/n seconds; past that, `RateLimited` with the seconds until its next request. Keys with
no such quota, and the admin, are not counted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from kernel_gateway.errors import RateLimited
from kernel_gateway.tenants.principal import Principal


class RateLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        """Key id → (tokens left, when counted)."""

    def take(self, principal: Principal) -> None:
        """Count one request of `principal`, or raise `RateLimited` when it has none left."""
        per_minute = principal.quotas.requests_per_minute
        if principal.key_id is None or per_minute is None:
            return
        now = self._clock()
        tokens, then = self._buckets.get(principal.key_id, (float(per_minute), now))
        tokens = min(float(per_minute), tokens + (now - then) * per_minute / 60)
        if tokens < 1:
            self._buckets[principal.key_id] = (tokens, now)
            wait = math.ceil((1 - tokens) * 60 / per_minute)
            raise RateLimited(
                f"key {principal.name!r} may send {per_minute} requests a minute; "
                f"retry in {wait} s",
                retry_after=wait,
            )
        self._buckets[principal.key_id] = (tokens - 1, now)

    def forget(self, key_id: str) -> None:
        self._buckets.pop(key_id, None)
