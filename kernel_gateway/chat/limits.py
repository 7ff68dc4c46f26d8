"""How many model calls each caller may make: `--chat-calls-per-hour`, per API key.

A sliding hour per caller (a key's id, or `admin`), kept in memory: a restart forgets it,
and each gateway of a cluster counts its own calls. Bounded: one timestamp per call
within the hour, at most the limit per caller.
"""

from __future__ import annotations

import time
from collections import deque

HOUR = 3600.0


class CallBudget:
    def __init__(self, per_hour: int) -> None:
        self.per_hour = per_hour
        """0: no limit."""
        self._calls: dict[str, deque[float]] = {}

    def _window(self, caller: str, now: float) -> deque[float]:
        calls = self._calls.setdefault(caller, deque())
        while calls and calls[0] <= now - HOUR:
            calls.popleft()
        if not calls:
            del self._calls[caller]
            calls = self._calls.setdefault(caller, deque())
        return calls

    def wait(self, caller: str) -> float | None:
        """Seconds until `caller` may call again; None when it may now."""
        if not self.per_hour:
            return None
        now = time.monotonic()
        calls = self._window(caller, now)
        if len(calls) < self.per_hour:
            return None
        return max(1.0, calls[0] + HOUR - now)

    def take(self, caller: str) -> float | None:
        """Count one call of `caller`'s, if it may make it now; else the seconds to wait."""
        wait = self.wait(caller)
        if wait is None and self.per_hour:
            self._calls[caller].append(time.monotonic())
        return wait
