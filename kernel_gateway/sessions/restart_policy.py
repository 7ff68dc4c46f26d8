"""When a session's kernel keeps dying: back off between restarts, then give up.

Like jupyter_client's `KernelRestarter` (`restart_limit`), kept apart from the
code that starts kernels. Pure: it only counts and answers, so it is tested
without kernels. `clock` is injectable for the same reason.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RestartPolicy:
    def __init__(
        self, budget: int, window: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.budget = budget
        """Deaths allowed within `window` seconds; one more fails the session."""
        self.window = window
        self._clock = clock
        self._deaths: deque[float] = deque()
        self.failed: str | None = None
        """Why the session gave up on its kernel, or None."""

    def record_death(self, session_id: str) -> bool:
        """Count an unexpected death; False once the budget is spent (the session fails)."""
        now = self._clock()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > self.window:
            self._deaths.popleft()
        if len(self._deaths) > self.budget:
            self.failed = (
                f"the kernel of session {session_id} died {len(self._deaths)} times within "
                f"{self.window:g} s, so it is not restarted again; "
                "delete this session and start a new one, or restart it explicitly"
            )
            return False
        return True

    def backoff(self) -> float:
        """Seconds to wait before the next restart: 0, 0.5, 1, 2, 4, 8 for repeated deaths."""
        recent = len(self._deaths)
        return 0.0 if recent <= 1 else min(8.0, 0.5 * 2 ** (recent - 2))

    def reset(self) -> None:
        """An explicit restart is a fresh start: the budget is whole again."""
        self._deaths.clear()
        self.failed = None
